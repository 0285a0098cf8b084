"""A least-recently-used cache. See SPEC.md."""


class LRUCache:
    def __init__(self, capacity):
        raise NotImplementedError
