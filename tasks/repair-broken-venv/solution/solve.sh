#!/bin/bash
# Recreate the venv on this machine's python3 (seeing the system pytest), then an editable install
# without build isolation (isolation would download setuptools).
cd /app
ls -l /app/.venv/bin/
rm -rf /app/.venv
python3 -m venv --system-site-packages /app/.venv
/app/.venv/bin/pip install --no-build-isolation --no-index --no-deps -e /app
/app/.venv/bin/python -m pytest -q /app/tests
