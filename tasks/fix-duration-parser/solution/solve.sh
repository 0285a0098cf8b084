#!/bin/bash
# Rewrite core.py: anchored tokenizer (ms before m), decimals, case-insensitive units, duplicate units,
# explicit errors for empty text, and format_duration's zero/negative cases.
cd /app
python3 -m pytest -q tests
cat > /app/durations/core.py <<'PY'
import re

UNITS = {"d": 86400, "h": 3600, "m": 60, "s": 1, "ms": 0.001}
_PART = re.compile(r"\s*(\d+(?:\.\d+)?)(ms|d|h|m|s)", re.IGNORECASE)


def parse_duration(text):
    """Return the duration in seconds (float); raise ValueError on malformed text (see README)."""
    text = text.strip()
    sign = 1
    if text.startswith("-"):
        sign = -1
        text = text[1:]
    if not text:
        raise ValueError("invalid duration: empty")
    total, pos, seen = 0.0, 0, set()
    while pos < len(text):
        match = _PART.match(text, pos)
        if not match:
            raise ValueError(f"invalid duration: {text!r}")
        number, unit = match.group(1), match.group(2).lower()
        if unit in seen:
            raise ValueError(f"invalid duration: unit {unit!r} repeated")
        seen.add(unit)
        total += float(number) * UNITS[unit]
        pos = match.end()
    return sign * total


def format_duration(seconds):
    """Format whole seconds as e.g. '1d2h3m4s' ('0s' for zero, leading '-' when negative)."""
    seconds = int(seconds)
    if seconds == 0:
        return "0s"
    sign = "-" if seconds < 0 else ""
    seconds = abs(seconds)
    parts = []
    for unit in ("d", "h", "m", "s"):
        size = UNITS[unit]
        if seconds >= size:
            parts.append(f"{seconds // size}{unit}")
            seconds %= size
    return sign + "".join(parts)
PY
python3 -m pytest -q tests
