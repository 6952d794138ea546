"""The op-level graph cache: what a backend prepares for a library op, per (op, shapes, dtypes,
layout flags): the chosen implementation, pre-transposed weights, block sizes. In memory, bounded
(LRU), thread-safe, counted; ``ostinato.cache.stats()["op_graph"]`` shows the counters.

The counterpart of the MPSGraph cache of ExecuTorch's Metal backend, with a bound and a lock.
"""
from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any, Callable, Hashable


class OpGraphCache:
    def __init__(self, capacity: int = 4096):
        self.capacity = capacity
        self._items: OrderedDict[Hashable, Any] = OrderedDict()
        self._lock = threading.Lock()
        self._counts = {"hits": 0, "misses": 0, "evictions": 0}

    def get(self, key: Hashable, prepare: Callable[[], Any], valid: Callable[[Any], bool] | None = None) -> Any:
        """The prepared value for ``key``, made by ``prepare()`` on a miss (outside the lock: two
        threads may both prepare the same key; the first stored wins and both get it). A stored value
        ``valid`` rejects counts as a miss and is replaced."""
        with self._lock:
            if key in self._items and (valid is None or valid(self._items[key])):
                self._items.move_to_end(key)
                self._counts["hits"] += 1
                return self._items[key]
            self._counts["misses"] += 1
        value = prepare()
        with self._lock:
            old = self._items.get(key)
            if old is not None and valid is not None and not valid(old):
                del self._items[key]
            value = self._items.setdefault(key, value)
            self._items.move_to_end(key)
            while len(self._items) > self.capacity:
                self._items.popitem(last=False)
                self._counts["evictions"] += 1
        return value

    def stats(self) -> dict[str, int]:
        with self._lock:
            return {**self._counts, "entries": len(self._items)}

    def drop(self, key: Hashable) -> None:
        with self._lock:
            self._items.pop(key, None)

    def clear(self) -> None:
        with self._lock:
            self._items.clear()


def op_key(op: str, *tensors, **flags) -> tuple:
    """The key of a preparation: the op, the device, each tensor's shape, strides and dtype, and the
    flags. Flat and cheap: a backend computes it on every call that does not replay."""
    key = [op, tensors[0].get_device()]
    for t in tensors:
        key += (t.shape, t.stride(), t.dtype)
    if flags:
        key += flags.items()
    return tuple(key)


op_graph_cache = OpGraphCache()
