#!/bin/bash
# Mutable default arguments: every Cart() shares one items list and the module-level discounts dict.
cd /app
python3 -m pytest -q tests
python3 - <<'PY'
import re
p = "/app/shop/cart.py"
s = open(p).read()
s = s.replace(
    "    def __init__(self, items=[], discounts=DEFAULT_DISCOUNTS):\n"
    "        self.items = items\n"
    "        self.discounts = discounts\n",
    "    def __init__(self, items=None, discounts=None):\n"
    "        self.items = list(items) if items is not None else []\n"
    "        self.discounts = dict(DEFAULT_DISCOUNTS if discounts is None else discounts)\n")
open(p, "w").write(s)
PY
python3 -m pytest -q tests
