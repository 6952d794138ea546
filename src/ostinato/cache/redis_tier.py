"""Redis tier: a cache shared by every machine that can reach ``OSTINATO_REDIS_URL``.

A remote store is untrusted and may be down. Values are verified like every other tier's (entry.py);
each call has a short timeout and no retries; a failure is counted, logged once, and the tier is then
skipped for ``backoff_s`` so a dead server costs one timeout per back-off period, not one per lookup.
Nothing here raises to the caller.

Keys: ``<prefix>e:<digest>`` holds the encoded entry; the hash ``<prefix>i:<content group>`` maps each
digest to its manifest (why-miss across machines). Eviction is the server's (maxmemory policy).
"""
from __future__ import annotations

import json
import time
from typing import Any, Callable, Iterator, TypeVar

from .entry import CorruptEntry, Entry, decode, encode
from .keys import Manifest, canonical_json, content_group
from .tier import Tier, log

T = TypeVar("T")
_FAILED: Any = object()


class RedisTier(Tier):
    name = "redis"

    def __init__(self, url: str, timeout_s: float = 0.2, backoff_s: float = 30.0,
                 prefix: str = "ostinato:v1:") -> None:
        super().__init__()
        self.url = url
        self.timeout_s = timeout_s
        self.backoff_s = backoff_s
        self.prefix = prefix
        self._client: Any = None
        self._down_until = 0.0

    def _connect(self) -> Any:
        if self._client is None:
            import redis
            from redis.backoff import NoBackoff
            from redis.retry import Retry

            # Retrying a dead server multiplies the stall; a miss is cheaper than waiting.
            self._client = redis.Redis.from_url(
                self.url, socket_timeout=self.timeout_s, socket_connect_timeout=self.timeout_s,
                retry=Retry(NoBackoff(), 0), retry_on_timeout=False, health_check_interval=0)
        return self._client

    def available(self) -> bool:
        return time.monotonic() >= self._down_until

    def _call(self, what: str, fn: Callable[[Any], T]) -> T:
        if not self.available():
            return _FAILED
        try:
            result = fn(self._connect())
        except Exception as e:  # noqa: BLE001 — any failure of a remote cache must degrade to a miss
            self._failed(what, e)
            self._down_until = time.monotonic() + self.backoff_s
            return _FAILED
        if self._warned:
            self._warned = False  # back up: warn again on the next outage
            log.info("ostinato cache: redis tier at %s is reachable again", self.url)
        return result

    def get(self, digest: str) -> Entry | None:
        blob = self._call("read", lambda r: r.get(self.prefix + "e:" + digest))
        if blob is _FAILED or blob is None:
            self.stats.add(misses=1)
            return None
        return self._decode_or_discard(
            blob, digest, lambda: self._call("delete", lambda r: r.delete(self.prefix + "e:" + digest)))

    def put(self, entry: Entry) -> None:
        digest, blob, m = entry.digest, encode(entry), entry.manifest

        def write(r: Any) -> None:
            p = r.pipeline(transaction=False)
            p.set(self.prefix + "e:" + digest, blob)
            p.hset(self.prefix + "i:" + content_group(m["kind"], m["content"]), digest, canonical_json(m))
            p.execute()

        if self._call("write", write) is not _FAILED:
            self.stats.add(puts=1, bytes=len(blob))

    def manifests(self, group: str) -> list[Manifest]:
        found = self._call("read index", lambda r: r.hgetall(self.prefix + "i:" + group))
        if found is _FAILED:
            return []
        out = []
        for raw in found.values():
            try:
                m = json.loads(raw)
            except ValueError:
                continue
            if isinstance(m, dict):
                out.append(m)
        return out

    def groups(self) -> list[tuple[str, str]]:
        def scan(r: Any) -> list[tuple[str, str]]:
            found = set()
            for k in r.scan_iter(match=self.prefix + "i:*", count=500):
                for m in self.manifests(k.decode()[len(self.prefix) + 2:])[:1]:
                    found.add((m["kind"], m["content"]))
            return sorted(found)

        got = self._call("scan", scan)
        return [] if got is _FAILED else got

    def entries(self) -> Iterator[Entry]:
        keys = self._call("scan", lambda r: list(r.scan_iter(match=self.prefix + "e:*", count=500)))
        for k in [] if keys is _FAILED else keys:
            blob = self._call("read", lambda r: r.get(k))
            if blob is _FAILED or blob is None:
                continue
            try:
                yield decode(blob, k.decode()[len(self.prefix) + 2:])
            except CorruptEntry:
                continue

    def clear(self) -> None:
        def wipe(r: Any) -> None:
            for k in r.scan_iter(match=self.prefix + "*", count=500):
                r.delete(k)

        self._call("clear", wipe)
        self.stats.set_bytes(0)
