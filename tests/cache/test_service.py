import logging
import os
import time

from conftest import start_redis

from ostinato.cache import Cache, make_key
from ostinato.cache.disk import DiskTier
from ostinato.cache.memory import MemoryTier
from ostinato.cache.redis_tier import RedisTier


def _three(tmp_path, name, url, prefix):
    return Cache([MemoryTier(), DiskTier(tmp_path / name), RedisTier(url, prefix=prefix)])


def test_write_through_then_read_through_in_order(tmp_path, redis_server, redis_prefix):
    cache = _three(tmp_path, "a", redis_server.url, redis_prefix)
    k = make_key("plan", b"p1")
    assert cache.get(k) is None
    assert [cache.stats()[t]["misses"] for t in ("memory", "disk", "redis")] == [1, 1, 1]
    cache.put(k, b"value-1")
    assert [cache.stats()[t]["puts"] for t in ("memory", "disk", "redis")] == [1, 1, 1]
    for tier in cache.tiers:  # written through: every tier holds it on its own
        assert tier.get(k.digest).value == b"value-1"
    before = cache.stats()
    assert cache.get(k) == b"value-1"
    after = cache.stats()
    assert after["memory"]["hits"] == before["memory"]["hits"] + 1
    assert after["disk"] == before["disk"] and after["redis"] == before["redis"]  # stopped at the top


def test_lower_tier_hit_fills_upper_tiers(tmp_path, redis_server, redis_prefix):
    k = make_key("plan", b"p2")
    _three(tmp_path, "a", redis_server.url, redis_prefix).put(k, b"value-2")
    # Another machine: empty memory and disk, same Redis.
    other = _three(tmp_path, "b", redis_server.url, redis_prefix)
    assert other.get(k) == b"value-2"
    st = other.stats()
    assert st["redis"]["hits"] == 1 and st["memory"]["puts"] == 1 and st["disk"]["puts"] == 1
    assert other.get(k) == b"value-2"
    assert other.stats()["memory"]["hits"] == 1 and other.stats()["redis"]["hits"] == 1
    # The disk fill is real: a third process on disk "b" alone hits.
    assert Cache([DiskTier(tmp_path / "b")]).get(k) == b"value-2"


def test_redis_stopped_mid_run(tmp_path, caplog):
    server = start_redis(str(tmp_path))
    try:
        tier = RedisTier(server.url, timeout_s=0.2, backoff_s=60)
        cache = Cache([MemoryTier(), tier])
        k1, k2 = make_key("plan", b"a"), make_key("plan", b"b")
        cache.put(k1, b"one")
        assert Cache([RedisTier(server.url)]).get(k1) == b"one"
        server.stop()
        with caplog.at_level(logging.DEBUG, logger="ostinato"):
            t0 = time.monotonic()
            assert cache.get(k2) is None  # no exception reaches us
            assert time.monotonic() - t0 < 2.0
            assert tier.stats.errors == 1
            cache.put(k2, b"two")  # written to memory, Redis skipped
            fresh = Cache([MemoryTier(), tier])
            misses = tier.stats.misses
            assert fresh.get(k1) is None  # Redis held k1, but it is gone: a miss
            assert tier.stats.misses == misses + 1
            assert tier.stats.errors == 1  # in back-off: skipped, not retried
            assert cache.get(k2) == b"two"
        warnings = [r for r in caplog.records if r.levelno >= logging.WARNING and "redis" in r.getMessage()]
        assert len(warnings) == 1, [r.getMessage() for r in warnings]
        assert tier.stats.puts == 1  # the put during the outage did not count as stored
    finally:
        server.stop()


def test_corrupt_disk_entry_falls_through_to_redis(tmp_path, redis_server, redis_prefix):
    cache = _three(tmp_path, "a", redis_server.url, redis_prefix)
    k = make_key("plan", b"p3")
    cache.put(k, b"value-3")
    (path,) = (tmp_path / "a").rglob("*.bin")
    path.write_bytes(path.read_bytes()[:-1] + b"X")
    fresh = _three(tmp_path, "a", redis_server.url, redis_prefix)
    assert fresh.get(k) == b"value-3"  # the damaged copy was never served
    st = fresh.stats()
    assert st["disk"]["errors"] == 1 and st["redis"]["hits"] == 1 and st["disk"]["puts"] == 1
    assert Cache([DiskTier(tmp_path / "a")]).get(k) == b"value-3"  # and repaired


def test_machine_local_records_never_reach_redis(tmp_path, redis_server, redis_prefix):
    """A record of a machine-local kind goes to the memory and disk tiers only: a second machine sharing the
    Redis (its own memory and disk) does not see a record that names this machine's inode; other kinds
    still share."""
    import redis
    from ostinato.cache import make_key
    here = _three(tmp_path, "here", redis_server.url, redis_prefix)
    there = _three(tmp_path, "there", redis_server.url, redis_prefix)
    local = make_key("data-verified", os.urandom(8).hex())
    shared = make_key("program-ir", os.urandom(8).hex())
    here.put(local, b"1")
    here.put(shared, b"ir")
    assert here.get(local) == b"1" and here.tier("memory").get(local.digest).value == b"1"
    assert there.get(local) is None and there.tier("redis").get(local.digest) is None
    assert there.get(shared) == b"ir"
    client = redis.Redis(port=redis_server.port)
    try:
        assert len(client.keys(f"{redis_prefix}*")) >= 1                     # the shared entry is there
        assert not any(local.digest in k.decode() for k in client.keys(f"{redis_prefix}*"))
    finally:
        client.close()
