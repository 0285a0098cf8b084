"""Outcome checks: LRUCache behaviour from SPEC.md."""
import sys
import time

import pytest

sys.path.insert(0, "/app")
from lru import LRUCache  # noqa: E402


def test_basic_eviction_order():
    c = LRUCache(2)
    c.put("a", 1)
    c.put("b", 2)
    assert c.get("a") == 1
    c.put("c", 3)
    assert "b" not in c and c.keys() == ["a", "c"]
    assert len(c) == 2


def test_replace_refreshes_and_keeps_size():
    c = LRUCache(2)
    c.put("a", 1)
    c.put("b", 2)
    c.put("a", 10)
    c.put("c", 3)
    assert c.keys() == ["a", "c"] and c.get("a") == 10


def test_get_default_and_counters():
    c = LRUCache(3)
    c.put(1, "x")
    assert c.get(2) is None and c.get(2, "d") == "d"
    assert c.get(1) == "x"
    c.peek(1)
    c.peek(5)
    assert 1 in c and 7 not in c
    assert (c.hits, c.misses) == (1, 2)


def test_peek_and_contains_do_not_refresh():
    c = LRUCache(2)
    c.put("a", 1)
    c.put("b", 2)
    assert c.peek("a") == 1 and c.peek("zz", 0) == 0
    assert "a" in c
    c.put("c", 3)
    assert c.keys() == ["b", "c"]


def test_delete():
    c = LRUCache(2)
    c.put("a", 1)
    assert c.delete("a") is True and c.delete("a") is False
    assert len(c) == 0


def test_falsy_values_are_hits():
    c = LRUCache(2)
    c.put("z", None)
    c.put("y", 0)
    assert c.get("z", "d") is None and c.get("y", 5) == 0
    assert (c.hits, c.misses) == (2, 0)


def test_capacity_zero_and_negative():
    c = LRUCache(0)
    c.put("a", 1)
    assert len(c) == 0 and c.get("a") is None
    with pytest.raises(ValueError):
        LRUCache(-1)


def test_on_evict_only_for_capacity():
    seen = []
    c = LRUCache(2, on_evict=lambda k, v: seen.append((k, v)))
    c.put("a", 1)
    c.put("b", 2)
    c.put("a", 3)
    c.delete("b")
    c.put("c", 4)
    c.put("d", 5)
    assert seen == [("a", 3)]


def test_constant_time_operations():
    c = LRUCache(200_000)
    start = time.perf_counter()
    for i in range(400_000):
        c.put(i, i)
        c.get(i - 1)
    assert time.perf_counter() - start < 10.0
    assert len(c) == 200_000 and c.keys()[0] == 200_000
