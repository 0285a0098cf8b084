"""Outcome checks: the backup is a single rollback-journal file equal to the live data (db + WAL)."""
import os
import random
import shutil
import sqlite3


def expected_rows():
    rng = random.Random(2024)
    rows = {i: (i, f"c{rng.randint(1, 200):03d}", rng.randint(100, 99999) / 100, "paid") for i in range(1, 1001)}
    rows.update({i: (i, f"c{rng.randint(1, 200):03d}", rng.randint(100, 99999) / 100, "open")
                 for i in range(1001, 1241)})
    for i in list(rows):
        if i % 97 == 0:
            rows[i] = rows[i][:3] + ("refunded",)
        if i % 250 == 0:
            del rows[i]
    return [rows[i] for i in sorted(rows)]


def read_copy(paths, tmp_path):
    for p in paths:
        if os.path.exists(p):
            shutil.copy(p, tmp_path / os.path.basename(p))
    db = sqlite3.connect(tmp_path / os.path.basename(paths[0]))
    return db.execute("SELECT id, customer, amount, status FROM orders ORDER BY id").fetchall()


def test_backup_is_single_rollback_journal_file():
    assert not os.path.exists("/srv/backup/shop.db-wal")
    assert not os.path.exists("/srv/backup/shop.db-shm")
    with open("/srv/backup/shop.db", "rb") as fh:
        header = fh.read(100)
    assert header.startswith(b"SQLite format 3\x00")
    assert (header[18], header[19]) == (1, 1), "backup is still in WAL mode"


def test_backup_complete(tmp_path):
    assert read_copy(["/srv/backup/shop.db"], tmp_path) == expected_rows()


def test_live_database_intact(tmp_path):
    got = read_copy(["/var/lib/shop/shop.db", "/var/lib/shop/shop.db-wal"], tmp_path)
    assert got == expected_rows()
