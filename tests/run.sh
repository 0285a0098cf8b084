#!/usr/bin/env bash
# The test command (README): sets up the environment if missing, then runs the whole suite,
# slow end-to-end tests included. Extra arguments go to pytest (e.g. `-m "not slow"`, `-k sandbox`).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/python -m pytest tests "$@"
