#!/bin/bash
# No index is reachable: point pip at the local wheel folder and install into a fresh venv.
cd /app
python3 -m venv /app/.venv
/app/.venv/bin/pip install --no-index --find-links /opt/wheels -r /app/requirements.txt
/app/.venv/bin/python /app/render.py /app/data/inventory.csv
