"""Outcome checks: the project's own tests pass (unchanged) and the README's behaviour holds."""
import hashlib
import subprocess
import sys

import pytest

sys.path.insert(0, "/app")
from durations import format_duration, parse_duration  # noqa: E402

TESTS_SHA = "660ee93cc81ed9838d04e7a3fb3749fbb4943455b28b996fa20e121bdaf1db27"


def test_project_tests_unchanged_and_pass():
    with open("/app/tests/test_durations.py", "rb") as fh:
        assert hashlib.sha256(fh.read()).hexdigest() == TESTS_SHA
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests"],
                         cwd="/app", capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout[-2000:]


@pytest.mark.parametrize("text,seconds", [
    ("1d", 86400.0), ("3m", 180.0), ("1m30s", 90.0), ("30s1m", 90.0), ("1500ms", 1.5), ("1s500ms", 1.5),
    ("2.25h", 8100.0), ("1D 2H 3M 4S", 93784.0), ("-1h30m", -5400.0), ("  45s", 45.0), ("0s", 0.0),
    ("1MS", 0.001), ("10m5ms", 600.005),
])
def test_parse_more(text, seconds):
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["   ", "-", ".5s", "1.h", "5 ", "m5", "1h 2x", "1m1m", "1ms2ms", "1hh",
                                  "1h-2m", "one hour", "1w"])
def test_parse_invalid_more(text):
    with pytest.raises(ValueError):
        parse_duration(text)


@pytest.mark.parametrize("seconds,text", [(59, "59s"), (60, "1m"), (3600, "1h"), (86401, "1d1s"),
                                          (-90, "-1m30s"), (0, "0s"), (7322, "2h2m2s")])
def test_format_more(seconds, text):
    assert format_duration(seconds) == text
