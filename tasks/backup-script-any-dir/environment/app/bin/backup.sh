#!/bin/bash
# Archive the data and config folders into backups/backup-YYYYmmdd-HHMMSS.tar.gz
# (paths inside the archive: data/..., config/...).
set -euo pipefail
source config/backup.conf
mkdir -p "$DEST"
stamp=$(date +%Y%m%d-%H%M%S)
tar -czf "$DEST/backup-$stamp.tar.gz" $SOURCES
echo "backup written: $DEST/backup-$stamp.tar.gz"
