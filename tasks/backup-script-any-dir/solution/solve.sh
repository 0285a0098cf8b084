#!/bin/bash
# Resolve the application folder from the script's own location and run from there.
cd /
/app/bin/backup.sh
sed -i 's|^source config/backup.conf$|cd "$(dirname "$(readlink -f "$0")")/.."\nsource config/backup.conf|' /app/bin/backup.sh
cat /app/bin/backup.sh
/app/bin/backup.sh
tar -tzf "$(ls -t /app/backups/*.tar.gz | head -1)"
