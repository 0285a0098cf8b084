"""Outcome checks: every CSV row in customers with correct types, schema kept, total written."""
import csv
import sqlite3
from decimal import Decimal
from pathlib import Path

SCHEMA = """CREATE TABLE customers (
    id INTEGER PRIMARY KEY,
    name TEXT NOT NULL,
    email TEXT UNIQUE,
    balance REAL NOT NULL DEFAULT 0
)"""


def _csv_rows():
    with open("/data/customers.csv", newline="") as fh:
        rows = list(csv.reader(fh))
    return rows[1:]


def test_schema_kept():
    db = sqlite3.connect("/app/shop.db")
    sql = db.execute("SELECT sql FROM sqlite_master WHERE name='customers'").fetchone()[0]
    assert sql == SCHEMA


def test_rows_loaded():
    db = sqlite3.connect("/app/shop.db")
    got = db.execute("SELECT id, name, email, balance, typeof(balance) FROM customers ORDER BY id").fetchall()
    want = _csv_rows()
    assert len(got) == len(want)
    for (gid, name, email, bal, kind), (wid, wname, wemail, wbal) in zip(got, want):
        assert (gid, name, email) == (int(wid), wname, wemail)
        assert kind == "real", (gid, kind)
        assert abs(bal - float(wbal)) < 1e-9


def test_total():
    want = sum(Decimal(r[3]) for r in _csv_rows())
    assert Path("/app/total.txt").read_text().strip() == f"{want:.2f}"
