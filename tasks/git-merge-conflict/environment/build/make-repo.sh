#!/bin/bash
# Build step: /app/shop with main and feature/bulk-discount both changing pricing.py, and a merge
# left half-way (conflict in pricing.py).
set -euo pipefail
export GIT_AUTHOR_NAME="Lee Dev" GIT_AUTHOR_EMAIL="lee@example.com" GIT_COMMITTER_NAME="Lee Dev" GIT_COMMITTER_EMAIL="lee@example.com"
mkdir -p /app/shop/tests && cd /app/shop
git init -q -b main
git config user.name "Lee Dev"; git config user.email "lee@example.com"
cat > pricing.py <<'PY'
"""Order pricing."""


def line_total(unit_price, qty):
    return unit_price * qty


def order_total(lines):
    """lines: list of (unit_price, qty)."""
    return sum(line_total(p, q) for p, q in lines)
PY
cat > tests/test_pricing.py <<'PY'
import sys, os
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from pricing import line_total, order_total


def test_line_total():
    assert line_total(2.5, 4) == 10.0


def test_order_total():
    assert order_total([(1.0, 2), (0.5, 1)]) == 2.5
PY
printf "__pycache__/\n.pytest_cache/\n" > .gitignore
git add -A; git commit -q -m "pricing module"
git checkout -q -b feature/bulk-discount
cat > pricing.py <<'PY'
"""Order pricing."""

BULK_QTY = 10
BULK_RATE = 0.1


def line_total(unit_price, qty):
    total = unit_price * qty
    if qty >= BULK_QTY:
        total *= 1 - BULK_RATE
    return total


def order_total(lines):
    """lines: list of (unit_price, qty)."""
    return sum(line_total(p, q) for p, q in lines)
PY
cat >> tests/test_pricing.py <<'PY'


def test_bulk_discount():
    assert line_total(1.0, 10) == 9.0
PY
git commit -qam "bulk discount: 10% off lines of 10 or more"
git checkout -q main
cat > pricing.py <<'PY'
"""Order pricing."""

from decimal import ROUND_HALF_UP, Decimal


def _money(x):
    return float(Decimal(str(x)).quantize(Decimal("0.01"), rounding=ROUND_HALF_UP))


def line_total(unit_price, qty):
    return _money(unit_price * qty)


def order_total(lines):
    """lines: list of (unit_price, qty)."""
    return _money(sum(line_total(p, q) for p, q in lines))
PY
cat >> tests/test_pricing.py <<'PY'


def test_rounding():
    assert line_total(0.1, 3) == 0.3
    assert order_total([(0.125, 1)]) == 0.13
PY
git commit -qam "round money to cents (half up)"
git merge feature/bulk-discount >/dev/null 2>&1 || true
git status --short
