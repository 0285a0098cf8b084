"""Nightly job: reads /etc/myapp/settings.ini, logs to /var/log/myapp/job.log, writes
/var/lib/myapp/result.json. Must run as the user svc (refuses to run as root)."""
import configparser
import datetime
import json
import os
import sys

if os.geteuid() == 0:
    sys.exit("job.py: refusing to run as root; run it as svc (runuser -u svc -- python3 /app/job.py)")
cfg = configparser.ConfigParser()
if not cfg.read("/etc/myapp/settings.ini"):
    sys.exit("job.py: cannot read /etc/myapp/settings.ini")
batch = cfg.getint("job", "batch")
with open("/var/log/myapp/job.log", "a") as log:
    log.write(f"{datetime.datetime.now().isoformat()} start batch={batch}\n")
    result = {"region": cfg.get("job", "region"), "batch": batch, "processed": batch * 4, "status": "ok"}
    tmp = "/var/lib/myapp/.result.json.tmp"
    with open(tmp, "w") as fh:
        json.dump(result, fh)
    os.replace(tmp, "/var/lib/myapp/result.json")
    log.write(f"{datetime.datetime.now().isoformat()} done\n")
print("job done")
