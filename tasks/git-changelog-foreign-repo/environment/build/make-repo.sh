#!/bin/bash
# Build step: /srv/repos/website (12 commits on main) owned by the user `web`.
set -euo pipefail
useradd --create-home --uid 1001 web
mkdir -p /srv/repos/website /app
cd /srv/repos/website
git init -q -b main
export GIT_AUTHOR_NAME="Web Team" GIT_AUTHOR_EMAIL="web@example.com" GIT_COMMITTER_NAME="Web Team" GIT_COMMITTER_EMAIL="web@example.com"
subjects=("initial site" "add about page" "fix typo in footer" "add contact form" "css: dark mode"
  "bump jquery to 3.7" "remove unused images" "add sitemap.xml" "contact: validate email" "perf: lazy-load images"
  "fix: broken link on about page" "release 2.3.0")
for i in "${!subjects[@]}"; do
  d=$(printf '2024-04-%02dT09:00:00Z' $((i + 1)))
  echo "change $i" >> site.txt
  git add site.txt
  GIT_AUTHOR_DATE=$d GIT_COMMITTER_DATE=$d git commit -q -m "${subjects[$i]}"
done
chown -R web:web /srv/repos/website
