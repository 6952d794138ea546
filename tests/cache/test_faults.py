"""The compile cache under faults, end to end through ostinato.load and ostinato.compile: tampered
entries on disk, in Redis and in bundles (flipped bytes, broken JSON, a pickle payload under a valid
hash) are detected, dropped and recompiled, and never executed; a Redis that is down, killed, slow or
wants a password costs one warning and no wait over 2 s; a full filesystem costs the disk tier only."""
from __future__ import annotations

import errno
import logging
import os
import pickle
import shutil
import signal
import socket
import subprocess
import threading
import time

import pytest
import redis
import torch
from conftest import start_redis

import ostinato
from helpers import assert_same
from ostinato.cache import Cache, load_artifacts, save_artifacts, set_cache
from ostinato.cache import disk as disk_module
from ostinato.cache.disk import DiskTier
from ostinato.cache.entry import HEADER_SIZE, Entry, encode
from ostinato.cache.memory import MemoryTier
from ostinato.cache.redis_tier import RedisTier
from ostinato.program.ir_cache import cached_decode, ir_key
from ostinato.runtime import plan_cache


@pytest.fixture(autouse=True)
def _fresh_plan_memo():
    """Plans compiled by earlier tests are memoized in this process: each test starts without them."""
    plan_cache.memo.clear()
    yield
    plan_cache.memo.clear()


class Mlp(torch.nn.Module):
    def __init__(self, width: int = 8):
        super().__init__()
        self.a = torch.nn.Linear(width, 16)
        self.b = torch.nn.Linear(16, 4)

    def forward(self, x):
        return self.b(torch.nn.functional.gelu(self.a(x))).softmax(-1)


def _saved_program(folder, width: int = 8, seed: int = 0):
    torch.manual_seed(seed)
    model = Mlp(width).eval()
    path = os.path.join(folder, f"mlp{width}-{seed}.ost")
    ostinato.export(model, (torch.randn(3, width),)).save(path)
    return model, path


class PickleBomb:
    """Unpickling it writes a file: proof that a payload was executed."""

    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


def _stored_blob(tier, digest: str) -> bytes:
    if isinstance(tier, DiskTier):
        return tier._entry_path(digest).read_bytes()
    return redis.Redis.from_url(tier.url).get(tier.prefix + "e:" + digest)


def _store_blob(tier, digest: str, blob: bytes) -> None:
    if isinstance(tier, DiskTier):
        tier._entry_path(digest).write_bytes(blob)
    else:
        redis.Redis.from_url(tier.url).set(tier.prefix + "e:" + digest, blob)


def tamper(tier, entry_digest: str, how: str, marker: str) -> None:
    """Damage the stored entry: bytes flipped in the value, its metadata JSON broken, or a well-formed
    entry (valid hashes) whose value is broken JSON or a pickle."""
    blob = bytearray(_stored_blob(tier, entry_digest))
    manifest = __import__("ostinato.cache.entry", fromlist=["decode"]).decode(bytes(blob), entry_digest).manifest
    if how == "flipped_value":
        blob[-3] ^= 0x5A
        _store_blob(tier, entry_digest, bytes(blob))
    elif how == "broken_meta_json":
        blob[HEADER_SIZE] = ord("[")
        blob[HEADER_SIZE + 5] = ord("}")
        _store_blob(tier, entry_digest, bytes(blob))
    elif how == "valid_entry_broken_json":
        tier.put(Entry(manifest, b'{"format": 1, "launches": [["aten.mm", '))
    elif how == "valid_entry_pickle":
        tier.put(Entry(manifest, pickle.dumps(PickleBomb(marker))))
    else:
        raise KeyError(how)


TAMPERS = ["flipped_value", "broken_meta_json", "valid_entry_broken_json", "valid_entry_pickle"]


@pytest.fixture(params=["disk", "redis"])
def one_tier(request, tmp_path):
    if request.param == "disk":
        yield DiskTier(tmp_path / "disk")
    else:
        server = request.getfixturevalue("redis_server")
        yield RedisTier(server.url, prefix=request.getfixturevalue("redis_prefix"))


@pytest.mark.parametrize("how", TAMPERS)
def test_tampered_plan_entry_is_dropped_and_recompiled(one_tier, how, tmp_path, caplog):
    set_cache(Cache([one_tier]))
    model, path = _saved_program(str(tmp_path), seed=3)
    prog = ostinato.load(path)
    exe = ostinato.compile(prog)
    digest = plan_cache.plan_key(prog, exe.backend).digest
    marker = str(tmp_path / "pwned")
    tamper(one_tier, digest, how, marker)
    plan_cache.memo.clear()
    errors = one_tier.stats.errors
    with caplog.at_level(logging.WARNING, logger="ostinato"):
        again = ostinato.compile(ostinato.load(path))
    assert again.plan_source == "compiled", "a tampered plan was used"
    x = torch.randn(3, 8)
    assert_same(again(x), model(x))
    assert not os.path.exists(marker), "a cached payload was unpickled"
    discarded = [r for r in caplog.records if "discard" in r.getMessage()]
    assert len(discarded) == 1, [r.getMessage() for r in caplog.records]
    if how in ("flipped_value", "broken_meta_json"):
        assert one_tier.stats.errors == errors + 1           # the tier itself refused it
    # The recompiled plan replaced the tampered entry: the next fresh compile reads it from the cache.
    plan_cache.memo.clear()
    third = ostinato.compile(ostinato.load(path))
    assert third.plan_source == "cache"
    assert_same(third(x), model(x))


@pytest.mark.parametrize("how", TAMPERS)
def test_tampered_decoded_program_entry_is_dropped_and_redecoded(one_tier, how, tmp_path):
    set_cache(Cache([one_tier]))
    _, path = _saved_program(str(tmp_path), seed=4)
    good = str(ostinato.load(path, verify=True).graph)
    fb_sha = ostinato.load(path).source.header.fb_sha256
    digest = ir_key(fb_sha).digest
    tamper(one_tier, digest, how, str(tmp_path / "pwned"))
    for verify in ("checksums", True, False):
        assert str(ostinato.load(path, verify=verify).graph) == good
    assert not os.path.exists(tmp_path / "pwned")
    cached = cached_decode(fb_sha)
    assert cached is not None and str(cached[0]) == good, "the good decode was not stored back"


def test_tampered_bundle_entries_are_skipped_or_recompiled(tmp_path, caplog):
    """A bundle is untrusted input too: an entry whose bytes were changed is skipped by its sha256; one
    forged with consistent hashes (a pickle or broken JSON as the plan) is loaded but never used."""
    warm = Cache([MemoryTier(), DiskTier(tmp_path / "warm")])
    set_cache(warm)
    model, path = _saved_program(str(tmp_path), seed=5)
    prog = ostinato.load(path)
    exe = ostinato.compile(prog)
    key = plan_cache.plan_key(prog, exe.backend)
    good_bundle = save_artifacts(warm)
    x = torch.randn(3, 8)
    marker = str(tmp_path / "pwned")
    for how in ("flipped", "pickle", "broken_json"):
        blob = bytearray(good_bundle)
        if how == "flipped":
            blob[-1] ^= 0xFF
        else:
            forged = Cache([MemoryTier()])
            value = pickle.dumps(PickleBomb(marker)) if how == "pickle" else b'{"format": 1, "num_slots": 3'
            forged.tiers[0].put(Entry(key.manifest(), value))
            blob = bytearray(save_artifacts(forged))
        target = Cache([MemoryTier(), DiskTier(tmp_path / f"target-{how}")])
        report = load_artifacts(bytes(blob), target)
        if how == "flipped":
            assert any("sha256" in reason for _, reason in report.skipped)
        else:
            assert report.loaded == [key.digest]
        set_cache(target)
        plan_cache.memo.clear()
        fresh = ostinato.compile(ostinato.load(path))
        assert_same(fresh(x), model(x))
        if how != "flipped":
            assert fresh.plan_source == "compiled"
        assert not os.path.exists(marker)


# -- Redis that fails --------------------------------------------------------------------------------

class SlowProxy:
    """A TCP proxy in front of a real Redis that holds every reply for ``delay`` seconds."""

    def __init__(self, port: int, delay: float = 1.0):
        self.target, self.delay = port, delay
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while not self.closed:
            try:
                client, _ = self.sock.accept()
            except OSError:
                return
            upstream = socket.create_connection(("127.0.0.1", self.target))
            threading.Thread(target=self._pipe, args=(client, upstream, 0.0), daemon=True).start()
            threading.Thread(target=self._pipe, args=(upstream, client, self.delay), daemon=True).start()

    @staticmethod
    def _pipe(src, dst, delay):
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                time.sleep(delay)
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.close()
                except OSError:
                    pass

    def close(self):
        self.closed = True
        self.sock.close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _password_redis(workdir: str) -> tuple[subprocess.Popen, int]:
    port = _free_port()
    proc = subprocess.Popen([shutil.which("redis-server"), "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                             "--appendonly", "no", "--dir", workdir, "--requirepass", "s3cret"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    client = redis.Redis(host="127.0.0.1", port=port, password="s3cret", socket_timeout=0.5)
    deadline = time.monotonic() + 10
    while True:
        try:
            client.ping()
            return proc, port
        except redis.RedisError:
            if time.monotonic() > deadline:
                proc.kill()
                pytest.fail("password-protected redis-server did not come up")
            time.sleep(0.05)


def _compile_and_check(folder: str, programs: list, log_records) -> dict:
    """Load, compile and run each program; the longest single Redis call and the total spent in them."""
    calls = []
    original = RedisTier._call

    def timed(self, what, fn):
        t0 = time.monotonic()
        try:
            return original(self, what, fn)
        finally:
            calls.append(time.monotonic() - t0)

    RedisTier._call = timed
    try:
        t0 = time.monotonic()
        for model, path in programs:
            exe = ostinato.compile(ostinato.load(path))
            x = torch.randn(3, model.a.in_features)
            assert_same(exe(x), model(x))
        wall = time.monotonic() - t0
    finally:
        RedisTier._call = original
    warnings = [r for r in log_records if r.levelno >= logging.WARNING and "redis" in r.getMessage()]
    return {"longest": max(calls, default=0.0), "total": sum(calls), "calls": len(calls), "wall": wall,
            "warnings": [r.getMessage() for r in warnings]}


@pytest.mark.parametrize("fault", ["down_at_start", "killed_mid_run", "slow_1s_per_reply", "password_required"])
def test_failing_redis_costs_one_warning_and_no_long_wait(fault, tmp_path, monkeypatch, caplog):
    folder = str(tmp_path)
    programs = [_saved_program(folder, width=w, seed=10 + w) for w in (4, 6, 8)]
    cleanup = []
    if fault == "down_at_start":
        url = f"redis://127.0.0.1:{_free_port()}/0"
    elif fault == "killed_mid_run":
        server = start_redis(str(tmp_path))
        cleanup.append(server.stop)
        url = server.url
    elif fault == "slow_1s_per_reply":
        server = start_redis(str(tmp_path))
        proxy = SlowProxy(server.port, delay=1.0)
        cleanup += [server.stop, proxy.close]
        url = f"redis://127.0.0.1:{proxy.port}/0"
    else:
        proc, port = _password_redis(str(tmp_path))
        cleanup.append(lambda: (proc.kill(), proc.wait()))
        url = f"redis://127.0.0.1:{port}/0"
    try:
        monkeypatch.setenv("OSTINATO_REDIS_URL", url)
        monkeypatch.setenv("OSTINATO_CACHE_DIR", str(tmp_path / "disk"))
        set_cache(None)     # built from the environment: memory, disk, Redis
        plan_cache.memo.clear()
        with caplog.at_level(logging.INFO, logger="ostinato"):
            if fault == "killed_mid_run":
                first = _compile_and_check(folder, programs[:1], caplog.records)
                assert first["warnings"] == [] and ostinato.cache.stats()["redis"]["puts"] >= 1
                server.proc.send_signal(signal.SIGKILL)
                server.proc.wait()
                programs = programs[1:]
            res = _compile_and_check(folder, programs, caplog.records)
        print(f"\nredis {fault}: {res['calls']} calls, longest {res['longest']:.3f} s, total {res['total']:.3f} s, "
              f"compile+run of {len(programs)} programs {res['wall']:.2f} s, warning: {res['warnings']}")
        assert len(res["warnings"]) == 1, res["warnings"]
        assert res["longest"] < 2.0 and res["total"] < 2.0, res
        assert ostinato.cache.stats()["redis"]["errors"] == 1
        assert ostinato.cache.stats()["disk"]["puts"] >= len(programs)   # the local tiers carried on
    finally:
        for stop in cleanup:
            stop()


# -- a full filesystem -------------------------------------------------------------------------------

def _no_space_for(root: str, monkeypatch) -> None:
    """Writes of files under ``root`` fail with ENOSPC after half their bytes (as a full disk does)."""
    real_fdopen = os.fdopen

    class Full:
        def __init__(self, f):
            self.f = f

        def write(self, data):
            self.f.write(data[:len(data) // 2])
            raise OSError(errno.ENOSPC, "No space left on device")

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.f.close()

    def fdopen(fd, *args, **kwargs):
        f = real_fdopen(fd, *args, **kwargs)
        try:
            where = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            return f
        return Full(f) if where.startswith(root) else f

    monkeypatch.setattr(disk_module.os, "fdopen", fdopen)


def _try_tiny_tmpfs(mount_at: str) -> bool:
    if os.geteuid() != 0 or shutil.which("mount") is None:
        return False
    os.makedirs(mount_at, exist_ok=True)
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", mount_at], capture_output=True)
    return r.returncode == 0


@pytest.mark.parametrize("how", ["enospc_writes", "tiny_tmpfs"])
def test_full_filesystem_costs_only_the_disk_tier(how, tmp_path, monkeypatch, caplog):
    root = str(tmp_path / "cachefs")
    os.makedirs(root)
    mounted = how == "tiny_tmpfs" and _try_tiny_tmpfs(root)
    if how == "tiny_tmpfs" and not mounted:
        pytest.skip("cannot mount a tmpfs here (needs root and mount rights)")
    try:
        if mounted:
            with open(os.path.join(root, "filler"), "wb", buffering=0) as f:     # fill it
                try:
                    while True:
                        f.write(b"\0" * 4096)
                except OSError as e:
                    assert e.errno == errno.ENOSPC
        else:
            _no_space_for(root, monkeypatch)
        monkeypatch.setenv("OSTINATO_CACHE_DIR", root)
        set_cache(None)
        plan_cache.memo.clear()
        programs = [_saved_program(str(tmp_path), width=w, seed=20 + w) for w in (4, 8)]
        with caplog.at_level(logging.WARNING, logger="ostinato"):
            for model, path in programs:
                for verify in (True, "checksums"):
                    exe = ostinato.compile(ostinato.load(path, verify=verify))
                    x = torch.randn(3, model.a.in_features)
                    assert_same(exe(x), model(x))
        st = ostinato.cache.stats()["disk"]
        assert st["errors"] >= 1 and st["puts"] == 0, st
        disk_warnings = [r for r in caplog.records if "disk tier failed" in r.getMessage()]
        assert len(disk_warnings) == 1, [r.getMessage() for r in caplog.records]
        leftovers = [os.path.join(d, f) for d, _, fs in os.walk(root) for f in fs if f != "filler"]
        assert not [p for p in leftovers if ".tmp-" in p], leftovers      # no partial file left behind
        for p in leftovers:     # whatever did get written is whole
            assert p.endswith(".json") or DiskTier(root).get(os.path.basename(p)[:-4]) is not None
    finally:
        if mounted:
            subprocess.run(["umount", root], capture_output=True)
