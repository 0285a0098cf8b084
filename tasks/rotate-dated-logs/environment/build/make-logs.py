"""Build step: dated log files in /var/log/myapp (content derived from the name, see the tests)."""
import datetime
import os

root = "/var/log/myapp"
os.makedirs(f"{root}/archive", exist_ok=True)
day = datetime.date(2024, 2, 25)
while day <= datetime.date(2024, 3, 20):
    for kind in ("app", "error"):
        name = f"{kind}-{day.isoformat()}.log"
        with open(f"{root}/{name}", "w") as fh:
            fh.write("".join(f"{day} {kind} line {i}\n" for i in range(40)))
    day += datetime.timedelta(days=1)
for name in ("app-2023-12-31.log", "app-2024-01-15.log"):
    with open(f"{root}/archive/{name}", "w") as fh:
        fh.write(f"archived {name}\n")
with open(f"{root}/current.log", "w") as fh:
    fh.write("live log\n")
