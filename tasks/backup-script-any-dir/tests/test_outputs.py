"""Outcome checks: the script runs from / and /tmp, writing archives with relative member paths to /app/backups."""
import glob
import os
import subprocess
import tarfile
import time


def _run_from(cwd):
    time.sleep(1.1)  # archive names have one-second resolution
    before = set(glob.glob("/app/backups/*.tar.gz"))
    out = subprocess.run(["/app/bin/backup.sh"], cwd=cwd, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    new = set(glob.glob("/app/backups/*.tar.gz")) - before
    assert len(new) == 1, new
    with tarfile.open(new.pop()) as tf:
        names = sorted(m.name.rstrip("/") for m in tf.getmembers() if m.isfile())
    return names


def test_runs_from_other_directories():
    want = ["config/backup.conf", "data/customers/1.json", "data/customers/2.json", "data/stats.txt"]
    assert _run_from("/") == want
    assert _run_from("/tmp") == want


def test_nothing_written_elsewhere():
    assert not os.path.exists("/backups")
    assert not os.path.exists("/tmp/backups")
