#!/bin/bash
# OrderedDict gives O(1) move_to_end/popitem(last=False).
cd /app
cat > /app/lru.py <<'PY'
"""A least-recently-used cache. See SPEC.md."""
from collections import OrderedDict

_MISSING = object()


class LRUCache:
    """LRU cache of at most `capacity` keys; O(1) get/put (OrderedDict)."""

    def __init__(self, capacity, on_evict=None):
        if not isinstance(capacity, int) or capacity < 0:
            raise ValueError(f"capacity must be an int >= 0, got {capacity!r}")
        self.capacity = capacity
        self.on_evict = on_evict
        self.hits = 0
        self.misses = 0
        self._data = OrderedDict()

    def put(self, key, value):
        if self.capacity == 0:
            return
        if key in self._data:
            self._data.move_to_end(key)
        self._data[key] = value
        while len(self._data) > self.capacity:
            old_key, old_value = self._data.popitem(last=False)
            if self.on_evict is not None:
                self.on_evict(old_key, old_value)

    def get(self, key, default=None):
        value = self._data.get(key, _MISSING)
        if value is _MISSING:
            self.misses += 1
            return default
        self.hits += 1
        self._data.move_to_end(key)
        return value

    def peek(self, key, default=None):
        return self._data.get(key, default)

    def delete(self, key):
        return self._data.pop(key, _MISSING) is not _MISSING

    def keys(self):
        return list(self._data)

    def __contains__(self, key):
        return key in self._data

    def __len__(self):
        return len(self._data)
PY
python3 -c "
from lru import LRUCache
c = LRUCache(2); c.put('a', 1); c.put('b', 2); c.get('a'); c.put('c', 3)
print(c.keys(), c.hits, c.misses)"
