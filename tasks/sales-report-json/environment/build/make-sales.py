"""Build step: /data/sales/2024-01.csv .. 2024-03.csv (messy regions, statuses, re-exported orders)."""
import csv
import os
import random

rng = random.Random(314)
os.makedirs("/data/sales", exist_ok=True)
regions = ["North", "north", " North ", "NORTH", "South", "south ", "East", "east", "West"]
statuses = ["paid"] * 6 + ["refunded", "pending", "PAID", "Paid "]
order = 1000
carried = []
for month in ("01", "02", "03"):
    rows = []
    for _ in range(60):
        order += 1
        rows.append([f"A{order}", f"2024-{month}-{rng.randint(1, 28):02d}", rng.choice(regions),
                     f"{rng.randint(100, 500000) / 100:.2f}", rng.choice(statuses)])
    # orders re-exported in a later month with an updated status or amount
    for row in carried:
        new = list(row)
        new[4] = rng.choice(["paid", "refunded"])
        new[3] = f"{float(row[3]) + 10:.2f}"
        rows.append(new)
    carried = rng.sample(rows[:60], 5)
    rng.shuffle(rows)
    with open(f"/data/sales/2024-{month}.csv", "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["order_id", "date", "region", "amount", "status"])
        w.writerows(rows)
