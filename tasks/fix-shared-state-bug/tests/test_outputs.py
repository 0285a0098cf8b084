"""Outcome checks: the suite passes (forward and reversed order), tests unchanged, carts independent."""
import hashlib
import subprocess
import sys

sys.path.insert(0, "/app")
from shop.cart import DEFAULT_DISCOUNTS, Cart  # noqa: E402

TESTS_SHA = "a5ef953a44018635a820c2a021806756a01b3e1fcc9a2ecc7ec9c85fb3defb0c"
IDS = ["test_single_item", "test_two_items", "test_staff_discount", "test_discount_cap", "test_member_only",
       "test_bad_quantity"]


def _pytest(ids):
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           *[f"tests/test_cart.py::{i}" for i in ids]],
                          cwd="/app", capture_output=True, text=True, timeout=60)


def test_suite_unchanged_and_passes_in_both_orders():
    with open("/app/tests/test_cart.py", "rb") as fh:
        assert hashlib.sha256(fh.read()).hexdigest() == TESTS_SHA
    for ids in (IDS, IDS[::-1]):
        out = _pytest(ids)
        assert out.returncode == 0, out.stdout[-2000:]


def test_carts_are_independent():
    a, b = Cart(), Cart()
    a.add("apple").add_discount("vip", 0.1)
    assert b.items == [] and "vip" not in b.discounts
    assert Cart().total() == 0
    assert DEFAULT_DISCOUNTS == {"member": 0.05}


def test_explicit_arguments_still_work():
    items = [("milk", 1)]
    c = Cart(items=items, discounts={})
    c.add("apple")
    assert c.total() == 1.7
    d = Cart(discounts={"half": 0.5})
    assert d.add("cheese").total() == 3.0
