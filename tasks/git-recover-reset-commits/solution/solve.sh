#!/bin/bash
# The reflog still knows the lost tip; main has not moved since, so a reset to it restores both commits.
cd /app/repo
git --no-pager reflog -n 10
lost=$(git rev-parse "$(git reflog --format='%H %gs' | awk '/commit: app: greet v2$/ {print $1; exit}')")
git --no-pager log --oneline -3 "$lost"
git reset --hard "$lost"
git --no-pager log --oneline
git status --short
