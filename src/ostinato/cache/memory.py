"""In-process tier: LRU bounded by bytes, safe to share between threads."""
from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Iterator

from .entry import CorruptEntry, Entry, decode, encode
from .keys import Manifest, content_group
from .tier import Tier


class MemoryTier(Tier):
    name = "memory"

    def __init__(self, max_bytes: int = 256 << 20) -> None:
        super().__init__()
        self.max_bytes = max_bytes
        self._lock = threading.Lock()
        # Encoded entries, so a read re-verifies the sha256 exactly like the other tiers do.
        self._blobs: OrderedDict[str, bytes] = OrderedDict()
        self._groups: dict[str, dict[str, Manifest]] = {}
        self._group_of: dict[str, str] = {}
        self._size = 0

    def get(self, digest: str) -> Entry | None:
        with self._lock:
            blob = self._blobs.get(digest)
            if blob is not None:
                self._blobs.move_to_end(digest)
        if blob is None:
            self.stats.add(misses=1)
            return None

        def discard() -> None:
            with self._lock:
                if self._blobs.get(digest) is blob:
                    self._drop(digest)
                size = self._size
            self.stats.set_bytes(size)

        return self._decode_or_discard(blob, digest, discard)

    def put(self, entry: Entry) -> None:
        blob = encode(entry)
        if len(blob) > self.max_bytes:
            return  # would evict everything and still not fit
        digest = entry.digest
        evicted = 0
        with self._lock:
            if digest in self._blobs:
                self._drop(digest)
            self._blobs[digest] = blob
            self._size += len(blob)
            m = entry.manifest
            group = content_group(m["kind"], m["content"])
            self._groups.setdefault(group, {})[digest] = m
            self._group_of[digest] = group
            while self._size > self.max_bytes:
                self._drop(next(iter(self._blobs)))
                evicted += 1
            size = self._size
        self.stats.add(puts=1, evictions=evicted)
        self.stats.set_bytes(size)

    def _drop(self, digest: str) -> None:
        # Caller holds the lock.
        blob = self._blobs.pop(digest)
        self._size -= len(blob)
        group = self._group_of.pop(digest)
        members = self._groups[group]
        del members[digest]
        if not members:
            del self._groups[group]

    def manifests(self, group: str) -> list[Manifest]:
        with self._lock:
            return list(self._groups.get(group, {}).values())

    def groups(self) -> list[tuple[str, str]]:
        with self._lock:
            return sorted({(m["kind"], m["content"]) for ms in self._groups.values() for m in ms.values()})

    def entries(self) -> Iterator[Entry]:
        with self._lock:
            items = list(self._blobs.items())
        for digest, blob in items:
            try:
                yield decode(blob, digest)
            except CorruptEntry:
                continue

    def clear(self) -> None:
        with self._lock:
            self._blobs.clear()
            self._groups.clear()
            self._group_of.clear()
            self._size = 0
        self.stats.set_bytes(0)
