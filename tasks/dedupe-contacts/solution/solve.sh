#!/bin/bash
cd /app
python3 - <<'PY'
import csv

best = {}
with open("/data/contacts.csv", newline="") as fh:
    reader = csv.DictReader(fh)
    fields = reader.fieldnames
    for row in reader:
        email = row["email"].strip().lower()
        if not email:
            continue
        if email not in best or row["updated_at"] > best[email]["updated_at"]:
            best[email] = dict(row, email=email)
with open("/app/contacts.csv", "w", newline="") as fh:
    w = csv.DictWriter(fh, fieldnames=fields)
    w.writeheader()
    for email in sorted(best):
        w.writerow(best[email])
PY
head -5 /app/contacts.csv
