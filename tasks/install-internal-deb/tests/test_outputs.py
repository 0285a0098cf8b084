"""Outcome checks: logstat installed through dpkg, and the status summary written correctly."""
import collections
import re
import subprocess
from pathlib import Path


def _expected_summary() -> str:
    pat = re.compile(r'^\S+ \S+ \S+ \[[^\]]+\] "\S+ \S+ [^"]*" (\d{3}) ')
    counts = collections.Counter()
    for line in Path("/var/log/app/access.log").read_text().splitlines():
        m = pat.match(line)
        if m:
            counts[m.group(1)] += 1
    return "".join(f"{n} {k}\n" for k, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))


def test_package_installed_with_dpkg():
    out = subprocess.run(["dpkg-query", "-W", "-f=${Status} ${Version}", "logstat"],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "install ok installed 1.3.0"


def test_tool_on_path():
    out = subprocess.run(["logstat", "--by", "ip", "/var/log/app/access.log"], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr


def test_summary_file():
    path = Path("/app/status-summary.txt")
    assert path.is_file(), "missing /app/status-summary.txt"
    assert path.read_text() == _expected_summary()
