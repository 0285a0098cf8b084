"""Render rows as a plain-text table."""

__version__ = "@VERSION@"


def render(rows, header=None, align=None):
    """Return rows (lists of values) as a text table; align is a string of 'l'/'r' per column."""
    rows = [[str(c) for c in r] for r in rows]
    if header:
        rows = [[str(h) for h in header]] + rows
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    align = align or "l" * len(widths)
    out = []
    for n, r in enumerate(rows):
        cells = [c.rjust(w) if a == "r" else c.ljust(w) for c, w, a in zip(r, widths, align)]
        out.append(" | ".join(cells).rstrip())
        if header and n == 0:
            out.append("-+-".join("-" * w for w in widths))
    return "\n".join(out)
