"""Counters of the torch.compile backend: which graphs ostinato runs, which run eagerly, and why.

A backend that falls back silently would make "it works" untestable; these counters say what path
each graph took (tests assert on them, users read them to see what torch.compile actually did).
"""
from __future__ import annotations

import collections
import threading
import weakref

_lock = threading.Lock()
_KEYS = ("graphs", "compiled", "eager", "exports", "static_exports", "rebuilds", "specializations",
         "calls", "eager_calls")
_counts: dict[str, int] = dict.fromkeys(_KEYS, 0)
# (graph, reason) for each graph or call that ran eagerly instead of on ostinato (the latest 64).
_fallbacks: collections.deque = collections.deque(maxlen=64)
# The graphs ostinato took (the latest 64; weak, so they do not keep models alive).
_graphs: collections.deque = collections.deque(maxlen=64)


def count(**inc: int) -> None:
    with _lock:
        for key, n in inc.items():
            _counts[key] += n


def record_fallback(graph: str, reason: str) -> None:
    with _lock:
        _fallbacks.append((graph, reason))


def record_graph(compiled) -> None:
    with _lock:
        _graphs.append(weakref.ref(compiled))


def compiled_graphs() -> list:
    """The CompiledGraph of each graph ostinato took since ``reset_stats()``, oldest first (still alive):
    its ``program``, ``executable``, ``placeholders`` (each input's role) and ``replay``."""
    with _lock:
        return [g for g in (ref() for ref in _graphs) if g is not None]


def stats() -> dict:
    """What the backend did since the last ``reset_stats()``:

    graphs: graphs Dynamo handed it; compiled: graphs that run on ostinato; eager: graphs left to eager
    torch (``fallbacks`` says why); exports: ostinato.export calls (one per graph unless a shape or a
    model tensor changed); static_exports: exports made with every size fixed after the dynamic one
    failed; rebuilds: re-exports because a parameter or buffer was replaced or a float changed;
    specializations: extra programs for sizes the dynamic program does not cover; calls / eager_calls:
    graph calls run by ostinato / eagerly."""
    with _lock:
        return {**_counts, "fallbacks": list(_fallbacks)}


def reset_stats() -> None:
    with _lock:
        for key in _counts:
            _counts[key] = 0
        _fallbacks.clear()
        _graphs.clear()
