import hashlib
import multiprocessing as mp
import os
import time

import redis

from ostinato.cache import make_key
from ostinato.cache.disk import DiskTier
from ostinato.cache.entry import Entry, decode, encode
from ostinato.cache.memory import MemoryTier
from ostinato.cache.redis_tier import RedisTier


def _entry(i: int, size: int = 1000) -> Entry:
    value = hashlib.sha256(str(i).encode()).digest() * (size // 32 + 1)
    return Entry.of(make_key("plan", f"{i:064x}"), value[:size])


def _flip_last_byte(blob: bytes) -> bytes:
    return blob[:-1] + bytes([blob[-1] ^ 0xFF])


def test_memory_lru_bounded_by_bytes():
    one = len(encode(_entry(0)))
    tier = MemoryTier(max_bytes=5 * one)
    for i in range(20):
        tier.put(_entry(i))
        assert tier.get(_entry(0).digest) is not None  # kept hot: must survive every eviction
        assert tier.stats.bytes <= 5 * one
    assert tier.stats.evictions == 15
    assert tier.get(_entry(1).digest) is None  # the coldest went first
    assert tier.get(_entry(19).digest).value == _entry(19).value


def test_disk_lru_bounded_by_bytes(tmp_path):
    one = len(encode(_entry(0)))
    tier = DiskTier(tmp_path / "c", max_bytes=8 * one)
    for i in range(30):
        tier.put(_entry(i))
        assert tier.get(_entry(0).digest) is not None  # touched on read: most recently used
        on_disk = sum(f.stat().st_size for f in (tmp_path / "c").rglob("*.bin"))
        assert on_disk <= 8 * one
    assert tier.stats.evictions >= 22
    assert tier.get(_entry(1).digest) is None
    assert tier.get(_entry(29).digest).value == _entry(29).value
    # Evicted entries take their index manifests with them.
    assert len(list((tmp_path / "c").rglob("*.json"))) == len(list((tmp_path / "c").rglob("*.bin")))


def test_corrupt_memory_entry_is_discarded():
    tier = MemoryTier()
    e = _entry(1)
    tier.put(e)
    tier._blobs[e.digest] = _flip_last_byte(tier._blobs[e.digest])
    assert tier.get(e.digest) is None
    assert tier.stats.errors == 1 and tier.stats.misses == 1 and tier.stats.hits == 0
    assert e.digest not in tier._blobs and tier.stats.bytes == 0
    tier.put(e)  # recompiled value goes back in and is served
    assert tier.get(e.digest).value == e.value


def test_corrupt_disk_entry_is_discarded(tmp_path):
    tier = DiskTier(tmp_path / "c")
    e = _entry(2)
    tier.put(e)
    (path,) = (tmp_path / "c").rglob("*.bin")
    path.write_bytes(_flip_last_byte(path.read_bytes()))
    assert tier.get(e.digest) is None
    assert tier.stats.errors == 1 and tier.stats.misses == 1 and tier.stats.hits == 0
    assert not path.exists()
    # A truncated file (a torn write) is treated the same way.
    tier.put(e)
    path.write_bytes(path.read_bytes()[:50])
    assert tier.get(e.digest) is None and tier.stats.errors == 2


def test_entry_under_the_wrong_digest_is_rejected(tmp_path):
    # A store that answers with a valid entry of another key must not be believed.
    tier = DiskTier(tmp_path / "c")
    a, b = _entry(3), _entry(4)
    tier.put(a)
    path = next((tmp_path / "c").rglob(f"{a.digest}.bin"))
    path.write_bytes(encode(b))
    assert tier.get(a.digest) is None and tier.stats.errors == 1


def test_corrupt_redis_entry_is_discarded(redis_server, redis_prefix):
    tier = RedisTier(redis_server.url, prefix=redis_prefix)
    e = _entry(5)
    tier.put(e)
    r = redis.Redis.from_url(redis_server.url)
    key = redis_prefix + "e:" + e.digest
    r.set(key, _flip_last_byte(r.get(key)))
    assert tier.get(e.digest) is None
    assert tier.stats.errors == 1 and tier.stats.misses == 1
    assert r.exists(key) == 0
    r.set(key, b"pickle? no: not even an entry")
    assert tier.get(e.digest) is None and tier.stats.errors == 2


N_KEYS = 16


def _writer(root: str, rounds: int) -> None:
    tier = DiskTier(root)
    for _ in range(rounds):
        for i in range(N_KEYS):
            tier.put(_entry(i, size=48_000))


def _reader(root: str, q) -> None:
    tier = DiskTier(root)
    hits = 0
    deadline = time.monotonic() + 20
    while hits < 200 and time.monotonic() < deadline:
        for i in range(N_KEYS):
            got = tier.get(_entry(i, size=48_000).digest)
            if got is not None:
                hits += 1
                assert got.value == _entry(i, size=48_000).value
    q.put((hits, tier.stats.errors))


def test_eight_processes_write_the_same_keys(tmp_path):
    root = str(tmp_path / "shared")
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    readers = [ctx.Process(target=_reader, args=(root, q)) for _ in range(2)]
    writers = [ctx.Process(target=_writer, args=(root, 3)) for _ in range(8)]
    for p in writers + readers:
        p.start()
    for p in writers + readers:
        p.join(60)
        assert p.exitcode == 0
    for _ in readers:
        hits, errors = q.get(timeout=5)
        assert hits > 0 and errors == 0  # a reader never saw a partial file
    tier = DiskTier(root)
    for i in range(N_KEYS):
        e = _entry(i, size=48_000)
        path = next((tmp_path / "shared").rglob(f"{e.digest}.bin"))
        assert decode(path.read_bytes(), e.digest).value == e.value
    assert len(list((tmp_path / "shared").rglob("*.bin"))) == N_KEYS
    assert not [p for p in (tmp_path / "shared").rglob(".tmp-*")]  # no temporaries left behind
    assert len(tier.manifests(next(iter(os.listdir(tmp_path / "shared" / "v1" / "index"))))) == 1
