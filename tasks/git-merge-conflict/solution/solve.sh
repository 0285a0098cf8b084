#!/bin/bash
# Both files conflict: keep main's rounding and the feature's discount (rounded last), and both tests.
cd /app/shop
git status
git --no-pager diff
cat > pricing.py <<'PY'
"""Order pricing."""

from decimal import ROUND_HALF_UP, Decimal

BULK_QTY = 10
BULK_RATE = 0.1


def _money(x):
    return float(Decimal(str(x)).quantize(Decimal("0.01"), rounding=ROUND_HALF_UP))


def line_total(unit_price, qty):
    total = unit_price * qty
    if qty >= BULK_QTY:
        total *= 1 - BULK_RATE
    return _money(total)


def order_total(lines):
    """lines: list of (unit_price, qty)."""
    return _money(sum(line_total(p, q) for p, q in lines))
PY
git --no-pager diff --name-only --diff-filter=U
cat > tests/test_pricing.py <<'PY'
import sys, os
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from pricing import line_total, order_total


def test_line_total():
    assert line_total(2.5, 4) == 10.0


def test_order_total():
    assert order_total([(1.0, 2), (0.5, 1)]) == 2.5


def test_rounding():
    assert line_total(0.1, 3) == 0.3
    assert order_total([(0.125, 1)]) == 0.13


def test_bulk_discount():
    assert line_total(1.0, 10) == 9.0
PY
python3 -m pytest -q tests
git add pricing.py tests/test_pricing.py
git commit --no-edit
git --no-pager log --oneline --graph -5
