#!/bin/bash
# Build step: /app/repo where main lost its last two commits through `git reset --hard HEAD~2`,
# followed by an unrelated checkout dance so the lost commit is not at HEAD@{1}.
set -euo pipefail
export GIT_AUTHOR_NAME="Sam Ops" GIT_AUTHOR_EMAIL="sam@example.com" GIT_COMMITTER_NAME="Sam Ops" GIT_COMMITTER_EMAIL="sam@example.com"
mkdir -p /app/repo && cd /app/repo
git init -q -b main
c() { export GIT_AUTHOR_DATE="$1" GIT_COMMITTER_DATE="$1"; git add -A; git commit -q -m "$2"; }
echo "v1" > VERSION; echo "# Service" > README.md; c 2024-05-01T10:00:00Z "initial import"
mkdir -p src; echo "print('hello')" > src/app.py; c 2024-05-02T10:00:00Z "add app entry point"
echo "v2" > VERSION; c 2024-05-03T10:00:00Z "bump version to v2"
mkdir -p docs; printf '# Design v2\n\nQueue-based workers, at-least-once delivery.\n' > docs/design.md; c 2024-05-04T10:00:00Z "docs: design notes for v2"
echo "print('hello, v2')" > src/app.py; c 2024-05-05T10:00:00Z "app: greet v2"
git reset -q --hard HEAD~2
git checkout -q -b tmp-experiment
echo "scratch" > scratch.txt; c 2024-05-06T10:00:00Z "wip scratch"
git checkout -q main
git branch -q -D tmp-experiment
