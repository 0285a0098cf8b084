"""Outcome checks: the unchanged runner runs all four hooks, each logging its line, in order."""
import hashlib
import subprocess

RUNNER_SHA = "b8a7720204c41d3f22ed8999c9e3922759c6742fdc9a5084bf3e2539ef3784e5"


def test_runner_unchanged():
    with open("/app/run-hooks.sh", "rb") as fh:
        assert hashlib.sha256(fh.read()).hexdigest() == RUNNER_SHA


def test_all_hooks_run():
    out = subprocess.run(["/app/run-hooks.sh"], capture_output=True, text=True, cwd="/", timeout=60)
    assert out.returncode == 0, out.stderr
    assert "skipping" not in out.stderr
    with open("/app/state/hooks.log") as fh:
        assert fh.read() == ("10 version checked: 2.4.1\n20 migrations applied: 3\n"
                             "30 cache warmed: 10 entries\n40 notified: release 2.4.1 ready\n")
