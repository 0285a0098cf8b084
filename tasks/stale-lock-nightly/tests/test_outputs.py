"""Outcome checks: summary up to date, script unchanged, no lock left, and a new run succeeds."""
import hashlib
import os
import subprocess

SCRIPT_SHA = "0134ddbd2027d111fbf3debae7c088a09d81e4b69d4ad752c2119e3f3a822b65"
WANT = "region,orders\napac,1\neu,3\nus,3\n"


def test_script_unchanged():
    with open("/app/nightly.sh", "rb") as fh:
        assert hashlib.sha256(fh.read()).hexdigest() == SCRIPT_SHA


def test_summary_up_to_date():
    with open("/app/out/summary.csv") as fh:
        assert fh.read() == WANT


def test_not_blocked_any_more():
    assert not os.path.exists("/var/lock/nightly.lock")
    out = subprocess.run(["/app/nightly.sh"], capture_output=True, text=True, timeout=60, cwd="/")
    assert out.returncode == 0, out.stderr
    with open("/app/out/summary.csv") as fh:
        assert fh.read() == WANT
