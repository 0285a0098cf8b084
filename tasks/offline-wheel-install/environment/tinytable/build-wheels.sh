#!/bin/bash
# Build step: make the offline wheel mirror /opt/wheels with tinytable 1.1.0 and 1.2.0.
# 1.1.0's render() has no `align` argument (the project needs 1.2.0).
set -euo pipefail
src=$(dirname "$0")
mkdir -p /opt/wheels
for v in 1.1.0 1.2.0; do
  work=$(mktemp -d)
  cp -r "$src/pyproject.toml" "$src/tinytable" "$work/"
  sed -i "s/@VERSION@/$v/" "$work/pyproject.toml" "$work/tinytable/__init__.py"
  if [ "$v" = 1.1.0 ]; then
    sed -i 's/def render(rows, header=None, align=None):/def render(rows, header=None):/; s/    align = align or/    align =/' "$work/tinytable/__init__.py"
  fi
  python3 -m pip wheel -q --no-deps --no-build-isolation --no-index -w /opt/wheels "$work" >/dev/null 2>&1
  rm -rf "$work"
done
ls /opt/wheels/tinytable-1.1.0-py3-none-any.whl /opt/wheels/tinytable-1.2.0-py3-none-any.whl >/dev/null
