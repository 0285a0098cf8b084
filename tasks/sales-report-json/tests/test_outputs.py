"""Outcome checks: /app/report.json equals the report computed independently from the exports."""
import csv
import json
from decimal import Decimal


def expected():
    latest = {}
    for month in ("01", "02", "03"):
        with open(f"/data/sales/2024-{month}.csv", newline="") as fh:
            for row in csv.DictReader(fh):
                latest[row["order_id"]] = row
    paid = [r for r in latest.values() if r["status"].strip().lower() == "paid"]
    by_region = {}
    for r in paid:
        key = r["region"].strip().lower()
        by_region[key] = by_region.get(key, Decimal(0)) + Decimal(r["amount"])
    return {"orders": len(paid), "total": round(sum(Decimal(r["amount"]) for r in paid), 2),
            "by_region": {k: round(v, 2) for k, v in sorted(by_region.items())}}


def test_report():
    with open("/app/report.json") as fh:
        got = json.load(fh, parse_float=Decimal)
    want = expected()
    assert set(got) == {"orders", "total", "by_region"}
    assert got["orders"] == want["orders"]
    assert Decimal(str(got["total"])) == want["total"]
    assert list(got["by_region"]) == list(want["by_region"])
    for k, v in want["by_region"].items():
        assert Decimal(str(got["by_region"][k])) == v, k
