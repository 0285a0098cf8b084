#!/usr/bin/env bash
# The test command (README): sets up the environment if missing, then runs the whole suite,
# slow end-to-end tests included. Extra arguments go to pytest (e.g. `-m "not slow"`, `-k sandbox`).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# torch threads spin while waiting for a core by default; next to sandboxes that costs up to 5x (bench/policies.py)
export OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-PASSIVE}"
exec .venv/bin/python -m pytest tests "$@"
