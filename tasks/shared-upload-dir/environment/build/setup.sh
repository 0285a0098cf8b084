#!/bin/bash
# Build step: users www and deploy, group web (www only), /srv/uploads owned by root with a few files.
set -euo pipefail
groupadd --gid 2000 web
useradd --uid 1101 --create-home --groups web www
useradd --uid 1102 --create-home deploy
mkdir -p /srv/uploads/2024
for f in logo.png 2024/report.pdf 2024/photo.jpg; do echo "data of $f" > /srv/uploads/$f; done
chown -R root:root /srv/uploads
chmod -R u=rwX,go=rX /srv/uploads
chmod 600 /srv/uploads/2024/photo.jpg
