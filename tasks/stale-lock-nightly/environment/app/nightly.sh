#!/bin/bash
# Nightly aggregation: count orders per region from /app/in/*.csv into /app/out/summary.csv.
# Only one run at a time: the lock file holds the pid of the running instance.
set -euo pipefail
LOCK=/var/lock/nightly.lock
if [ -e "$LOCK" ]; then
  echo "nightly: another run is in progress (lock $LOCK held by pid $(cat "$LOCK")); giving up" >&2
  exit 1
fi
echo $$ > "$LOCK"
trap 'rm -f "$LOCK"' EXIT
mkdir -p /app/out
{
  echo "region,orders"
  tail -q -n +2 /app/in/*.csv | cut -d, -f2 | sort | uniq -c | awk '{print $2 "," $1}'
} > /app/out/summary.csv.tmp
mv /app/out/summary.csv.tmp /app/out/summary.csv
echo "nightly: done"
