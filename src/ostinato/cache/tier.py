"""What every cache tier provides, and the counters each one keeps."""
from __future__ import annotations

import abc
import logging
import threading
from dataclasses import dataclass, field, fields
from typing import Callable, Iterator

from .entry import CorruptEntry, Entry, decode
from .keys import Manifest

log = logging.getLogger("ostinato")


@dataclass
class TierStats:
    """Counters of one tier. ``bytes`` is what the tier holds now (Redis: what this process wrote)."""

    hits: int = 0
    misses: int = 0
    puts: int = 0
    evictions: int = 0
    errors: int = 0
    bytes: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def add(self, **counts: int) -> None:
        with self._lock:
            for name, n in counts.items():
                setattr(self, name, getattr(self, name) + n)

    def set_bytes(self, n: int) -> None:
        with self._lock:
            self.bytes = n

    def as_dict(self) -> dict[str, int]:
        with self._lock:
            return {f.name: getattr(self, f.name) for f in fields(self) if not f.name.startswith("_")}


class Tier(abc.ABC):
    """A store of encoded entries by digest. No method raises: a failure is counted and becomes a miss."""

    name: str

    def __init__(self) -> None:
        self.stats = TierStats()
        self._warned = False

    def _failed(self, what: str, err: BaseException) -> None:
        """Count a failure; warn the first time only, so a dead tier does not flood the log."""
        self.stats.add(errors=1)
        if not self._warned:
            self._warned = True
            log.warning("ostinato cache: %s tier failed to %s (%s: %s); carrying on without it",
                        self.name, what, type(err).__name__, err)
        else:
            log.debug("ostinato cache: %s tier failed to %s: %s", self.name, what, err)

    def _decode_or_discard(self, blob: bytes, digest: str, discard: Callable[[], None]) -> Entry | None:
        """The stored entry, hash-checked; a corrupt one is discarded, counted and read as a miss."""
        try:
            entry = decode(blob, digest)
        except CorruptEntry as e:
            log.warning("ostinato cache: discarding corrupt %s entry %s: %s", self.name, digest[:12], e)
            discard()
            self.stats.add(errors=1, misses=1)
            return None
        self.stats.add(hits=1)
        return entry

    @abc.abstractmethod
    def get(self, digest: str) -> Entry | None:
        """The verified entry, or None (counted as a miss; a corrupt entry is also discarded and counted)."""

    @abc.abstractmethod
    def put(self, entry: Entry) -> None: ...

    @abc.abstractmethod
    def manifests(self, group: str) -> list[Manifest]:
        """Manifests of the entries of one content group (see keys.content_group), for why-miss."""

    @abc.abstractmethod
    def groups(self) -> list[tuple[str, str]]:
        """The (kind, content) pairs stored, for ``ostinato cache explain`` with no arguments."""

    @abc.abstractmethod
    def entries(self) -> Iterator[Entry]:
        """Every valid entry, without touching counters or recency (for bundles)."""

    @abc.abstractmethod
    def clear(self) -> None: ...
