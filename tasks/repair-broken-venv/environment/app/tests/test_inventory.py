from inventory import restock_needed


def test_restock():
    assert restock_needed({"a": 1, "b": 10}, {"a": 5, "b": 5, "c": 1}) == ["a", "c"]
