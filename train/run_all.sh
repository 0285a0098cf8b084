#!/usr/bin/env bash
# Placeholder until the stages exist: sets up the environment.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
