#!/bin/bash
# Build step: /app/repo with main (3 commits) and develop (3 more commits: feature, fix, feature).
set -euo pipefail
export GIT_AUTHOR_NAME="Dana Dev" GIT_AUTHOR_EMAIL="dana@example.com"
export GIT_COMMITTER_NAME="Dana Dev" GIT_COMMITTER_EMAIL="dana@example.com"
n=0
commit() { n=$((n+1)); export GIT_AUTHOR_DATE="2024-03-0${n}T10:00:00Z" GIT_COMMITTER_DATE="2024-03-0${n}T10:00:00Z"; git add -A; git commit -q -m "$1"; }
mkdir -p /app/repo && cd /app/repo
git init -q -b main
cat > parse.py <<'PY'
"""Parse 'key=value' lines."""


def parse_line(line):
    key, value = line.split("=", 1)
    return key.strip(), value.strip()
PY
echo "# config parser" > README.md
commit "initial parser"
cat >> parse.py <<'PY'


def parse_text(text):
    return dict(parse_line(l) for l in text.splitlines() if l.strip())
PY
commit "add parse_text"
echo "Usage: parse_text(text) -> dict" >> README.md
commit "docs: usage"
git checkout -q -b develop
printf 'import csv\n\n\ndef export_csv(d, fh):\n    csv.writer(fh).writerows(sorted(d.items()))\n' > export.py
commit "feat: add csv export"
python3 - <<'PY'
p = open("parse.py").read()
p = p.replace('def parse_line(line):\n    key', 'def parse_line(line):\n    if not line.strip():\n        return None\n    key')
open("parse.py", "w").write(p)
PY
commit "fix: handle empty input in parse_line"
printf 'def to_yaml(d):\n    return "".join(f"{k}: {v}\\n" for k, v in d.items())\n' > yaml_out.py
commit "feat: experimental yaml output"
git checkout -q main
