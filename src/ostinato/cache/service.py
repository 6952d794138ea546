"""The cache every stage uses: tiers read through in order, written through, upper tiers filled on a hit.

Also why-miss: on a miss, the debug log names the manifest components that differ from the nearest
stored entry of the same kind and content (``explain`` returns the same diff).
"""
from __future__ import annotations

import os
import threading
from dataclasses import dataclass, field
from typing import Any, Iterator, Sequence

from .disk import DiskTier
from .entry import Entry
from .keys import MACHINE_LOCAL_KINDS, Key, Manifest, content_group, diff_manifests
from .memory import MemoryTier
from .redis_tier import RedisTier
from .tier import Tier, log


@dataclass
class Explanation:
    """Why ``key`` hits or misses: the nearest stored entry of its kind and content, and what differs."""

    digest: str
    hit: bool
    nearest: Manifest | None = None
    differs: dict[str, tuple[Any, Any]] = field(default_factory=dict)
    candidates: int = 0

    def describe(self) -> str:
        if self.hit:
            return f"hit {self.digest[:12]}"
        if self.nearest is None:
            return f"miss {self.digest[:12]}: no entry of this kind and content is stored"
        parts = ", ".join(f"{k} stored {a!r} wanted {b!r}" for k, (a, b) in self.differs.items())
        return f"miss {self.digest[:12]}: nearest of {self.candidates} stored entries differs in {parts}"


# This machine's own tiers: what a bundle carries, and all that records of MACHINE_LOCAL_KINDS go to.
LOCAL_TIERS = ("memory", "disk")


class Cache:
    def __init__(self, tiers: Sequence[Tier]) -> None:
        self.tiers = list(tiers)

    def tier(self, name: str) -> Tier | None:
        return next((t for t in self.tiers if t.name == name), None)

    def _tiers_for(self, kind: str) -> list[Tier]:
        """Every tier, or this machine's own (LOCAL_TIERS) for a record true of this machine only
        (``MACHINE_LOCAL_KINDS``: another machine reading the same Redis has other files)."""
        return self.tiers if kind not in MACHINE_LOCAL_KINDS else [t for t in self.tiers if t.name in LOCAL_TIERS]

    def get(self, key: Key) -> bytes | None:
        digest = key.digest
        tiers = self._tiers_for(key.kind)
        for i, tier in enumerate(tiers):
            entry = tier.get(digest)
            if entry is not None:
                for upper in tiers[:i]:
                    upper.put(entry)
                return entry.value
        if log.isEnabledFor(10):  # DEBUG; the index lookups are only worth it when someone reads them
            log.debug("ostinato cache: %s %s", key.kind, self.explain(key).describe())
        return None

    def put(self, key: Key, value: bytes) -> None:
        self.put_entry(Entry.of(key, value))

    def put_entry(self, entry: Entry) -> None:
        for tier in self._tiers_for(entry.manifest.get("kind")):
            tier.put(entry)

    def stored_manifests(self, kind: str, content: str) -> list[Manifest]:
        seen: dict[str, Manifest] = {}
        group = content_group(kind, content)
        for tier in self.tiers:
            for m in tier.manifests(group):
                if m.get("kind") == kind and m.get("content") == content:
                    seen.setdefault(Entry(m, b"").digest, m)
        return list(seen.values())

    def explain(self, key: Key) -> Explanation:
        """Nearest stored entry of ``key``'s kind and content, and the components in which it differs."""
        want = key.manifest()
        stored = self.stored_manifests(key.kind, key.content)
        if any(Entry(m, b"").digest == key.digest for m in stored):
            return Explanation(key.digest, True, want, {}, len(stored))
        if not stored:
            return Explanation(key.digest, False)
        diffs = [(diff_manifests(m, want), m) for m in stored]
        differs, nearest = min(diffs, key=lambda d: (len(d[0]), sorted(d[0])))
        return Explanation(key.digest, False, nearest, differs, len(stored))

    def groups(self) -> list[tuple[str, str]]:
        return sorted({g for t in self.tiers for g in t.groups()})

    def local_entries(self) -> Iterator[Entry]:
        """Each valid entry of the memory and disk tiers once, but records true of this machine only (what
        a bundle carries)."""
        seen: set[str] = set()
        for tier in self.tiers:
            if tier.name not in LOCAL_TIERS:
                continue
            for e in tier.entries():
                if e.manifest.get("kind") not in MACHINE_LOCAL_KINDS and e.digest not in seen:
                    seen.add(e.digest)
                    yield e

    def stats(self) -> dict[str, dict[str, int]]:
        return {t.name: t.stats.as_dict() for t in self.tiers}

    def clear(self) -> None:
        for t in self.tiers:
            t.clear()


def _env_bytes(name: str, default: int) -> int:
    raw = os.environ.get(name)
    if not raw:
        return default
    try:
        return int(raw)
    except ValueError:
        log.warning("ostinato cache: %s=%r is not a number of bytes; using %d", name, raw, default)
        return default


def cache_from_env() -> Cache:
    """memory → disk (``OSTINATO_CACHE_DIR``) → Redis (only if ``OSTINATO_REDIS_URL`` is set).

    Sizes: ``OSTINATO_CACHE_MEMORY_BYTES`` (256 MiB), ``OSTINATO_CACHE_DISK_BYTES`` (4 GiB).
    """
    tiers: list[Tier] = [MemoryTier(_env_bytes("OSTINATO_CACHE_MEMORY_BYTES", 256 << 20)),
                         DiskTier(None, _env_bytes("OSTINATO_CACHE_DISK_BYTES", 4 << 30))]
    url = os.environ.get("OSTINATO_REDIS_URL")
    if url:
        tiers.append(RedisTier(url))
    return Cache(tiers)


_default: Cache | None = None
_default_lock = threading.Lock()


def get_cache() -> Cache:
    """The process-wide cache, built from the environment on first use."""
    global _default
    with _default_lock:
        if _default is None:
            _default = cache_from_env()
        return _default


def cached_value(key: Key, decode, what: str):
    """``decode(bytes)`` of the process-wide cache's entry for ``key``, or None: a cache that cannot
    answer is a miss (logged at debug), and so is an entry that does not decode (logged as discarded,
    naming ``what``), so the caller computes the value again."""
    try:
        blob = get_cache().get(key)
    except Exception as e:  # noqa: BLE001 - a cache that cannot answer is a miss
        log.debug("ostinato: %s cache unavailable: %s", what, e)
        return None
    if blob is None:
        return None
    try:
        return decode(blob)
    except Exception as e:  # noqa: BLE001 - a malformed entry is a miss
        log.warning("ostinato cache: discarding %s %s: %s: %s", what, key.digest[:12], type(e).__name__, e)
        return None


def set_cache(cache: Cache | None) -> None:
    """Replace the process-wide cache (None: rebuild from the environment on next use)."""
    global _default
    with _default_lock:
        _default = cache
