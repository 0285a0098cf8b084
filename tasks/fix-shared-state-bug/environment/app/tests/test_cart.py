import pytest

from shop.cart import Cart


def test_single_item():
    assert Cart().add("bread").total() == 2.14


def test_two_items():
    assert Cart().add("apple", 4).add("milk").total() == 3.04


def test_staff_discount():
    assert Cart().add("cheese").add_discount("staff", 0.2).total() == 4.5


def test_discount_cap():
    c = Cart().add("cheese", 2).add_discount("staff", 0.3).add_discount("promo", 0.3)
    assert c.total() == 6.0


def test_member_only():
    assert Cart().add("milk", 10).total() == 11.4


def test_bad_quantity():
    with pytest.raises(ValueError):
        Cart().add("milk", 0)
