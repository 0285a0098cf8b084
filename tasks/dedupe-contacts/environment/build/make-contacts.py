"""Build step: /data/contacts.csv with duplicate people under differently written e-mail addresses."""
import csv
import os
import random

rng = random.Random(11)
os.makedirs("/data", exist_ok=True)
people = [("Ada", "Lovelace"), ("Grace", "Hopper"), ("Alan", "Turing"), ("Katherine", "Johnson"),
          ("Linus", "Torvalds"), ("Barbara", "Liskov"), ("Dennis", "Ritchie"), ("Radia", "Perlman"),
          ("Tim", "Berners-Lee"), ("Hedy", "Lamarr"), ("Frances", "Allen"), ("Ken", "Thompson")]
rows = []
for n, (first, last) in enumerate(people):
    email = f"{first.lower()}.{last.lower()}@example.org"
    for k in range(rng.randint(1, 4)):
        variant = rng.choice([email, email.upper(), f"  {email}", email.replace("@example.org", "@Example.ORG "),
                              email.title()])
        day = rng.randint(1, 28)
        month = rng.randint(1, 12)
        rows.append({"name": f"{first} {last}" if k % 2 == 0 else f"{last}, {first}",
                     "email": variant,
                     "phone": f"+1-555-{rng.randint(1000, 9999)}" if rng.random() < 0.8 else "",
                     "updated_at": f"2023-{month:02d}-{day:02d}T{rng.randint(0, 23):02d}:{rng.randint(0, 59):02d}:00"})
rows.append({"name": "No Mail", "email": "", "phone": "+1-555-0000", "updated_at": "2023-05-05T10:00:00"})
rows.append({"name": "Also No Mail", "email": "   ", "phone": "", "updated_at": "2023-06-05T10:00:00"})
rng.shuffle(rows)
with open("/data/contacts.csv", "w", newline="") as fh:
    w = csv.DictWriter(fh, fieldnames=["name", "email", "phone", "updated_at"])
    w.writeheader()
    w.writerows(rows)
