"""Outcome checks: both reports equal what is computed independently from all four log files."""
import collections
import datetime
import gzip
import re

LINE = re.compile(r'^(\S+) \S+ \S+ \[([^\]]+)\] "[^"]*" (\d{3}) ')


def records():
    for name in ("access.log.3.gz", "access.log.2.gz", "access.log.1", "access.log"):
        path = f"/var/log/nginx/{name}"
        opener = gzip.open if name.endswith(".gz") else open
        with opener(path, "rt") as fh:
            for line in fh:
                m = LINE.match(line)
                assert m, line
                yield m.group(1), datetime.datetime.strptime(m.group(2), "%d/%b/%Y:%H:%M:%S %z"), m.group(3)


def test_top_ips():
    counts = collections.Counter(ip for ip, _, _ in records())
    want = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:5]
    with open("/app/top-ips.txt") as fh:
        got = [line.split() for line in fh.read().splitlines() if line.strip()]
    assert got == [[str(n), ip] for ip, n in want]


def test_errors_by_hour():
    counts = collections.Counter(t.strftime("%Y-%m-%d %H") for _, t, s in records() if s.startswith("5"))
    want = [f"{h} {n}" for h, n in sorted(counts.items())]
    with open("/app/errors-by-hour.txt") as fh:
        got = [line.strip() for line in fh.read().splitlines() if line.strip()]
    assert got == want
