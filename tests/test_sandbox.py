"""The local sandbox as a Harbor environment: exec semantics, transfers, Dockerfile builds, snapshot
and fork, sweep after a crashed owner, refusal without root, and `harbor run` acceptance."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from harbor.environments.base import SandboxBuildFailedError
from sandbox_support import HELLO_TASK, REPO, assert_box_cleaned, processes_mentioning, run, run_dirs_of

from reterm.sandbox.base_image import find_base
from reterm.sandbox.box import ExecTimeoutError, SandboxError, live_boxes
from reterm.sandbox.dockerfile import DockerfileError
from reterm.sandbox.local import LocalEnvironment
from reterm.sandbox.paths import sub
from reterm.sandbox.snapshot import Snapshot
from reterm.sandbox.sweep import sweep


def make_task(root: Path, dockerfile: str, files: dict[str, str] | None = None, toml: str = "") -> Path:
    """A minimal Harbor task folder with the given Dockerfile and build-context files."""
    (root / "environment").mkdir(parents=True)
    (root / "tests").mkdir()
    (root / "task.toml").write_text('version = "1.0"\n[environment]\nnetwork_mode = "no-network"\n' + toml)
    (root / "instruction.md").write_text("do it\n")
    (root / "tests" / "test.sh").write_text("echo 1 > /logs/verifier/reward.txt\n")
    (root / "environment" / "Dockerfile").write_text(textwrap.dedent(dockerfile))
    for rel, text in (files or {}).items():
        p = root / "environment" / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    return root


def box_info(env: LocalEnvironment) -> tuple[str, list[Path], Path]:
    box = env.box
    return box.id, list(box.cgroups.dirs.values()) if box.cgroups else [], box.rundir


# ----------------------------------------------------------------------------------- exec
def test_exec_semantics(monkeypatch):
    monkeypatch.setenv("HOST_ONLY_VAR", "leak")

    async def body():
        env = LocalEnvironment.for_task(HELLO_TASK, persistent_env={"TRIAL_VAR": "t"})
        async with env:
            info = box_info(env)
            r = await env.exec("pwd; id -un; echo $HOME $TRIAL_VAR $HOST_ONLY_VAR; hostname; echo err >&2; exit 3")
            assert r.return_code == 3
            assert r.stdout.split("\n")[:4] == ["/app", "root", "/root t", "sandbox"]
            assert r.stderr == "err\n"
            r = await env.exec("pwd; echo $X", cwd="/tmp", env={"X": "1"})
            assert r.stdout == "/tmp\n1\n"
            await env.exec("useradd -m -u 1234 alice")
            r = await env.exec("id -u; echo $HOME; touch /app/mine", user="alice")
            assert r.stdout == "1234\n/home/alice\n" and r.return_code == 1  # /app belongs to root
            r = await env.exec("id -u", user=1234)
            assert r.stdout == "1234\n"
            r = await env.exec("true", user="nobody-here")
            assert r.return_code == 126 and "unable to find user" in r.stderr
            with env.with_default_user("alice"):  # Harbor's agent.user mechanism
                assert (await env.exec("id -un")).stdout == "alice\n"
            r = await env.exec("true", cwd="/does/not/exist")
            assert r.return_code == 126
            # a background server started by one exec is reachable from the next one
            await env.exec("nohup python3 -m http.server 8765 --bind 127.0.0.1 >/tmp/srv.log 2>&1 &")
            r = await env.exec("for i in $(seq 50); do curl -s -o /dev/null -w '%{http_code}' "
                               "http://127.0.0.1:8765/ && break; sleep 0.1; done")  # fmt: skip
            assert r.stdout.endswith("200")  # "000" is printed for each try before the server listens
            # streamed output reaches Harbor's output callbacks
            chunks = []

            async def cb(text, stream):
                chunks.append((stream, text))

            with env.scoped_output_callback(cb):
                await env.exec("echo streamed")
            assert ("stdout", "streamed\n") in chunks
        assert_box_cleaned(*info)

    run(body())


def test_exec_timeout_kills_the_whole_tree():
    async def body():
        async with LocalEnvironment.for_task(HELLO_TASK) as env:
            t0 = time.monotonic()
            with pytest.raises(ExecTimeoutError) as exc:
                await env.exec("echo partial; setsid sleep 777 & sleep 778; wait", timeout_sec=1)
            assert time.monotonic() - t0 < 4
            assert exc.value.stdout == "partial\n" and isinstance(exc.value, RuntimeError)
            r = await env.exec("ps -eo args --no-headers | grep -cE '^sleep 77[78]' || true")
            assert r.stdout.strip() == "0"

    run(body())


def test_exec_after_stop_is_an_infrastructure_error():
    async def body():
        env = LocalEnvironment.for_task(HELLO_TASK)
        await env.start(force_build=False)
        await env.stop(delete=True)
        await env.stop(delete=True)  # idempotent
        with pytest.raises(SandboxError):
            await env.exec("true")

    run(body())


# ------------------------------------------------------------------------------ transfers
def test_upload_and_download_round_trip(tmp_path):
    src = tmp_path / "src"
    (src / "nested" / "deeper").mkdir(parents=True)
    (src / "a.txt").write_text("A")
    (src / "nested" / "deeper" / "b.bin").write_bytes(bytes(range(256)) * 100)
    (src / "link").symlink_to("a.txt")
    script = tmp_path / "run.sh"
    script.write_text("#!/bin/sh\necho ran\n")
    script.chmod(0o755)

    async def body():
        async with LocalEnvironment.for_task(HELLO_TASK) as env:
            await env.upload_dir(src, "/data/in")
            await env.upload_file(script, "/usr/local/bin/run-me")
            await env.exec("mkdir -p /srv")
            await env.upload_file(src / "a.txt", "/srv")  # an existing folder: goes inside it
            r = await env.exec("run-me; cat /srv/a.txt; readlink /data/in/link; stat -c %U /data/in/a.txt")
            assert r.stdout == "ran\nAa.txt\nroot\n"  # a.txt has no newline
            await env.download_dir("/data/in", tmp_path / "back")
            await env.download_file("/data/in/nested/deeper/b.bin", tmp_path / "x" / "y" / "b.bin")
            with pytest.raises(FileNotFoundError):
                await env.download_file("/data/in/nested", tmp_path / "dir-as-file")
            with pytest.raises(FileNotFoundError):
                await env.download_dir("/no/such/dir", tmp_path / "nothing")

    run(body())
    back = tmp_path / "back"
    assert (back / "a.txt").read_text() == "A"
    assert (back / "nested" / "deeper" / "b.bin").read_bytes() == bytes(range(256)) * 100
    assert os.readlink(back / "link") == "a.txt"
    assert (tmp_path / "x" / "y" / "b.bin").read_bytes() == bytes(range(256)) * 100


# --------------------------------------------------------------------------------- builds
DOCKERFILE = """\
    # syntax=docker/dockerfile:1
    ARG BASE=python:3.12-slim
    FROM ${BASE} AS main
    ARG GREETING=hello
    ENV APP_HOME=/srv/app \\
        MODE="fast mode"
    # a comment between instructions
    LABEL org.example=1
    EXPOSE 8080
    WORKDIR ${APP_HOME}
    COPY data.txt ./
    COPY sub/ ./sub/
    RUN useradd -m -u 1000 agent && echo "$GREETING $MODE" > greeting.txt
    COPY --chown=agent:agent --chmod=600 data.txt /home/agent/owned.txt
    RUN <<EOF
    set -e
    echo heredoc > /srv/app/heredoc.txt
    python --version > /srv/app/pyver.txt 2>&1
    EOF
    RUN python3 - <<PY
    open("/srv/app/py.txt", "w").write("from-python")
    PY
    RUN <<EOF
    #!/usr/bin/env python3
    open("/srv/app/shebang.txt", "w").write("shebang")
    EOF
    COPY <<EOF /etc/motd.extra
    line one
    EOF
    RUN ["/bin/sh", "-c", "echo exec-form > /srv/app/exec.txt"]
    SHELL ["/bin/bash", "-c"]
    RUN [[ -n "$BASH_VERSION" ]] && echo bash > /srv/app/shell.txt
    USER agent
    RUN whoami > /tmp/whoami.txt
    WORKDIR rel
    CMD ["bash"]
"""


def test_dockerfile_build_and_cache(tmp_path):
    task = make_task(tmp_path / "t", DOCKERFILE, {"data.txt": "data\n", "sub/s.txt": "s\n", "secret.key": "no",
                                                  ".dockerignore": "*.key\n"})  # fmt: skip

    async def body():
        async with LocalEnvironment.for_task(task) as env:
            r = await env.exec(
                "pwd; whoami; echo $MODE; cat /srv/app/greeting.txt /srv/app/heredoc.txt /srv/app/py.txt; echo; "
                "cat /srv/app/exec.txt /srv/app/shell.txt /tmp/whoami.txt /etc/motd.extra /srv/app/sub/s.txt; "
                "stat -c '%U %a' /home/agent/owned.txt; ls /srv/app/secret.key; python -c 'print(1)'; pip --version; "
                "cat /srv/app/shebang.txt"
            )
            return r, env._layer

    r, layer = run(body())
    out = r.stdout.splitlines()
    assert out[:11] == ["/srv/app/rel", "agent", "fast mode", "hello fast mode", "heredoc", "from-python",
                        "exec-form", "bash", "agent", "line one", "s"]  # fmt: skip
    assert out[11] == "agent 600"
    assert "No such file" in r.stderr  # .dockerignore kept secret.key out
    assert out[12] == "1" and out[13].startswith("pip ")  # python image mapping: python, pip
    assert out[14] == "shebang"  # RUN <<EOF with its own interpreter
    assert layer.meta["family"] == "python" and layer.user == "agent"

    async def again():
        t0 = time.monotonic()
        async with LocalEnvironment.for_task(task) as env:
            took = time.monotonic() - t0
            return env._layer.key, took

    key, took = run(again())
    assert key == layer.key and took < 3  # cached: no rebuild


@pytest.mark.parametrize(
    "dockerfile,files,error,line,text",
    [
        ("FROM alpine:3.19\nRUN true\n", {}, DockerfileError, 1, "can stand in for debian, ubuntu and python"),
        ("FROM debian:12\nONBUILD RUN true\n", {}, DockerfileError, 2, "ONBUILD is not supported"),
        ("FROM debian:12 AS a\nRUN true\nFROM debian:12\n", {}, DockerfileError, 3, "multi-stage"),
        ("FROM debian:12\nCOPY --from=a /x /y\n", {}, DockerfileError, 2, "--from"),
        ("FROM debian:12\nCOPY ../outside /x\n", {}, DockerfileError, 2, "outside the build context"),
        ("FROM debian:12\nCOPY missing.txt /x\n", {}, DockerfileError, 2, "not found"),
        ("FROM ubuntu:24.04\nRUN echo building\nRUN echo oops >&2; exit 7\n", {}, SandboxBuildFailedError, 3,
         "failed with exit code 7"),
    ],
)
def test_dockerfile_errors_name_file_and_line(tmp_path, dockerfile, files, error, line, text):
    task = make_task(tmp_path / "t", dockerfile, files)

    async def body():
        env = LocalEnvironment.for_task(task)
        with pytest.raises(error) as exc:
            await env.start(force_build=False)
        await env.stop(delete=True)
        return str(exc.value)

    msg = run(body())
    assert f"{task / 'environment' / 'Dockerfile'}:{line}:" in msg and text in msg
    assert run_dirs_of(os.getpid()) == []  # nothing half-started is left


# -------------------------------------------------------------------------- snapshot/fork
def test_snapshot_and_fork_isolation():
    async def body():
        async with LocalEnvironment.for_task(HELLO_TASK) as src:
            await src.exec("echo v1 > /app/state.txt && rm /etc/debian_version && "
                           "rm -rf /etc/apt && mkdir /etc/apt && touch /etc/apt/only-this && "
                           "nohup sleep 999 >/dev/null 2>&1 &")  # fmt: skip
            forks = await src.fork(3)
            try:
                infos = [box_info(f) for f in forks]
                await src.exec("echo v2 > /app/state.txt")  # after the fork: forks must not see it
                await forks[0].exec("echo fork0 > /app/state.txt && echo only0 > /app/f0")
                for i, f in enumerate(forks):
                    r = await f.exec("cat /app/state.txt; ls /etc/debian_version; ls /etc/apt; ls /app; "
                                     "ps -eo args --no-headers | grep -c '^sleep 999'")  # fmt: skip
                    lines = r.stdout.split()
                    assert lines[0] == ("fork0" if i == 0 else "v1")  # own writes only
                    assert "No such file" in r.stderr  # the deletion was snapshotted (whiteout)
                    assert lines[1] == "only-this"  # opaque folder kept
                    assert ("f0" in lines) == (i == 0)
                    assert lines[-1] == "0"  # processes are not forked
                assert (await src.exec("cat /app/state.txt; ps -eo args | grep -c '^sleep 999'")).stdout == "v2\n1\n"
                # a fork of a fork
                grand = await forks[0].fork(1)
                assert (await grand[0].exec("cat /app/f0 /app/state.txt")).stdout == "only0\nfork0\n"
                infos.append(box_info(grand[0]))
                await grand[0].stop()
            finally:
                for f in forks:
                    await f.stop()
            for info in infos:
                assert_box_cleaned(*info)

    run(body())


def test_snapshot_outlives_source_until_released_and_loads_in_another_process():
    async def take():
        async with LocalEnvironment.for_task(HELLO_TASK) as env:
            await env.exec("echo persisted > /app/hello.txt")
            return await env.snapshot(extra={"note": "n"})

    snap = run(take())
    assert snap.files.is_dir() and snap.meta["extra"] == {"note": "n"}
    code = textwrap.dedent(f"""
        import asyncio
        from reterm.sandbox.local import LocalEnvironment
        async def main():
            [env] = await LocalEnvironment.from_snapshot({snap.id!r}, 1)
            print((await env.exec("cat /app/hello.txt; pwd")).stdout, end="")
            await env.stop()
        asyncio.run(main())
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert out.returncode == 0, out.stderr
    assert out.stdout == "persisted\n/app\n"
    assert Snapshot.load(snap.id).meta["id"] == snap.id
    snap.release()
    assert not snap.path.exists()
    with pytest.raises(FileNotFoundError):
        Snapshot.load(snap.id)


def test_owner_killed_leaves_only_folders_and_sweep_removes_them():
    code = textwrap.dedent("""
        import asyncio, sys
        from reterm.sandbox.local import LocalEnvironment
        async def main():
            env = LocalEnvironment.for_task(sys.argv[1])
            await env.start(force_build=False)
            await env.exec("nohup sleep 31337 >/dev/null 2>&1 &")
            print(env.box.id, env.box.holder.pid, flush=True)
            await asyncio.sleep(600)
        asyncio.run(main())
    """)
    proc = subprocess.Popen([sys.executable, "-c", code, str(HELLO_TASK)], stdout=subprocess.PIPE, text=True, cwd=REPO)
    box_id, holder = proc.stdout.readline().split()
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    rundir = sub("run") / box_id
    for _ in range(100):  # --die-with-parent: the sandbox dies with its owner
        if not processes_mentioning("sleep\x0031337") and not Path(f"/proc/{holder}").exists():
            break
        time.sleep(0.05)
    assert processes_mentioning("sleep\x0031337") == []
    assert not [m for m in Path("/proc/self/mountinfo").read_text().splitlines() if box_id in m]
    assert rundir.exists()  # the folder is what is left
    state = json.loads((rundir / "state.json").read_text())
    cgroups = [Path(d) for d in state["cgroups"]["dirs"].values()]
    counts = sweep()
    assert counts["sandboxes"] >= 1
    assert_box_cleaned(box_id, cgroups, rundir)


def test_sweep_skips_a_sandbox_that_stops_while_it_looks(monkeypatch):
    """A run folder listed, then removed by its owner before the sweep reads it (another process's sandbox
    stopping), is skipped: the sweep does not fail (``tests/run.sh`` sweeps first, beside whatever runs)."""
    import reterm.sandbox.sweep as sweep_mod

    run_root = sub("run")
    gone = run_root / "vanished0000"

    class Listing(type(run_root)):
        def iterdir(self):
            yield gone
            yield from super().iterdir()

    monkeypatch.setattr(sweep_mod, "sub", lambda name: Listing(run_root) if name == "run" else sub(name))
    assert not gone.exists()
    sweep()  # the folder's stat raised FileNotFoundError here when the sweep did not expect it to vanish
    assert not gone.exists()


def test_fails_clearly_without_root():
    """As `nobody` (rootless mode, tests/test_sandbox_rootless.py): a root-owned layer is refused with a
    clear message, nothing started or left behind."""
    import shutil
    import tempfile

    top = Path(tempfile.mkdtemp(prefix="reterm-nobody-"))  # world-readable copy of the package
    try:
        top.chmod(0o755)
        shutil.copytree(REPO / "reterm", top / "reterm", ignore=shutil.ignore_patterns("__pycache__"))
        cache = top / "cache"
        cache.mkdir(mode=0o777)
        cache.chmod(0o777)
        code = "from reterm.sandbox.box import Box, BoxSpec\nBox.start(BoxSpec(lowers=['/']))\n"
        out = subprocess.run(
            ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", "/usr/bin/python3", "-c", code],
            capture_output=True, text=True, timeout=60, cwd=top,
            env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(top), "RETERM_CACHE": str(cache), "HOME": str(cache)},
        )  # fmt: skip
        assert out.returncode != 0
        assert "SandboxError" in out.stderr and "owned by uid 0" in out.stderr and "rootless" in out.stderr, out.stderr
        assert "Nothing was started" in out.stderr
        assert not (cache / "sandbox" / "run").exists() or not list((cache / "sandbox" / "run").iterdir())
    finally:
        shutil.rmtree(top, ignore_errors=True)


def test_fails_clearly_without_capabilities(tmp_path):
    """Root without the capabilities to mount: start fails with the mount error, nothing left behind."""
    code = (
        "from reterm.sandbox.box import Box, BoxSpec\n"
        f"Box.start(BoxSpec(lowers=[{str(find_base().rootfs)!r}]))\n"
    )
    proc = subprocess.Popen(
        ["setpriv", "--inh-caps=-all", "--bounding-set=-all", sys.executable, "-c", code],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO,
    )  # fmt: skip
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode != 0
    assert "lacks CAP_SYS_ADMIN" in stderr and "Nothing was started" in stderr
    assert run_dirs_of(proc.pid) == []


def test_network_policy_mapping(tmp_path):
    public = make_task(tmp_path / "pub", "FROM debian:12\n", toml="")
    public.joinpath("task.toml").write_text('version = "1.0"\n')  # default policy: public
    env = LocalEnvironment.for_task(public)  # runs offline (documented mapping)
    assert env.capabilities.disable_internet
    with pytest.raises(ValueError, match="public_network=error"):
        LocalEnvironment.for_task(public, public_network="error")
    allow = make_task(tmp_path / "allow", "FROM debian:12\n")
    allow.joinpath("task.toml").write_text(
        'version = "1.0"\n[environment]\nnetwork_mode = "allowlist"\nallowed_hosts = ["pypi.org"]\n'
    )
    with pytest.raises(ValueError, match="allowlist"):
        LocalEnvironment.for_task(allow)


# -------------------------------------------------------------------------- Harbor itself
@pytest.mark.slow
@pytest.mark.parametrize("agent,reward", [("oracle", 1.0), ("nop", 0.0)])
def test_harbor_run_cli(tmp_path, agent, reward):
    proc = subprocess.Popen(
        [str(Path(sys.executable).parent / "harbor"), "run", "-p", str(HELLO_TASK), "-a", agent,
         "-e", "reterm.sandbox.local:LocalEnvironment", "-o", str(tmp_path / "jobs"), "-y"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path,
        # offline: no telemetry upload and no LiteLLM cost-map download (each waits ~10 s on timeouts)
        env={**os.environ, "HARBOR_TELEMETRY": "0", "LITELLM_LOCAL_MODEL_COST_MAP": "True"},
    )  # fmt: skip
    stdout, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 0, stdout[-2000:] + stderr[-2000:]
    results = list((tmp_path / "jobs").glob("*/*/result.json"))
    assert len(results) == 1, list((tmp_path / "jobs").rglob("*"))
    result = json.loads(results[0].read_text())
    assert result["verifier_result"]["rewards"]["reward"] == reward
    assert result.get("exception_info") is None
    assert run_dirs_of(proc.pid) == []  # no sandbox left behind (mounts die with their namespace)
    assert [p for p in processes_mentioning("--die-with-parent") if _parent(p) == proc.pid] == []


def _parent(pid: int) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def test_cancel_during_start_leaves_no_sandbox():
    """A task cancelled while the sandbox starts (a Gradio Stop, a Harbor cancel) leaves nothing behind:
    start waits for the thread that creates the box and closes it (found by the Space's tests)."""

    async def main():
        env = LocalEnvironment.for_task(HELLO_TASK)
        task = asyncio.create_task(env.start(force_build=False))
        while not run_dirs_of(os.getpid()) and not task.done():  # Box.start's thread has begun
            await asyncio.sleep(0.001)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert live_boxes() == []  # the cancelled start waited for its thread and closed the box
        await env.stop()

    run(main())
    assert live_boxes() == []
    assert run_dirs_of(os.getpid()) == []
