#!/bin/bash
# cherry-pick creates a commit, which needs an identity; none is configured on this machine.
cd /app/repo
git --no-pager log --oneline main..develop
git config user.name "ReTerm Oracle"
git config user.email "oracle@example.com"
git checkout main
git cherry-pick "$(git log --format=%H --grep='^fix: handle empty input in parse_line$' develop)"
git --no-pager log --oneline -5
