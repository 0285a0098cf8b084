import re

UNITS = {"d": 86400, "h": 3600, "m": 60, "s": 1, "ms": 0.001}
_PART = re.compile(r"(\d+)(d|h|m|s|ms)")


def parse_duration(text):
    text = text.strip()
    sign = 1
    if text.startswith("-"):
        sign = -1
        text = text[1:]
    total = 0.0
    pos = 0
    for match in _PART.finditer(text):
        number, unit = match.groups()
        total += float(number) * UNITS[unit]
        pos = match.end()
    if pos != len(text):
        raise ValueError(f"invalid duration: {text!r}")
    return sign * total


def format_duration(seconds):
    seconds = int(seconds)
    parts = []
    for unit in ("d", "h", "m", "s"):
        size = UNITS[unit]
        if seconds >= size:
            parts.append(f"{seconds // size}{unit}")
            seconds %= size
    return "".join(parts)
