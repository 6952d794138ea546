"""The compile cache: content keys, memory/disk/Redis tiers, statistics, portable bundles, why-miss.

A service every stage may use; it imports nothing of theirs (only ``errors`` and ``__version__``).
"""
from __future__ import annotations

from .bundle import LoadReport, load_artifacts, save_artifacts
from .keys import Key, make_key
from .op_cache import OpGraphCache, op_graph_cache
from .service import Cache, Explanation, cached_value, get_cache, set_cache


def stats() -> dict[str, dict[str, int]]:
    """Per-tier counters of the process-wide cache (hits, misses, puts, evictions, errors, bytes), and
    the op-level graph cache's under "op_graph"."""
    return {**get_cache().stats(), "op_graph": op_graph_cache.stats()}


def clear() -> None:
    """Empty every tier of the process-wide cache (the disk directory and the Redis keys included)."""
    get_cache().clear()


__all__ = ["OpGraphCache", "op_graph_cache", "Key", "make_key", "Cache", "Explanation", "LoadReport", "cached_value", "get_cache", "set_cache", "stats",
           "clear", "save_artifacts", "load_artifacts"]
