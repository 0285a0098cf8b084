"""Build step: /app/shop.db with an empty customers table, and /data/customers.csv (header + 400 rows)."""
import csv
import os
import random
import sqlite3

os.makedirs("/data", exist_ok=True)
db = sqlite3.connect("/app/shop.db")
db.executescript("""
CREATE TABLE customers (
    id INTEGER PRIMARY KEY,
    name TEXT NOT NULL,
    email TEXT UNIQUE,
    balance REAL NOT NULL DEFAULT 0
);
CREATE TABLE orders (id INTEGER PRIMARY KEY, customer_id INTEGER REFERENCES customers(id), total REAL);
""")
db.commit()
db.close()
rng = random.Random(7)
first = ["Ada", "Grace", "Alan", "Edsger", "Barbara", "Donald", "Frances", "Ken", "Margaret", "Linus"]
last = ["Lovelace", "Hopper", "Turing", "Dijkstra", "Liskov", "Knuth", "Allen", "Thompson", "Hamilton", "O'Neil"]
with open("/data/customers.csv", "w", newline="") as fh:
    w = csv.writer(fh)
    w.writerow(["id", "name", "email", "balance"])
    for i in range(1, 401):
        f, l = rng.choice(first), rng.choice(last)
        name = f"{l}, {f}" if i % 5 == 0 else f"{f} {l}"
        w.writerow([i, name, f"{f.lower()}.{i}@example.com", f"{rng.randint(0, 99999) / 100:.2f}"])
