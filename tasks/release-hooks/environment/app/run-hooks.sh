#!/bin/bash
# Run every executable file in /app/hooks.d in name order; stop at the first failing hook.
mkdir -p /app/state
: > /app/state/hooks.log
for hook in /app/hooks.d/*; do
  if [ -x "$hook" ]; then
    "$hook" || { echo "hook failed: $hook" >&2; exit 1; }
  else
    echo "skipping (not executable): $hook" >&2
  fi
done
echo "all hooks done"
