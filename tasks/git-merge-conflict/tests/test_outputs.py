"""Outcome checks: a two-parent merge commit on main, clean tree, both behaviours, both branches' tests."""
import os
import subprocess
import sys

REPO = "/app/shop"


def git(*args):
    out = subprocess.run(["git", "-C", REPO, *args], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def test_merge_committed():
    assert git("rev-parse", "--abbrev-ref", "HEAD") == "main"
    assert not os.path.exists(os.path.join(REPO, ".git/MERGE_HEAD"))
    parents = git("log", "-1", "--format=%P").split()
    assert len(parents) == 2
    assert git("rev-parse", "feature/bulk-discount") in parents
    assert git("log", "-1", "--format=%s", "main~1") == "round money to cents (half up)"
    assert git("status", "--porcelain") == ""


def test_no_conflict_markers():
    for name in git("ls-files").splitlines():
        with open(os.path.join(REPO, name), errors="replace") as fh:
            text = fh.read()
        assert "<<<<<<<" not in text and ">>>>>>>" not in text, name


def test_behaviour():
    code = git("show", "HEAD:pricing.py")
    ns = {}
    exec(compile(code, "pricing.py", "exec"), ns)
    lt, ot = ns["line_total"], ns["order_total"]
    assert lt(1.0, 10) == 9.0
    assert lt(0.33, 10) == 2.97
    assert lt(0.1, 3) == 0.3
    assert lt(0.105, 9) == 0.95
    assert ot([(0.125, 1)]) == 0.13
    assert ot([(1.0, 10), (0.1, 3)]) == 9.3


def test_both_branches_tests_pass():
    tests = git("show", "HEAD:tests/test_pricing.py")
    assert "test_bulk_discount" in tests and "test_rounding" in tests
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests"],
                         cwd=REPO, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout[-2000:]
