"""Build step: /var/lib/shop/shop.db in WAL mode whose last commits are only in shop.db-wal (the
service was stopped without a checkpoint), and a stale nightly copy /srv/backup/shop.db made by `cp`."""
import os
import random
import shutil
import sqlite3

rng = random.Random(2024)
os.makedirs("/var/lib/shop", exist_ok=True)
os.makedirs("/srv/backup", exist_ok=True)
db = sqlite3.connect("/var/lib/shop/shop.db")
db.execute("PRAGMA journal_mode=WAL")
db.execute("PRAGMA wal_autocheckpoint=0")
db.execute("CREATE TABLE orders (id INTEGER PRIMARY KEY, customer TEXT NOT NULL, amount REAL NOT NULL,"
           " status TEXT NOT NULL)")
db.executemany("INSERT INTO orders VALUES (?, ?, ?, ?)",
               [(i, f"c{rng.randint(1, 200):03d}", rng.randint(100, 99999) / 100, "paid") for i in range(1, 1001)])
db.commit()
db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
shutil.copy("/var/lib/shop/shop.db", "/srv/backup/shop.db")  # last night's copy
db.executemany("INSERT INTO orders VALUES (?, ?, ?, ?)",
               [(i, f"c{rng.randint(1, 200):03d}", rng.randint(100, 99999) / 100, "open") for i in range(1001, 1241)])
db.execute("UPDATE orders SET status = 'refunded' WHERE id % 97 = 0")
db.execute("DELETE FROM orders WHERE id % 250 = 0")
db.commit()
os._exit(0)  # leave the WAL as a stopped service would: not checkpointed
