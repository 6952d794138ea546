import json

import pytest
from conftest import run_python

from ostinato.cache import Cache, load_artifacts, make_key, save_artifacts
from ostinato.cache.bundle import BundleError
from ostinato.cache.disk import DiskTier
from ostinato.cache.entry import Entry
from ostinato.cache.keys import current_versions
from ostinato.cache.memory import MemoryTier

UNPACK = """
import argparse, sys
from ostinato.cli import cache as cli
p = argparse.ArgumentParser(); cli.add_arguments(p)
sys.exit(cli.run(p.parse_args(["unpack", sys.argv[1] if len(sys.argv) > 1 else {file!r}, "--json"])))
"""

READ_BACK = """
import json, sys
from ostinato.cache import Key, get_cache, stats
keys = json.loads({keys!r})
values = [get_cache().get(Key.from_manifest(m)) for m in keys]
print(json.dumps({{"got": [v is not None for v in values], "stats": stats()}}))
"""


def _warm(tmp_path):
    cache = Cache([MemoryTier(), DiskTier(tmp_path / "warm")])
    keys = [make_key("plan", f"program-{i}".encode()) for i in range(5)]
    for i, k in enumerate(keys):
        cache.put(k, f"lowered plan {i}".encode() * 50)
    # One entry in memory only: a bundle carries the memory tier too.
    mem_only = make_key("kernel", b"k0")
    cache.tiers[0].put(Entry.of(mem_only, b"kernel"))
    keys.append(mem_only)
    foreign = [
        make_key("plan", b"gpu", target={"backend": "cuda", "arch": "sm_90"}),
        make_key("plan", b"arm", target={"backend": "cpu", "arch": "aarch64-NO AVX"}),
        make_key("plan", b"old", versions={**current_versions(), "torch": "2.11.0"}),
    ]
    for k in foreign:
        cache.put(k, b"not for this machine")
    return cache, keys, foreign


def test_pack_unpack_in_fresh_process_gives_all_hits(tmp_path):
    cache, keys, foreign = _warm(tmp_path)
    bundle = tmp_path / "warm.ostcache"
    bundle.write_bytes(save_artifacts(cache))
    env = {"OSTINATO_CACHE_DIR": str(tmp_path / "empty")}
    report = json.loads(run_python(UNPACK.format(file=str(bundle)), env=env))
    assert report["loaded"] == len(keys)
    reasons = {s["digest"]: s["reason"] for s in report["skipped"]}
    assert set(reasons) == {k.digest for k in foreign}
    assert "cuda" in reasons[foreign[0].digest]
    assert "target.arch" in reasons[foreign[1].digest]
    assert "versions.torch" in reasons[foreign[2].digest]
    # A second fresh process, only the unpacked directory to go on: every lookup hits on disk.
    out = json.loads(run_python(READ_BACK.format(keys=json.dumps([k.manifest() for k in keys])), env=env))
    assert out["got"] == [True] * len(keys)
    assert out["stats"]["disk"]["hits"] == len(keys) and out["stats"]["disk"]["misses"] == 0
    assert out["stats"]["disk"]["errors"] == 0
    assert not (tmp_path / "default-cache").exists() or not list((tmp_path / "default-cache").rglob("*.bin"))


def test_damaged_bundle_entries_are_skipped_and_garbage_rejected(tmp_path):
    cache, keys, _ = _warm(tmp_path)
    blob = bytearray(save_artifacts(cache))
    blob[-1] ^= 0xFF  # last value's last byte
    target = Cache([MemoryTier()])
    report = load_artifacts(bytes(blob), target)
    assert len(report.loaded) + len(report.skipped) == len(keys) + 3
    assert sum("sha256" in reason for _, reason in report.skipped) == 1
    assert len(report.loaded) >= len(keys) - 1
    with pytest.raises(BundleError):
        load_artifacts(b"PK\x03\x04 not a bundle at all", target)
    with pytest.raises(BundleError):
        load_artifacts(bytes(blob[:30]), target)


def test_cli_stats_clear_explain(tmp_path, capsys, monkeypatch):
    import argparse

    from ostinato.cache import get_cache
    from ostinato.cli import cache as cli

    p = argparse.ArgumentParser()
    cli.add_arguments(p)
    k = make_key("plan", "ab" * 32)
    get_cache().put(k, b"x" * 100)
    get_cache().put(make_key("plan", "ab" * 32, versions={**current_versions(), "torch": "2.0"}), b"y")
    assert cli.run(p.parse_args(["stats", "--json"])) == 0
    st = json.loads(capsys.readouterr().out)
    assert st["memory"]["puts"] == 2 and st["disk"]["bytes"] > 100
    assert cli.run(p.parse_args(["explain", "plan", "ab" * 32, "--arch", "sm_90", "--backend", "cuda"])) == 0
    out = capsys.readouterr().out
    assert "target.arch" in out and "target.backend" in out
    assert cli.run(p.parse_args(["clear"])) == 0
    assert get_cache().get(k) is None
    assert not list((tmp_path / "default-cache").rglob("*.bin"))
