"""Build step: nginx access logs access.log, access.log.1, access.log.2.gz, access.log.3.gz (oldest)."""
import datetime
import gzip
import os
import random

rng = random.Random(99)
os.makedirs("/var/log/nginx", exist_ok=True)
ips = [f"192.168.{rng.randint(0, 9)}.{rng.randint(1, 254)}" for _ in range(40)]
weights = [rng.randint(1, 30) for _ in ips]
start = datetime.datetime(2024, 5, 10, 0, 0, 0)
lines = []
t = start
for i in range(4000):
    t += datetime.timedelta(seconds=rng.randint(1, 80))
    status = rng.choices([200, 304, 404, 500, 502, 503], [80, 8, 6, 2, 2, 1])[0]
    lines.append(f'{rng.choices(ips, weights)[0]} - - [{t.strftime("%d/%b/%Y:%H:%M:%S")} +0000] '
                 f'"GET /p/{rng.randint(1, 50)} HTTP/1.1" {status} {rng.randint(200, 5000)} "-" "Mozilla/5.0"\n')
chunks = [lines[:1000], lines[1000:2000], lines[2000:3100], lines[3100:]]  # oldest first
names = ["access.log.3.gz", "access.log.2.gz", "access.log.1", "access.log"]
for name, chunk in zip(names, chunks):
    path = f"/var/log/nginx/{name}"
    if name.endswith(".gz"):
        with gzip.open(path, "wt") as fh:
            fh.writelines(chunk)
    else:
        with open(path, "w") as fh:
            fh.writelines(chunk)
with open("/var/log/nginx/error.log", "w") as fh:
    fh.write("2024/05/10 03:00:00 [error] 12#12: upstream timed out\n")
