"""8 processes sharing one cache directory for 20 rounds each, end to end: each round loads one of four
program files (a random verify mode), compiles it and checks its output, sometimes dropping its
in-process memo and memory tier so it reads the directory again; the directory's bound is small, so
entries are evicted while other processes read them. No process fails or gets a wrong output, no tier
sees a damaged entry, and the directory is left whole."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
from conftest import SRC

import ostinato
from ostinato.cache import Cache, set_cache
from ostinato.cache.disk import DiskTier
from ostinato.cache.entry import decode

PROCESSES, ROUNDS = 8, 20

WORKER = r"""
import json, random, sys
import torch, ostinato
from ostinato.cache import get_cache
from ostinato.runtime import plan_cache
files, data, seed = json.loads(sys.argv[1]), torch.load(sys.argv[2]), int(sys.argv[3])
rng = random.Random(seed)
wrong, sources = [], {}
for r in range(%d):
    i = rng.randrange(len(files))
    exe = ostinato.compile(ostinato.load(files[i], verify=rng.choice([True, "checksums", False])))
    sources[exe.plan_source] = sources.get(exe.plan_source, 0) + 1
    x, want = data[i]
    if not torch.allclose(exe(x), want, atol=1e-5, rtol=1e-5):
        wrong.append((r, i))
    if rng.random() < 0.5:
        plan_cache.memo.clear()
        get_cache().tiers[0].clear()
print(json.dumps({"wrong": wrong, "sources": sources, "stats": ostinato.cache.stats()}))
""" % ROUNDS


class Mlp(torch.nn.Module):
    def __init__(self, width):
        super().__init__()
        self.a = torch.nn.Linear(width, 32)
        self.b = torch.nn.Linear(32, 4)

    def forward(self, x):
        return self.b(torch.relu(self.a(x))).log_softmax(-1)


@pytest.mark.slow
def test_eight_processes_share_one_cache_directory(tmp_path):
    files, data = [], []
    for i, width in enumerate((4, 6, 8, 12)):
        torch.manual_seed(i)
        model = Mlp(width).eval()
        x = torch.randn(3, width)
        path = str(tmp_path / f"m{i}.ost")
        ostinato.export(model, (x,)).save(path)
        files.append(path)
        with torch.no_grad():
            data.append((x, model(x)))
    torch.save(data, tmp_path / "data.pt")
    shared = tmp_path / "shared"
    env = {**os.environ, "PYTHONPATH": SRC, "OSTINATO_CACHE_DIR": str(shared),
           "OSTINATO_CACHE_DISK_BYTES": "12000"}   # a few entries: evictions race with reads
    env.pop("OSTINATO_REDIS_URL", None)
    procs = [subprocess.Popen([sys.executable, "-c", WORKER, json.dumps(files), str(tmp_path / "data.pt"), str(s)],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for s in range(PROCESSES)]
    reports = []
    for p in procs:
        out, err = p.communicate(timeout=600)
        assert p.returncode == 0, err[-3000:]
        reports.append(json.loads(out.strip().splitlines()[-1]))
    for i, r in enumerate(reports):
        assert r["wrong"] == [], f"process {i}: wrong outputs at (round, program) {r['wrong']}"
        assert r["stats"]["disk"]["errors"] == 0 and r["stats"]["memory"]["errors"] == 0, r["stats"]
        assert sum(r["sources"].values()) == ROUNDS
    assert sum(r["stats"]["disk"]["hits"] for r in reports) > 0, "the processes never shared an entry"
    assert sum(r["stats"]["disk"]["evictions"] for r in reports) > 0, "the bound never evicted: no race tested"
    entries = list(shared.rglob("*.bin"))
    print(f"\n{len(entries)} entries left, {sum(p.stat().st_size for p in entries)} bytes; disk hits, evictions: "
          f"{sum(r['stats']['disk']['hits'] for r in reports)}, {sum(r['stats']['disk']['evictions'] for r in reports)}")
    assert not list(shared.rglob(".tmp-*")), "a temporary file was left behind"
    for path in entries:      # every entry left is whole and under its own digest
        decode(path.read_bytes(), path.stem)
    # The directory still serves compiles (from whatever entries survived), with no damaged entry.
    from ostinato.runtime import plan_cache
    tier = DiskTier(shared, max_bytes=12000)
    set_cache(Cache([tier]))
    plan_cache.memo.clear()
    for path, (x, want) in zip(files, data):
        torch.testing.assert_close(ostinato.compile(ostinato.load(path))(x), want)
    assert tier.stats.errors == 0
