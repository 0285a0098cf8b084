"""Rootless mode of the local sandbox: "for users without root, through unprivileged user
namespaces ...; where neither is possible it fails at start with a message saying what is missing,
never half-started".

The non-root tests run real processes as an unprivileged uid (``setpriv --reuid=UID --regid=UID
--clear-groups``; UID 61234, which no other process here uses: 65534 is the kernel's overflow id and
other tests run as it) with HOME and RETERM_CACHE in a folder owned by that uid. That cache gets the
root-built base handed over to the user (an idmapped mount of it, see ``_ROOT_SIDE``), so they
take seconds; the slow test builds a base from nothing as that user (rootless debootstrap). Nothing
in the kernel is mocked: user namespaces, overlayfs, rlimits and the refusals are real. The Python
interpreter may live in a folder other users cannot enter (pyenv under /root): the runner then lays
a private overlay over that folder in a private mount namespace and lets others traverse it there
(the host is not changed).
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest
from sandbox_support import HELLO_TASK, REPO, run

from reterm.sandbox.box import Box, BoxSpec, SandboxError
from reterm.sandbox.local import LocalEnvironment
from reterm.sandbox.rootless import rootless_problems, userns_sysctl_problems

NOBODY = 61234  # the non-root user of these tests (no passwd entry needed)
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="acting as another user needs root")

# Runs as root in a private mount namespace (so the host sees none of it), then becomes the user:
# * folders on the way to the interpreter or the checkout that others cannot enter (pyenv under
#   /root) get an overlay whose upper layer is a tmpfs, and o+x there;
# * the root-built base appears in the user's cache through an idmapped bind mount (Linux >= 5.12:
#   a user namespace mapping 0 -> the user makes root's files show as the user's), the way a base the
#   user built itself would look, without copying 400 MB; where that is not supported, the fixture
#   copies the base instead (cp -a + chown).
_ROOT_SIDE = r"""
import ctypes, json, os, struct, subprocess, sys, time
cfg = json.loads(sys.argv[1])
def sh(*a):
    subprocess.run(a, check=True)
detached = []
if cfg["idmap"]:  # before the overlays below: an overlayfs path cannot be idmapped
    libc = ctypes.CDLL(None, use_errno=True)
    p = subprocess.Popen(["unshare", "--user", "sleep", "60"])
    while os.readlink(f"/proc/{p.pid}/ns/user") == os.readlink("/proc/self/ns/user"):
        time.sleep(0.005)
    for f in ("uid_map", "gid_map"):
        with open(f"/proc/{p.pid}/{f}", "w") as fh:
            fh.write(f"0 {cfg['uid']} 1\n")
    userns = os.open(f"/proc/{p.pid}/ns/user", os.O_RDONLY)
    p.kill(); p.wait()
    for src, dst in cfg["idmap"]:  # open_tree(OPEN_TREE_CLONE) + mount_setattr(MOUNT_ATTR_IDMAP)
        fd = libc.syscall(428, -100, src.encode(), 1 | os.O_CLOEXEC)
        attr = ctypes.create_string_buffer(struct.pack("QQQQ", 0x100000, 0, 0, userns))
        if fd < 0 or libc.syscall(442, fd, b"", 0x1000, attr, 32) < 0:
            sys.exit(f"idmapped mount of {src} failed: {os.strerror(ctypes.get_errno())}")
        detached.append((fd, dst))
sh("mount", "-t", "tmpfs", "-o", "mode=0700", "reterm-expose", cfg["stash"])
layered = []
for i, d in enumerate(cfg["closed"]):  # outermost first; one overlay covers the folders below it
    if not any(d.startswith(top + "/") for top in layered):
        u, w = f"{cfg['stash']}/u{i}", f"{cfg['stash']}/w{i}"
        os.mkdir(u); os.mkdir(w)
        sh("mount", "-t", "overlay", "-o", f"lowerdir={d},upperdir={u},workdir={w}", "reterm-expose", d)
        layered.append(d)
    os.chmod(d, os.stat(d).st_mode | 0o001)
for fd, dst in detached:  # move_mount(MOVE_MOUNT_F_EMPTY_PATH)
    if libc.syscall(429, fd, b"", -100, dst.encode(), 4) < 0:
        sys.exit(f"idmapped mount on {dst} failed: {os.strerror(ctypes.get_errno())}")
os.execvp(cfg["argv"][0], cfg["argv"])
"""


def _closed_dirs(paths: list[Path]) -> list[Path]:
    """Folders on the way to ``paths`` that other users cannot traverse (no o+x), outermost first."""
    out: list[Path] = []
    for p in paths:
        p = Path(p).resolve()
        for a in [*reversed(p.parents), p]:
            if a.is_dir() and not a.stat().st_mode & stat.S_IXOTH and a not in out:
                out.append(a)
    return out


class Nobody:
    """A non-root user (uid :data:`NOBODY`) with its own HOME and sandbox cache, and a way to run Python as it."""

    def __init__(self, top: Path, idmap: list[tuple[Path, Path]] | None = None):
        self.top = top
        self.home = top / "home"
        self.cache = self.home / ".cache" / "reterm"
        self.stash = top / "stash"
        self.idmap = idmap or []

    def sandbox_dir(self, name: str) -> Path:
        return self.cache / "sandbox" / name

    def run(self, code: str, *, env: dict[str, str] | None = None, timeout: float = 300,
            prefix: tuple[str, ...] = ()) -> subprocess.CompletedProcess:  # fmt: skip
        """Run ``python -c code`` as the user (after ``prefix``, e.g. an unshare wrapper)."""
        self.stash.mkdir(mode=0o700, exist_ok=True)
        cfg = {
            "stash": str(self.stash), "uid": NOBODY, "idmap": [(str(a), str(b)) for a, b in self.idmap],
            "closed": [str(d) for d in _closed_dirs([Path(sys.base_prefix), Path(sys.prefix), REPO, self.top])],
            "argv": ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", *prefix,
                     sys.executable, "-c", textwrap.dedent(code)],
        }  # fmt: skip
        argv = ["unshare", "--mount", "--propagation", "private", sys.executable, "-c", _ROOT_SIDE, json.dumps(cfg)]
        penv = {"PATH": "/usr/bin:/bin:/usr/sbin:/sbin", "HOME": str(self.home), "RETERM_CACHE": str(self.cache),
                "PYTHONPATH": str(REPO), "LANG": "C.UTF-8", "HARBOR_TELEMETRY": "0", **(env or {})}  # fmt: skip
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=penv, cwd=self.top)

    def json(self, code: str, **kw) -> dict:
        """Run ``code`` as the user; it prints one JSON object as its last line of output."""
        r = self.run(code, **kw)
        assert r.returncode == 0, f"exit {r.returncode}\n{r.stdout[-3000:]}\n{r.stderr[-5000:]}"
        return json.loads(r.stdout.strip().splitlines()[-1])

    def processes(self) -> list[str]:
        """Command lines of every process of the user on the host (waits up to 5 s for exits)."""
        found: list[str] = []
        for _ in range(100):
            found = []
            for d in Path("/proc").iterdir():
                if d.name.isdigit():
                    try:
                        if d.stat().st_uid == NOBODY:
                            found.append((d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"))
                    except OSError:
                        continue
            if not found:
                return []
            time.sleep(0.05)
        return found

    def assert_nothing_left(self) -> None:
        """No process of the user, no run folder, no mount of its cache anywhere, no snapshot kept."""
        assert self.processes() == [], "processes of the rootless user were left behind"
        run_dir = self.sandbox_dir("run")
        assert not run_dir.exists() or list(run_dir.iterdir()) == [], list(run_dir.iterdir())
        snaps = self.sandbox_dir("snapshots")
        assert not snaps.exists() or list(snaps.iterdir()) == [], list(snaps.iterdir())
        for pid_dir in Path("/proc").iterdir():
            if pid_dir.name.isdigit():
                try:
                    assert str(self.cache) not in (pid_dir / "mountinfo").read_text()
                except OSError:
                    continue


@pytest.fixture(scope="module")
def nobody():
    """The non-root user with HOME/RETERM_CACHE in a fresh folder it owns; its cache holds the
    root-built base handed over to it (owned by it, as a base it built itself would be: through an
    idmapped mount, else a copy)."""
    from reterm.sandbox.base_image import ensure_base

    if os.geteuid() != 0:
        pytest.skip("acting as another user needs root")
    base = ensure_base()
    top = Path(tempfile.mkdtemp(prefix="reterm-rootless-"))
    top.chmod(0o755)
    dest = top / "home" / ".cache" / "reterm" / "sandbox" / "base"
    (dest / base.key / "rootfs").mkdir(parents=True)
    shutil.copy(base.rootfs.parent.parent / f"{base.key}.json", dest / f"{base.key}.json")
    subprocess.run(["chown", "-R", f"{NOBODY}:{NOBODY}", str(top / "home")], check=True)
    user = Nobody(top, idmap=[(base.rootfs, dest / base.key / "rootfs")])
    if user.run("import os; print(os.stat(os.environ['BASE']).st_uid)", env={"BASE": str(user.idmap[0][1])}
                ).stdout.strip() != str(NOBODY):  # fmt: skip
        user.idmap = []  # no idmapped mounts here: hand over a copy
        shutil.rmtree(dest / base.key)
        subprocess.run(["cp", "-a", str(base.rootfs.parent), str(dest / base.key)], check=True)
        subprocess.run(["chown", "-R", f"{NOBODY}:{NOBODY}", str(dest / base.key)], check=True)
    try:
        yield user
    finally:
        shutil.rmtree(top, ignore_errors=True)


# ------------------------------------------------------------------------- as a non-root user
MAIN_FLOW = r"""
import asyncio, json, os, statistics, sys, time
from pathlib import Path
from reterm.sandbox.box import ExecTimeoutError
from reterm.sandbox.local import LocalEnvironment

task = sys.argv[1] if len(sys.argv) > 1 else os.environ["TASK"]
out = {"uid": os.geteuid()}

async def main():
    async with LocalEnvironment.for_task(task):  # builds the task layer as this user
        pass
    t0 = time.perf_counter()
    env = await LocalEnvironment.for_task(task).__aenter__()
    out["start_s"] = time.perf_counter() - t0
    out["mode"], out["cgroups"] = env.box.mode, env.box.cgroups is not None
    out["layers_owner"] = [Path(p).stat().st_uid for p in env.box.spec.lowers]
    r = await env.exec("id -u; cat /proc/self/uid_map; pwd; echo v1 > /app/state.txt; rm /etc/debian_version; "
                       "rm -rf /etc/skel && mkdir /etc/skel && touch /etc/skel/only")
    out["id"] = r.stdout.split("\n")[:3]
    lat = []
    for _ in range(10):
        t = time.perf_counter(); await env.exec("true"); lat.append(time.perf_counter() - t)
    out["exec_true_s"] = statistics.median(lat)
    host = Path(os.environ["HOME"]) / "up.txt"
    host.write_text("uploaded\n")
    await env.upload_file(host, "/app/up.txt")
    await env.download_file("/app/state.txt", Path(os.environ["HOME"]) / "down.txt")
    out["down"] = (Path(os.environ["HOME"]) / "down.txt").read_text()
    # a timeout kills the command's whole tree, a double-forked daemon included (no cgroups here)
    try:
        await env.exec("setsid sh -c 'sleep 601 &'; sleep 602 & sleep 603", timeout_sec=1)
        out["timeout"] = "no timeout"
    except ExecTimeoutError:
        out["timeout"] = "raised"
    out["sleeps_after_timeout"] = (await env.exec("ps -eo args | grep -c '^sleep 60[123]'")).stdout.strip()
    t0 = time.perf_counter()
    snap = await env.snapshot()
    out["snapshot_s"] = time.perf_counter() - t0
    forks = await LocalEnvironment.from_snapshot(snap, 2)
    out["fork2_s"] = time.perf_counter() - t0
    snap.release()
    await env.exec("echo v2 > /app/state.txt")
    await forks[0].exec("echo fork0 > /app/state.txt && touch /app/only0")
    out["forks"] = [(await f.exec("cat /app/state.txt /app/up.txt; ls /app; ls -A /etc/skel; "
                                  "ls /etc/debian_version")).__dict__ for f in forks]
    out["source"] = (await env.exec("cat /app/state.txt")).stdout
    out["box_ids"] = [env.box.id] + [f.box.id for f in forks]
    for f in forks:
        await f.stop()
    await env.stop()
    t0 = time.perf_counter()
    async with LocalEnvironment.for_task(task) as again:
        out["start2_s"] = time.perf_counter() - t0
    out["run_dirs"] = os.listdir(Path(os.environ["RETERM_CACHE"]) / "sandbox" / "run")

asyncio.run(main())
print(json.dumps(out))
"""


@needs_root
def test_non_root_user_runs_exec_transfers_snapshot_and_fork(nobody):
    out = nobody.json(MAIN_FLOW, env={"TASK": str(HELLO_TASK)})
    print(f"rootless as uid {NOBODY}: " + "start %.3f s (second %.3f s), exec true median %.4f s, snapshot %.3f s, "
          "snapshot+fork(2) %.3f s" % (out["start_s"], out["start2_s"], out["exec_true_s"], out["snapshot_s"],
                                        out["fork2_s"]))  # fmt: skip
    assert out["uid"] == NOBODY and out["mode"] == "rootless" and out["cgroups"] is False
    assert out["layers_owner"] == [NOBODY, NOBODY]  # task layer built by the user, base handed over
    assert out["id"][0] == "0" and out["id"][2] == "/app"  # root inside, the task's WORKDIR
    assert out["id"][1].split() == ["0", str(NOBODY), "1"]  # one uid: root inside = the user outside
    assert out["down"] == "v1\n"
    assert out["timeout"] == "raised" and out["sleeps_after_timeout"] == "0"
    for i, r in enumerate(out["forks"]):
        lines = r["stdout"].split()
        assert lines[0] == ("fork0" if i == 0 else "v1")  # own writes only, not the source's later v2
        assert lines[1] == "uploaded"
        assert ("only0" in lines) == (i == 0)  # forks never see each other's writes
        assert lines[-1] == "only"  # opaque folder (user.overlay xattr) survived the snapshot
        assert "No such file" in r["stderr"]  # the deletion (a whiteout) survived too
    assert out["source"] == "v2\n"
    assert out["run_dirs"] == []
    nobody.assert_nothing_left()


HOSTILE = r"""
import asyncio, json, os, subprocess, sys
from pathlib import Path
from reterm.sandbox.local import LocalEnvironment

secret = Path(os.environ["HOME"]) / "secret.txt"
secret.write_text("HOST-SECRET-31337")
# a host process of the very uid the sandbox's root maps to
victim = subprocess.Popen(["sleep", "7777"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
out = {}

def sandbox_processes(env):  # processes in the sandbox's pid namespace, seen from the host
    ns = os.stat(f"/proc/{env.box.init_pid}/ns/pid").st_ino
    n = 0
    for d in os.listdir("/proc"):
        try:
            n += d.isdigit() and os.stat(f"/proc/{d}/ns/pid").st_ino == ns
        except OSError:
            pass
    return n

async def main():
    async with LocalEnvironment.for_task(os.environ["TASK"], pids_max=64, memory_mb=256) as env:
        r = await env.exec(f"cat {secret}; ls {os.environ['HOME']}; mkdir -p {secret.parent} && echo pwned > {secret} "
                           f"&& cat {secret}; env | grep -c HF_TOKEN")
        out["read_write"] = r.__dict__
        r = await env.exec("kill -9 -1; sleep 0.2; echo survived")
        out["kill"] = r.__dict__
        out["after_kill"] = (await env.exec("echo alive; ps -eo args | grep -c '[w]hile :'")).stdout
        out["escapes"] = [(await env.exec(c + " 2>&1")).__dict__ for c in
                          ("mount -t tmpfs x /mnt", "mount --bind / /mnt", "umount /proc", "nsenter -t 1 -m true",
                           "echo 1 > /proc/sys/kernel/hostname", "echo 1 > /proc/sys/vm/drop_caches")]
        out["hog"] = (await env.exec("python3 -c 'b = bytearray(600 * 2**20)'", timeout_sec=60)).__dict__
        # forks until the kernel says no (no retries, unlike bash), then counts the sandbox's processes
        forker = ("import os, time\nn = 0\nwhile n < 200:\n    try:\n        pid = os.fork()\n    except OSError:\n"
                  "        break\n    if pid == 0:\n        time.sleep(100)\n        os._exit(0)\n    n += 1\n"
                  "print(n, flush=True)\nos._exit(0)")
        r = await env.exec(f"python3 -c '{forker}'", timeout_sec=60)
        out["forks"], out["in_sandbox"] = int(r.stdout), sandbox_processes(env)

try:
    asyncio.run(main())
    out["victim_alive"] = victim.poll() is None
    out["secret"] = secret.read_text()
finally:
    victim.kill()
print(json.dumps(out))
"""


@needs_root
def test_hostile_commands_in_rootless_mode(nobody):
    out = nobody.json(HOSTILE, env={"TASK": str(HELLO_TASK), "HF_TOKEN": "hf_FAKE_rootless"})
    rw = out["read_write"]
    assert "HOST-SECRET" not in rw["stdout"] and "No such file" in rw["stderr"]  # host path: not there
    assert rw["stdout"].split() == ["pwned", "0"]  # it wrote its own copy; no HF_TOKEN inside
    assert out["secret"] == "HOST-SECRET-31337"  # the host file is unchanged
    assert out["victim_alive"], "kill -9 -1 inside the sandbox killed a host process of the same uid"
    assert out["kill"]["stdout"] == "survived\n"  # kill(-1) spares the caller; it reached nothing outside
    assert out["after_kill"].split() == ["alive", "1"]  # the sandbox's init lives on
    for r in out["escapes"]:  # no mounts, no host namespaces, no global sysctls
        assert r["return_code"] != 0, r
    assert out["hog"]["return_code"] != 0 and "MemoryError" in out["hog"]["stderr"]  # RLIMIT_DATA
    # RLIMIT_NPROC (pids_max=64) stops the forks without cgroups; it counts the user's processes outside too
    assert 32 < out["forks"] < 64 and out["in_sandbox"] <= 64, out
    nobody.assert_nothing_left()


# --------------------------------------------------------------------------- clear refusals
REFUSE = r"""
import sys
from reterm.sandbox.box import Box, BoxSpec
Box.start(BoxSpec(lowers=[sys.argv[1] if len(sys.argv) > 1 else "/"]))
"""


@needs_root
def test_missing_bwrap_refuses_before_anything_starts(nobody):
    layers = sorted(os.listdir(nobody.sandbox_dir("layers"))) if nobody.sandbox_dir("layers").exists() else []
    code = ("import asyncio, os\nfrom reterm.sandbox.local import LocalEnvironment\n"
            "asyncio.run(LocalEnvironment.for_task(os.environ['TASK']).start(force_build=True))\n")  # fmt: skip
    r = nobody.run(code, env={"TASK": str(HELLO_TASK), "RETERM_BWRAP": "/nonexistent/bwrap"})
    assert r.returncode != 0
    assert "SandboxError" in r.stderr and "missing programs: bwrap" in r.stderr, r.stderr[-3000:]
    assert "Nothing was started" in r.stderr
    # nothing half-started: no run folder, no half-built layer, no process
    left = sorted(os.listdir(nobody.sandbox_dir("layers"))) if nobody.sandbox_dir("layers").exists() else []
    assert [x for x in left if x not in layers] == []
    nobody.assert_nothing_left()


@needs_root
def test_root_owned_layer_and_forced_root_mode_are_refused(nobody):
    r = nobody.run(REFUSE)  # "/" belongs to root: a one-uid namespace could read it but not change it
    assert r.returncode != 0 and "is owned by uid 0" in r.stderr and "Nothing was started" in r.stderr, r.stderr
    r = nobody.run(REFUSE, env={"RETERM_SANDBOX_MODE": "root"})
    assert r.returncode != 0 and "RETERM_SANDBOX_MODE=root needs root" in r.stderr, r.stderr
    nobody.assert_nothing_left()


def test_user_namespaces_disabled_by_the_kernel_are_explained(tmp_path):
    """A real kernel refusal: user.max_user_namespaces is per user namespace, so setting it to 0 inside
    one (a throw-away namespace) disables them for everything started there, and only there."""
    code = textwrap.dedent(f"""
        from reterm.sandbox.box import Box, BoxSpec
        Box.start(BoxSpec(lowers=[{str(tmp_path)!r}]))
    """)
    r = subprocess.run(
        ["unshare", "--user", "--map-root-user", "/bin/sh", "-c",
         'echo 0 > /proc/sys/user/max_user_namespaces && exec "$@"', "sh", sys.executable, "-c", code],
        capture_output=True, text=True, timeout=120, cwd=REPO,
        env={**os.environ, "RETERM_SANDBOX_MODE": "rootless", "RETERM_CACHE": str(tmp_path / "cache")},
    )  # fmt: skip
    assert r.returncode != 0
    assert "user namespaces are disabled: sysctl user.max_user_namespaces is 0" in r.stderr, r.stderr[-3000:]
    assert "creating a user namespace with overlayfs failed" in r.stderr and "Nothing was started" in r.stderr
    run_dir = tmp_path / "cache" / "sandbox" / "run"
    assert not run_dir.exists() or not list(run_dir.iterdir())


def test_sysctl_probe_reads_the_settings_that_forbid_user_namespaces(tmp_path):
    (tmp_path / "user").mkdir()
    (tmp_path / "kernel").mkdir()
    assert userns_sysctl_problems(tmp_path) == []  # files absent: nothing forbids them
    (tmp_path / "user" / "max_user_namespaces").write_text("15000\n")
    (tmp_path / "kernel" / "unprivileged_userns_clone").write_text("1\n")
    (tmp_path / "kernel" / "apparmor_restrict_unprivileged_userns").write_text("0\n")
    assert userns_sysctl_problems(tmp_path) == []
    (tmp_path / "user" / "max_user_namespaces").write_text("0\n")
    (tmp_path / "kernel" / "unprivileged_userns_clone").write_text("0\n")
    (tmp_path / "kernel" / "apparmor_restrict_unprivileged_userns").write_text("1\n")
    problems = userns_sysctl_problems(tmp_path)
    assert len(problems) == 3
    assert "user.max_user_namespaces is 0" in problems[0]
    assert "unprivileged_userns_clone is 0" in problems[1] and "AppArmor" in problems[2]
    assert userns_sysctl_problems() == [] and rootless_problems() == ()  # this host allows them


def test_bad_mode_value_is_refused(monkeypatch, tmp_path):
    monkeypatch.setenv("RETERM_SANDBOX_MODE", "podman")
    with pytest.raises(SandboxError, match="RETERM_SANDBOX_MODE='podman': expected auto, root or rootless"):
        Box.start(BoxSpec(lowers=[tmp_path]))


@needs_root
@pytest.mark.slow
@pytest.mark.parametrize("agent,reward", [("oracle", 1.0), ("nop", 0.0)])
def test_harbor_run_as_non_root_user(nobody, agent, reward):
    """The sandbox's acceptance run, as the non-root user: `harbor run -p hello-file -a AGENT -e local`."""
    code = f"""
        import os, sys
        os.chdir(os.environ["HOME"])
        sys.argv = ["harbor", "run", "-p", {str(HELLO_TASK)!r}, "-a", {agent!r},
                    "-e", "reterm.sandbox.local:LocalEnvironment", "-o", "jobs-{agent}", "-y"]
        from harbor.cli.main import app
        sys.exit(app())
    """
    r = nobody.run(code, env={"LITELLM_LOCAL_MODEL_COST_MAP": "True"}, timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    [result] = [json.loads(p.read_text()) for p in (nobody.home / f"jobs-{agent}").glob("*/*/result.json")]
    assert result["verifier_result"]["rewards"]["reward"] == reward
    assert result.get("exception_info") is None
    nobody.assert_nothing_left()


# ------------------------------------------------------------ rootless mode forced as root (CI)
@needs_root
def test_forced_rootless_mode_as_root_keeps_layers_and_snapshots_apart(monkeypatch):
    """RETERM_SANDBOX_MODE=rootless as root: a user namespace mapping root to root, cgroups still
    used; its task layer and snapshots are kept apart from root mode's (other xattr namespace)."""

    async def body():
        async with LocalEnvironment.for_task(HELLO_TASK) as env:
            box = env.box
            assert box.mode == "rootless" and box.cgroups is not None
            assert (await env.exec("cat /proc/self/uid_map")).stdout.split() == ["0", "0", "1"]
            await env.exec("rm -rf /etc/skel && mkdir /etc/skel && touch /etc/skel/x")
            [fork] = await env.fork(1)
            assert (await fork.exec("ls -A /etc/skel")).stdout == "x\n"  # opaque folder kept (user.overlay xattr)
            snap = await env.snapshot()
            await fork.stop()
            return box.spec.lowers[0], snap

    monkeypatch.setenv("RETERM_SANDBOX_MODE", "rootless")
    rootless_layer, snap = run(body())
    monkeypatch.setenv("RETERM_SANDBOX_MODE", "root")
    try:
        with pytest.raises(SandboxError, match="taken in rootless mode"):
            run(LocalEnvironment.from_snapshot(snap, 1))

        async def root_layer():
            async with LocalEnvironment.for_task(HELLO_TASK) as env:
                assert env.box.mode == "root"
                return env.box.spec.lowers[0]

        assert run(root_layer()) != rootless_layer
    finally:
        snap.release()


# ----------------------------------------------------------------- a base built without root
@needs_root
@pytest.mark.slow
def test_rootless_base_build_from_nothing_and_apt_in_a_build_step():
    """As the non-root user with an empty cache: `reterm sandbox prepare` builds the base with debootstrap as
    the fake root of a user namespace (202-262 s here under load), then a task whose build step runs
    apt-get (download user _apt does not exist under one uid) builds and runs."""
    top = Path(tempfile.mkdtemp(prefix="reterm-rootless-build-"))  # not under pytest's 0700 folder
    top.chmod(0o755)
    user = Nobody(top)
    user.home.mkdir()
    task = top / "task"
    shutil.copytree(HELLO_TASK, task)
    (task / "environment" / "Dockerfile").write_text(
        "FROM debian:bookworm-slim\nRUN apt-get update && apt-get install -y --no-install-recommends jq\nWORKDIR /app\n"
    )
    subprocess.run(["chown", "-R", f"{NOBODY}:{NOBODY}", str(user.home), str(task)], check=True)
    code = r"""
        import asyncio, json, os, sys
        from reterm.sandbox.cli import main
        assert main(["prepare"]) == 0
        from reterm.sandbox.base_image import find_base
        from reterm.sandbox.local import LocalEnvironment
        base = find_base()
        async def go():
            async with LocalEnvironment.for_task(os.environ["TASK"]) as env:
                return (await env.exec("jq -n '1+1'; stat -c %u /usr/bin/passwd; find / -xdev -type f -perm /6000 | wc -l; "
                                       "dpkg --audit && echo audit-ok")).stdout
        print(json.dumps({"meta": base.meta, "out": asyncio.run(go())}))
    """
    try:
        out = user.json(code, env={"TASK": str(task)}, timeout=1800)
        assert out["meta"]["rootless_build"] is True and out["meta"]["built_by_uid"] == NOBODY
        print(f"rootless base build: {out['meta']['build_s']} s")
        assert out["out"].split() == ["2", "0", "0", "audit-ok"]
        user.assert_nothing_left()
    finally:
        shutil.rmtree(top, ignore_errors=True)
