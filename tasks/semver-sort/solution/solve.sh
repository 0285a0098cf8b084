#!/bin/bash
# The official SemVer regex validates; a key tuple encodes precedence; stable sorts keep input order.
cd /app
cat > /app/semver_sort.py <<'PY'
"""Sort SemVer 2.0.0 versions read from stdin (precedence per semver.org section 11)."""
import argparse
import re
import sys

SEMVER = re.compile(
    r"^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)"
    r"(?:-((?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*)(?:\.(?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*))*))?"
    r"(?:\+([0-9a-zA-Z-]+(?:\.[0-9a-zA-Z-]+)*))?$"
)


def key(version):
    m = SEMVER.match(version)
    major, minor, patch, pre = int(m.group(1)), int(m.group(2)), int(m.group(3)), m.group(4)
    if pre is None:
        return (major, minor, patch, 1, ())
    ids = tuple((0, int(p), "") if p.isdigit() else (1, 0, p) for p in pre.split("."))
    return (major, minor, patch, 0, ids)


def main(argv=None):
    p = argparse.ArgumentParser(prog="semver_sort")
    p.add_argument("--reverse", action="store_true")
    a = p.parse_args(argv)
    valid = []
    for raw in sys.stdin:
        line = raw.strip()
        if not line:
            continue
        if SEMVER.match(line):
            valid.append(line)
        else:
            print(f"invalid: {line}", file=sys.stderr)
    # Python's sort is stable, also with reverse=True: equal versions keep their input order
    out = sorted(valid, key=key, reverse=a.reverse)
    sys.stdout.write("".join(v + "\n" for v in out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
PY
python3 /app/semver_sort.py < /app/versions.txt
