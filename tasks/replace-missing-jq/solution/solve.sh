#!/bin/bash
# python3 is available: do the JSON filtering there, keep the output format and byte-order sort.
cd /app
cat > /app/scripts/summary.sh <<'SCRIPT'
#!/bin/bash
# Print the enabled services of a services JSON file as "name<TAB>port", sorted by name.
# usage: summary.sh services.json
set -euo pipefail
python3 - "$1" <<'PY' | LC_ALL=C sort
import json, sys
with open(sys.argv[1]) as fh:
    data = json.load(fh)
for svc in data["services"]:
    if svc.get("enabled") is True:
        print(f"{svc['name']}\t{svc['port']}")
PY
SCRIPT
chmod +x /app/scripts/summary.sh
/app/scripts/summary.sh /app/services.json
