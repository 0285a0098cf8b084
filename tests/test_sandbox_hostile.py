"""Hostile commands against the local sandbox: each test runs something an agent must not
be able to do to the host, then checks that the host is unchanged (files, credentials, mounts,
sysctls, the base layer, a host process) and that the stopped sandbox left nothing behind."""

from __future__ import annotations

import asyncio
import socket
import subprocess
import threading
import time
from pathlib import Path

import pytest
from sandbox_support import HELLO_TASK, REPO, assert_box_cleaned, host_state, processes_mentioning, run

from reterm.sandbox.box import ExecTimeoutError
from reterm.sandbox.local import LocalEnvironment

SECRET = "TOP-SECRET-HOST-FILE-4711"


class Guard:
    """Collects the sandboxes a test started so the fixture can check their clean-up."""

    def __init__(self, sentinel: Path):
        self.sentinel = sentinel
        self.boxes: list[tuple[str, list[Path], Path]] = []

    async def sandbox(self, body, **kwargs):
        """Start a sandbox of the fixture task, run ``await body(env)``, stop it; returns body's result."""
        env = LocalEnvironment.for_task(HELLO_TASK, **kwargs)
        await env.start(force_build=False)
        box = env.box
        self.boxes.append((box.id, list(box.cgroups.dirs.values()) if box.cgroups else [], box.rundir))
        try:
            return await body(env)
        finally:
            await env.stop(delete=True)


@pytest.fixture
def guard(tmp_path):
    sentinel = tmp_path / "sentinel"
    sentinel.mkdir()
    (sentinel / "secret.txt").write_text(SECRET)
    before = host_state(sentinel)
    g = Guard(sentinel)
    yield g
    assert host_state(sentinel) == before, "the host changed"
    assert g.boxes, "the test started no sandbox"
    for box_id, cgroups, rundir in g.boxes:
        assert_box_cleaned(box_id, cgroups, rundir)


def test_rm_rf_root_leaves_host_and_base_intact(guard):
    async def body(env):
        r = await env.exec("rm -rf --no-preserve-root / 2>/dev/null; ls /usr/bin | wc -l", timeout_sec=120)
        return r

    r = run(guard.sandbox(body))
    assert int((r.stdout or "0").strip() or 0) == 0  # the sandbox's own files are gone ...
    # ... and the guard checks the host and the shared base layer are not


def test_reading_host_files_is_impossible(guard):
    cmd = (f"cat {guard.sentinel}/secret.txt; ls {REPO}; ls /root; cat /root/.bash_history; "
           f"grep -r {SECRET} /tmp /root /home /work 2>/dev/null; echo done")  # fmt: skip
    r = run(guard.sandbox(lambda env: env.exec(cmd, timeout_sec=60)))
    assert SECRET not in (r.stdout or "") + (r.stderr or "")
    assert "pyproject.toml" not in (r.stdout or "")
    assert "done" in r.stdout


def test_writing_host_paths_only_writes_the_sandbox(guard):
    cmd = (f"mkdir -p {guard.sentinel} {REPO} && echo pwned > {guard.sentinel}/secret.txt && "
           f"echo pwned > {REPO}/PWNED && echo 'evil:x:0:0::/:/bin/sh' >> /etc/passwd && "
           f"cat {guard.sentinel}/secret.txt")  # fmt: skip
    r = run(guard.sandbox(lambda env: env.exec(cmd)))
    assert r.return_code == 0 and r.stdout.strip() == "pwned"  # it wrote its own copy
    assert not (REPO / "PWNED").exists()
    assert (guard.sentinel / "secret.txt").read_text() == SECRET


def test_host_shadow_is_not_the_sandbox_shadow(guard):
    from reterm.sandbox.base_image import find_base

    r = run(guard.sandbox(lambda env: env.exec("cat /etc/shadow")))
    assert r.stdout == (find_base().rootfs / "etc/shadow").read_text()


def test_callers_environment_does_not_leak(guard, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_FAKEtoken1234567890")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-FAKE")
    r = run(guard.sandbox(lambda env: env.exec("env; cat /proc/1/environ /proc/self/environ | tr '\\0' '\\n'")))
    out = (r.stdout or "") + (r.stderr or "")
    assert "hf_FAKE" not in out and "sk-FAKE" not in out
    assert "PATH=" in out  # the sandbox's own environment is there


def test_host_localhost_server_is_unreachable(guard):
    hits: list[bytes] = []
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(5)
    srv.settimeout(0.2)
    port = srv.getsockname()[1]
    stop = threading.Event()

    def serve():
        while not stop.is_set():
            try:
                conn, _ = srv.accept()
            except OSError:
                continue
            hits.append(conn.recv(100))
            conn.close()

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    try:
        # the listener works from the host
        with socket.create_connection(("127.0.0.1", port), timeout=2) as c:
            c.sendall(b"host")
        time.sleep(0.3)
        assert hits == [b"host"]
        cmd = (f"curl -sS -m 3 http://127.0.0.1:{port}/ ; "
               f"python3 -c \"import socket; socket.create_connection(('127.0.0.1', {port}), timeout=2)\"; "
               "curl -sS -m 3 http://deb.debian.org/ ; ip -o link | cut -d: -f2")  # fmt: skip
        r = run(guard.sandbox(lambda env: env.exec(cmd, timeout_sec=30)))
    finally:
        stop.set()
        t.join(2)
        srv.close()
    assert hits == [b"host"], "a connection from the sandbox reached the host's 127.0.0.1"
    assert "Connection refused" in r.stderr
    assert [x.strip() for x in r.stdout.split()] == ["lo"]


def test_fork_bomb_is_contained(guard):
    async def body(env):
        try:  # the bomb's first shell returns at once (its children run on), or the timeout hits
            await env.exec(":(){ :|:& };:", timeout_sec=3)
        except ExecTimeoutError:
            pass
        samples = []
        for _ in range(40):  # the bomb's size moves as its forks fail and its shells exit
            samples.append(int((env.box.cgroups.dirs["pids"] / "pids.current").read_text()))
            await asyncio.sleep(0.05)
        return samples

    samples = run(guard.sandbox(body, pids_max=64))
    assert max(samples) <= 64  # never past the sandbox's process limit ...
    assert max(samples) > 32  # ... which the bomb did reach; the guard checks that the host is unchanged
    # and that stop() killed every bomb process


def test_memory_hog_is_killed_and_sandbox_survives(guard):
    async def body(env):
        hog = await env.exec("python3 -c 'a=[]\nwhile True: a.append(bytearray(10**7))'", timeout_sec=60)
        peak = env.box.memory_peak_bytes()
        ok = await env.exec("echo alive")
        return hog, peak, ok

    hog, peak, ok = run(guard.sandbox(body, memory_mb=200))
    assert hog.return_code == 137  # OOM-killed (SIGKILL)
    assert peak is not None and peak <= 200 * 2**20
    assert ok.stdout == "alive\n"


def test_100mb_of_output_is_capped(guard):
    limit = 2 * 2**20

    async def body(env):
        return await env.exec("head -c 100000000 /dev/zero | tr '\\0' a; echo END", timeout_sec=120)

    r = run(guard.sandbox(body, max_output_bytes=limit))
    assert r.return_code == 0
    assert len(r.stdout) < limit + 200
    assert "output truncated" in r.stdout and r.stdout.endswith("aEND\n")


def test_sleep_forever_times_out_and_tree_is_killed(guard):
    async def body(env):
        t0 = time.monotonic()
        with pytest.raises(ExecTimeoutError) as exc:
            await env.exec("echo started; (sleep 4242 &); sleep infinity", timeout_sec=1)
        took = time.monotonic() - t0
        left = await env.exec("ps -eo args --no-headers | grep -cE '^sleep (4242|infinity)' || true")
        return exc.value, took, left

    err, took, left = run(guard.sandbox(body))
    assert "started" in err.stdout
    assert took < 5
    assert left.stdout.strip() == "0"


def test_double_forked_daemon_dies_with_the_sandbox(guard):
    marker = "98765"

    async def body(env):
        r = await env.exec(f"setsid sh -c 'nohup sleep {marker} >/dev/null 2>&1 &' ; echo launched", timeout_sec=10)
        seen = await env.exec(f"ps -eo args --no-headers | grep -c '^sleep {marker}'")
        assert processes_mentioning(f"sleep\0{marker}"), "daemon should run while the sandbox lives"
        return r, seen

    r, seen = run(guard.sandbox(body))
    assert r.stdout.strip() == "launched" and seen.stdout.strip() == "1"
    assert processes_mentioning(f"sleep\0{marker}") == []


def test_symlink_escape_through_download_dir(guard, tmp_path):
    dest = tmp_path / "download"
    outside_before = sorted(p.name for p in tmp_path.iterdir())

    async def body(env):
        await env.exec(
            "mkdir -p /app/out/sub && echo ok > /app/out/ok.txt && ln -s /etc/shadow /app/out/abs && "
            "ln -s ../../../../../../etc/passwd /app/out/rel && ln -s / /app/out/root && "
            "ln -s ../ok.txt /app/out/sub/inside && echo x > /app/out/sub/x"
        )
        await env.download_dir("/app/out", dest)
        await env.download_file("/app/out/abs", tmp_path / "abs-file")
        return (tmp_path / "abs-file").read_text()

    shadow = run(guard.sandbox(body))
    assert (dest / "ok.txt").read_text() == "ok\n" and (dest / "sub" / "x").read_text() == "x\n"
    assert (dest / "sub" / "inside").resolve() == (dest / "ok.txt").resolve()  # links inside are kept
    for name in ("abs", "rel", "root"):
        assert not (dest / name).exists() and not (dest / name).is_symlink(), f"{name} escaped"
    from reterm.sandbox.base_image import find_base

    assert shadow == (find_base().rootfs / "etc/shadow").read_text()  # the sandbox's, not the host's
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([*outside_before, "download", "abs-file"])


def test_upload_with_dotdot_stays_in_sandbox(guard, tmp_path):
    src = tmp_path / "payload"
    src.write_text("payload")

    async def body(env):
        await env.upload_file(src, "/app/../../../../etc/reterm-evil")
        return await env.exec("cat /etc/reterm-evil")

    r = run(guard.sandbox(body))
    assert r.stdout == "payload"
    assert not Path("/etc/reterm-evil").exists()


def test_mount_unshare_and_nsenter_attempts_fail(guard):
    cmds = ["mount -t tmpfs x /mnt", "mount --bind / /mnt", "unshare -m true", "unshare -U -r true",
            "nsenter -t 1 -m true", "umount /proc", "mount -o remount,rw /sys",
            "mount -t proc proc /mnt", "pivot_root / /mnt"]  # fmt: skip

    async def body(env):
        return [await env.exec(c + " 2>&1") for c in cmds]

    results = run(guard.sandbox(body))
    for c, r in zip(cmds, results, strict=True):
        assert r.return_code != 0, f"{c!r} succeeded inside the sandbox: {r.stdout}"


def test_kill_minus_one_spares_host_and_sandbox_init(guard):
    host_proc = subprocess.Popen(["sleep", "300"])
    try:

        async def body(env):
            r = await env.exec("kill -9 -1; echo after", timeout_sec=10)
            again = await env.exec("echo still-alive")
            return r, again

        r, again = run(guard.sandbox(body))
        assert host_proc.poll() is None, "kill -9 -1 in the sandbox killed a host process"
        assert again.stdout == "still-alive\n"
    finally:
        host_proc.kill()
        host_proc.wait()


def test_disk_fill_of_writable_layer_stops_at_its_size(guard):
    async def body(env):
        r = await env.exec("dd if=/dev/zero of=/big bs=1M count=200 2>&1; stat -c %s /big", timeout_sec=60)
        ok = await env.exec("rm /big && echo freed")
        return r, ok

    r, ok = run(guard.sandbox(body, storage_mb=32))
    assert "No space left on device" in r.stdout
    assert int(r.stdout.split()[-1]) <= 32 * 2**20
    assert ok.stdout == "freed\n"


def test_sysctls_devices_and_cgroups_are_read_only(guard):
    cmds = ["echo 1 > /proc/sys/vm/drop_caches", "echo '|/bin/evil' > /proc/sys/kernel/core_pattern",
            "mknod /tmp/disk b 8 0", "echo 1 > /sys/kernel/mm/ksm/run",
            "echo 1 > /sys/fs/cgroup/pids/pids.max", "ls /dev/vda /dev/sda /dev/mem",
            "echo $$ > /sys/fs/cgroup/memory/cgroup.procs"]  # fmt: skip

    async def body(env):
        return [await env.exec(c + " 2>&1") for c in cmds]

    results = run(guard.sandbox(body))
    for c, r in zip(cmds, results, strict=True):
        assert r.return_code != 0, f"{c!r} succeeded inside the sandbox"


def test_no_new_privileges_and_no_admin_capability(guard):
    async def body(env):
        await env.exec("cp /bin/bash /tmp/rootbash && chmod 4755 /tmp/rootbash && useradd -m mallory")
        status = await env.exec("grep -E 'NoNewPrivs|CapEff' /proc/self/status")
        escalate = await env.exec("/tmp/rootbash -p -c id -u", user="mallory")
        return status, escalate

    status, escalate = run(guard.sandbox(body))
    fields = dict(line.split(":\t") for line in status.stdout.strip().splitlines())
    assert fields["NoNewPrivs"] == "1"
    cap_eff = int(fields["CapEff"], 16)
    assert not cap_eff & (1 << 21), "CAP_SYS_ADMIN is effective"
    assert not cap_eff & (1 << 27), "CAP_MKNOD is effective"
    assert escalate.stdout.strip() != "0", "a setuid binary gave root to a user"


def test_host_processes_are_invisible(guard):
    r = run(guard.sandbox(lambda env: env.exec("ps -eo pid,args --no-headers")))
    pids = [int(line.split()[0]) for line in r.stdout.strip().splitlines()]
    assert max(pids) < 100 and 1 in pids
    assert "pytest" not in r.stdout and "python" not in r.stdout.replace("python3 ", "")
