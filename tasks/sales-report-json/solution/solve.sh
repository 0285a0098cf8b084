#!/bin/bash
# Later files override earlier rows of the same order; normalise status and region; Decimal for sums.
cd /app
cat > /app/make_report.py <<'PY'
import csv
import glob
import json
from decimal import Decimal

latest = {}
for path in sorted(glob.glob("/data/sales/2024-*.csv")):
    with open(path, newline="") as fh:
        for row in csv.DictReader(fh):
            latest[row["order_id"]] = row
total, by_region, orders = Decimal(0), {}, 0
for row in latest.values():
    if row["status"].strip().lower() != "paid":
        continue
    region = row["region"].strip().lower()
    amount = Decimal(row["amount"])
    orders += 1
    total += amount
    by_region[region] = by_region.get(region, Decimal(0)) + amount
report = {"orders": orders, "total": float(round(total, 2)),
          "by_region": {r: float(round(v, 2)) for r, v in sorted(by_region.items())}}
with open("/app/report.json", "w") as fh:
    json.dump(report, fh, indent=2)
print(json.dumps(report))
PY
python3 /app/make_report.py
