"""ostinato.compile through the compile cache: cold, same-process, other-process and corrupt plans."""
from __future__ import annotations

import json
import logging
import subprocess
import sys
import textwrap

import pytest
import torch

import ostinato
from ostinato.backends.cpu.backend import CPUBackend
from ostinato.cache import Cache, make_key, set_cache
from ostinato.cache.disk import DiskTier
from ostinato.cache.memory import MemoryTier
from ostinato.errors import CacheError
from ostinato.runtime import plan_cache
from examples.tiny_decoder import TinyDecoder, decode_inputs
from conftest import ROOT
from helpers import assert_same


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    """A private process-wide cache (memory over disk), and an empty plan memo."""
    monkeypatch.setenv("OSTINATO_CACHE_DIR", str(tmp_path / "cache"))
    set_cache(None)
    plan_cache.memo.clear()
    yield tmp_path / "cache"
    set_cache(None)
    plan_cache.memo.clear()


def _decoder(batch: int = 1, seed: int = 0):
    torch.manual_seed(seed)
    model = TinyDecoder(dim=32, layers=3, heads=2, kv_heads=1, vocab=64, max_seq=16, batch=batch).eval()
    return model, ostinato.export(model, decode_inputs(0, batch=batch, vocab=64))


def _run(exe, steps: int = 3, batch: int = 1):
    gen = torch.Generator().manual_seed(5)
    return [exe(*decode_inputs(s, batch=batch, vocab=64, generator=gen)) for s in range(steps)]


def test_cold_memory_and_disk_hits_give_the_same_results(cache_dir, monkeypatch):
    _, prog = _decoder()
    cold = ostinato.compile(prog)
    assert cold.plan_source == "compiled"
    expected = _run(cold)
    assert ostinato.compile(prog).plan_source == "memory"
    # A new process has neither the memo nor the memory tier: only the disk entry.
    plan_cache.memo.clear()
    set_cache(Cache([MemoryTier(1 << 20), DiskTier(str(cache_dir), 1 << 30)]))

    def no_lowering(self, node):
        raise AssertionError(f"a warm compile lowered {node.op}")
    monkeypatch.setattr(CPUBackend, "lower", no_lowering)
    warm = ostinato.compile(prog)
    assert warm.plan_source == "cache"
    assert [l.op for l in warm.launches] == [l.op for l in cold.launches]
    for got, want in zip(_run(warm), expected):
        assert_same(got, want)
    assert ostinato.cache.stats()["disk"]["hits"] == 1


def test_cache_false_neither_reads_nor_writes(cache_dir):
    _, prog = _decoder()
    puts = ostinato.cache.stats()["disk"]["puts"]   # the export cache's entry of the program, if any
    assert ostinato.compile(prog, cache=False).plan_source == "compiled"
    assert ostinato.cache.stats()["disk"]["puts"] == puts
    assert ostinato.compile(prog, cache=False).plan_source == "compiled"


def test_key_follows_program_content_and_shapes(cache_dir):
    _, a = _decoder(seed=0)
    _, a2 = _decoder(seed=1)            # other weights, same graph: the same plan
    _, b = _decoder(batch=2)            # other input shapes: another plan
    backend = CPUBackend()
    ka, ka2, kb = (plan_cache.plan_key(p, backend) for p in (a, a2, b))
    assert ka.digest == ka2.digest and ka.digest != kb.digest
    ostinato.compile(a)
    why = ostinato.cache.get_cache().explain(make_key("plan", ka.content, dict(kb.target)))
    assert not why.hit and "target.shapes" in why.differs


def test_loaded_program_uses_the_file_hash(cache_dir, tmp_path):
    _, prog = _decoder()
    prog.save(tmp_path / "m.ost")
    loaded = ostinato.load(tmp_path / "m.ost")
    assert plan_cache.program_hash(loaded) == plan_cache.program_hash(prog)
    ostinato.compile(prog)
    assert ostinato.compile(loaded).plan_source == "memory"


@pytest.mark.parametrize("value", [b"not json", json.dumps({"format": 99}).encode(),
                                   b'{"format":1,"num_slots":0,"keep":[],"launches":[]}', "unknown-op", "bad-slot"])
def test_a_corrupt_plan_is_discarded_and_recompiled(cache_dir, caplog, value):
    _, prog = _decoder()
    expected = _run(ostinato.compile(prog, cache=False))
    key = plan_cache.plan_key(prog, CPUBackend())
    exe = ostinato.compile(prog)  # stores the good plan, then we overwrite it
    good = json.loads(ostinato.cache.get_cache().get(key))
    if value == "unknown-op":
        good["launches"][0][0] = "aten.os_system"
        value = json.dumps(good).encode()
    elif value == "bad-slot":
        good["launches"][0][2][0] = {"slot": 10 ** 6}
        value = json.dumps(good).encode()
    ostinato.cache.get_cache().put(key, value)
    plan_cache.memo.clear()
    with caplog.at_level(logging.WARNING, logger="ostinato"):
        exe = ostinato.compile(prog)
    assert exe.plan_source == "compiled"
    assert "discarding cached plan" in caplog.text
    for got, want in zip(_run(exe), expected):
        assert_same(got, want)
    # The recompiled plan replaced the bad one.
    plan_cache.memo.clear()
    assert ostinato.compile(prog).plan_source == "cache"


def test_decode_rejects_what_it_does_not_know():
    backend = CPUBackend()
    row = ["aten.neg", "n", [{"slot": 0}], {}, [1], False]
    ok = {"format": 1, "num_slots": 2, "keep": [1], "launches": [row]}
    launches, keep = plan_cache.decode_plan(json.dumps(ok).encode(), backend, 2)
    assert keep == {1} and launches[0].outs == (1,)
    for bad in ({**ok, "launches": [[*row[:2], [{"code": "print(1)"}], *row[3:]]]},
                {**ok, "launches": [[*row[:3], {"not an identifier": 1}, *row[4:]]]},
                {**ok, "launches": [[*row[:4], [7], False]]},
                {**ok, "keep": [5]}):
        with pytest.raises(CacheError):
            plan_cache.decode_plan(json.dumps(bad).encode(), backend, 2)
    with pytest.raises(plan_cache.Uncacheable):
        plan_cache._enc(object())


SCRIPT = textwrap.dedent("""
    import json, sys, torch, ostinato
    from ostinato.runtime import plan_cache
    from ostinato.backends.cpu.backend import CPUBackend
    prog = ostinato.load(sys.argv[1])
    exe = ostinato.compile(prog)
    gen = torch.Generator().manual_seed(3)
    out = exe(torch.randint(0, 64, (1, 1), generator=gen), torch.tensor([0]))
    print(json.dumps({"source": exe.plan_source, "key": plan_cache.plan_key(prog, CPUBackend()).digest,
                      "sum": float(out.double().sum())}))
""")


def test_two_fresh_processes_share_the_plan_through_the_disk(tmp_path):
    _, prog = _decoder()
    prog.save(tmp_path / "m.ost")
    env = {"OSTINATO_CACHE_DIR": str(tmp_path / "shared-cache"), "PYTHONPATH": f"{ROOT}/src",
           "PATH": "/usr/bin:/bin"}
    runs = [json.loads(subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path / "m.ost")], env=env,
                                      capture_output=True, text=True, timeout=300, check=True).stdout)
            for _ in range(2)]
    assert [r["source"] for r in runs] == ["compiled", "cache"]
    assert runs[0]["key"] == runs[1]["key"] and runs[0]["sum"] == runs[1]["sum"]


COMPILE_AND_REPORT = textwrap.dedent("""
    import json, sys, torch, ostinato
    exe = ostinato.compile(ostinato.load(sys.argv[1]))
    out = exe(torch.tensor([[5]]), torch.tensor([0]))
    print(json.dumps({"source": exe.plan_source, "stats": ostinato.cache.stats(),
                      "sum": float(out.double().sum())}))
""")


def _py(code_or_args, cache: str, *argv):
    env = {"OSTINATO_CACHE_DIR": cache, "PYTHONPATH": f"{ROOT}/src", "PATH": "/usr/bin:/bin"}
    cmd = [sys.executable, "-c", code_or_args, *argv] if isinstance(code_or_args, str) else \
        [sys.executable, "-m", "ostinato", *code_or_args]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300, check=True).stdout


def test_a_packed_warm_cache_compiles_with_all_hits_elsewhere(tmp_path):
    _, prog = _decoder()
    prog.save(tmp_path / "m.ost")
    warm, empty, bundle = str(tmp_path / "warm"), str(tmp_path / "empty"), str(tmp_path / "b.ostcache")
    cold = json.loads(_py(COMPILE_AND_REPORT, warm, str(tmp_path / "m.ost")))
    # Four entries: the plan, the decoded program, its shapes-verified mark and the record that this file's
    # data matched its sha256 (program/ir_cache.py; the file is older than RACY_NS by then: a fresh process
    # imported torch first).
    assert cold["source"] == "compiled" and cold["stats"]["disk"]["puts"] == 4
    _py(["cache", "pack", bundle], warm)
    _py(["cache", "unpack", bundle], empty)
    again = json.loads(_py(COMPILE_AND_REPORT, empty, str(tmp_path / "m.ost")))
    # Every plan lookup hit (on disk, then filling memory); nothing was lowered or stored anew but this
    # machine's own record of the file's checked data (a bundle does not carry one: it names an inode).
    assert again["source"] == "cache" and again["sum"] == cold["sum"]
    disk = again["stats"]["disk"]
    assert disk["hits"] == 3 and disk["misses"] == 1 and disk["puts"] == 1 and disk["errors"] == 0
