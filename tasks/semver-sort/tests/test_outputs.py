"""Outcome checks: SemVer 2.0.0 validation and precedence order, stability, --reverse, stderr."""
import random
import subprocess


def run(lines, *args):
    out = subprocess.run(["python3", "/app/semver_sort.py", *args], input="".join(l + "\n" for l in lines),
                         capture_output=True, text=True, timeout=20, cwd="/tmp")
    assert out.returncode == 0, out.stderr
    return out.stdout.splitlines(), out.stderr.splitlines()


ORDERED = ["0.0.1", "0.9.0", "1.0.0-0.3.7", "1.0.0-alpha", "1.0.0-alpha.1", "1.0.0-alpha.beta", "1.0.0-beta",
           "1.0.0-beta.2", "1.0.0-beta.11", "1.0.0-rc.1", "1.0.0-x-y-z.--", "1.0.0", "1.0.1", "1.2.0",
           "1.9.9", "1.10.0", "1.10.1-a", "2.0.0-rc.1+build.1", "2.0.0", "10.0.0"]


def test_precedence_order():
    shuffled = ORDERED[:]
    random.Random(3).shuffle(shuffled)
    out, err = run(shuffled)
    assert out == ORDERED
    assert err == []


def test_build_metadata_ignored_and_stable():
    out, _ = run(["1.0.0+b", "1.0.0-rc.1", "1.0.0", "1.0.0+a", "0.1.0"])
    assert out == ["0.1.0", "1.0.0-rc.1", "1.0.0+b", "1.0.0", "1.0.0+a"]


def test_reverse_is_stable():
    out, _ = run(["1.0.0+b", "1.0.0-rc.1", "1.0.0", "2.0.0", "1.0.0+a"], "--reverse")
    assert out == ["2.0.0", "1.0.0+b", "1.0.0", "1.0.0+a", "1.0.0-rc.1"]


def test_invalid_lines():
    bad = ["v1.0.0", "1.0", "01.2.3", "1.02.3", "1.0.0-01", "1.0.0-alpha..1", "1.0.0-", "1.0.0+", "a.b.c",
           "1.0.0-alpha_beta", "1.0.0+build..1", "1.0.0.0"]
    out, err = run(["  1.0.0  ", "", *bad, "1.0.0-0a"])
    assert out == ["1.0.0-0a", "1.0.0"]
    assert err == [f"invalid: {b}" for b in bad]
