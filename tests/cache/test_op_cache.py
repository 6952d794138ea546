"""The op-level graph cache: bounded, counted, thread-safe, visible in ostinato.cache.stats()."""
from __future__ import annotations

import threading

import torch

import ostinato
from ostinato.cache.op_cache import OpGraphCache, op_key


def test_prepares_once_per_key_and_counts():
    cache = OpGraphCache(capacity=8)
    made = []
    for _ in range(3):
        assert cache.get(("mm", (2, 3)), lambda: made.append(1) or "plan") == "plan"
    assert made == [1]
    assert cache.stats() == {"hits": 2, "misses": 1, "evictions": 0, "entries": 1}


def test_lru_bound_holds_and_counts_evictions():
    cache = OpGraphCache(capacity=4)
    for i in range(10):
        cache.get(i, lambda i=i: i * i)
    cache.get(6, lambda: -1)          # recent: kept, a hit
    cache.get(10, lambda: 100)        # evicts the least recent (7), not 6
    st = cache.stats()
    assert st["entries"] == 4 and st["evictions"] == 7 and st["hits"] == 1
    assert cache.get(6, lambda: -1) == 36
    assert cache.get(7, lambda: -7) == -7   # was evicted: prepared again


def test_threads_share_one_value_per_key():
    cache = OpGraphCache()
    results = []

    def work(t):
        for i in range(200):
            results.append((i % 10, cache.get(i % 10, lambda i=i: object())))
    threads = [threading.Thread(target=work, args=(t,)) for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    by_key = {}
    for k, v in results:
        assert by_key.setdefault(k, v) is v, "two threads got different prepared values for one key"
    st = cache.stats()
    assert st["hits"] + st["misses"] == 800 and st["entries"] == 10


def test_op_key_sees_layout():
    x = torch.randn(4, 6)
    assert op_key("aten.mm", x) != op_key("aten.mm", x.t().contiguous().t())
    assert op_key("aten.mm", x) == op_key("aten.mm", torch.randn(4, 6))
    assert op_key("aten.mm", x) != op_key("aten.mm", x.half())
    assert op_key("aten.mm", x, alpha=1) != op_key("aten.mm", x, alpha=2)


def test_visible_in_cache_stats():
    assert set(ostinato.cache.stats()["op_graph"]) == {"hits", "misses", "evictions", "entries"}
