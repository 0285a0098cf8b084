#!/usr/bin/env bash
# The 9B recipe's GPU environment in .venv (a GPU machine; docs/REPRODUCING.md, "GPU install"), then the rest of
# scripts/setup.sh (Debian packages, the local sandbox's base image). The GPU set REPLACES requirements.txt's CPU set:
# vLLM pins torch 2.14.0 and transformers < 5.21 (requirements-gpu.txt says why), so .venv must be new or made by
# this script. Three pip steps, in this order:
#   1. requirements-gpu.txt         wheels: torch, transformers, vLLM, TRL, fla, harbor's requirements, ...
#   2. requirements-gpu-build.txt   --no-build-isolation: causal-conv1d and deepspeed build against step 1's torch
#   3. requirements-gpu-nodeps.txt  --no-deps: harbor (its fastapi>=0.162 conflicts with vLLM's fastapi<0.137)
# then this kit (editable, --no-deps). Re-running with the same files does nothing.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
VENV="${RETERM_VENV:-$ROOT/.venv}"
log() { printf '[setup_gpu] %s\n' "$*" >&2; }
GPU_STAMP="$VENV/.reterm-gpu-installed"
WANT_GPU=$(cat requirements-gpu.txt requirements-gpu-build.txt requirements-gpu-nodeps.txt pyproject.toml | sha256sum | cut -c1-16)
if [ -x "$VENV/bin/python" ] && [ ! -f "$GPU_STAMP" ]; then
  log "ERROR: $VENV exists with another package set (scripts/setup.sh's CPU set?); the GPU set replaces it:"
  log "       move it away (mv $VENV $VENV.cpu) and run this script again"
  exit 1
fi
if [ ! -x "$VENV/bin/python" ]; then
  PY=$(command -v python3.12 || true)
  if [ -z "$PY" ] && command -v pyenv >/dev/null 2>&1; then
    v=$(pyenv versions --bare 2>/dev/null | grep -E '^3\.12(\.[0-9]+)?$' | sort -V | tail -n1 || true)
    [ -n "$v" ] && PY="$(pyenv prefix "$v")/bin/python3.12"
  fi
  [ -n "$PY" ] || { log "ERROR: Python 3.12 is required (harbor needs it): install python3.12 or 'pyenv install 3.12'"; exit 1; }
  log "creating $VENV with $PY"
  "$PY" -m venv "$VENV"
fi
if [ "$(cat "$GPU_STAMP" 2>/dev/null)" != "$WANT_GPU" ]; then
  log "installing the GPU set into $VENV (torch and vLLM with their CUDA libraries: several GB)"
  "$VENV/bin/python" -m pip install -q --upgrade pip
  "$VENV/bin/python" -m pip install -r requirements-gpu.txt
  "$VENV/bin/python" -m pip install --no-build-isolation -r requirements-gpu-build.txt
  "$VENV/bin/python" -m pip install --no-deps -r requirements-gpu-nodeps.txt
  "$VENV/bin/python" -m pip install -q --no-deps -e .
  "$VENV/bin/python" -c 'import reterm, harbor, trl, vllm, fla, causal_conv1d, deepspeed' \
    || { log "ERROR: the GPU set does not import (above)"; exit 1; }
  echo "$WANT_GPU" > "$GPU_STAMP"
fi
# scripts/setup.sh installs requirements.txt unless its stamp says that is done: the GPU set stands in for it
cat requirements.txt pyproject.toml | sha256sum | cut -c1-16 > "$VENV/.reterm-installed"
exec bash scripts/setup.sh
