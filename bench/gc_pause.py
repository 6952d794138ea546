"""Warm load + compile with and without the garbage-collector pause (src/ostinato/ir/bulk.py), in fresh
processes, interleaved: each process loads a saved program, compiles it for --device and runs it once,
and reports its phases and the time Python's collector spent in each (gc.callbacks).

The program is transformers' Mamba-130m shape (24 layers, hidden 768: 9412 nodes exported for CUDA's
pipeline), random weights, 32 tokens, fp32, or --layers fewer. The first run exports and saves it (not
timed); each process after that finds the data hash recorded.

    .venv/bin/python bench/gc_pause.py --out docs/benchmarks/gc_pause_cpu/results.json
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

CHILD = r"""
import gc, json, sys, time
t_import = time.perf_counter()
import torch, ostinato
t_import = time.perf_counter() - t_import
events = []
gc.callbacks.append(lambda phase, info: events.append((phase, info["generation"], time.perf_counter())))
marks = [time.perf_counter()]
prog = ostinato.load(sys.argv[1]); marks.append(time.perf_counter())
exe = ostinato.compile(prog, sys.argv[2]); marks.append(time.perf_counter())
with torch.no_grad():
    exe(torch.randint(0, 1000, (1, 32), device=sys.argv[2]))
if sys.argv[2] == "cuda":
    torch.cuda.synchronize()
marks.append(time.perf_counter())

def gc_in(a, b):
    total, full, start = 0.0, 0, {}
    for phase, gen, t in events:
        if not a <= t <= b:
            continue
        if phase == "start":
            start[gen] = t
            full += gen == 2
        else:
            total += t - start.get(gen, t)
    return round(total, 4), full
phases = ("load", "compile", "first_call")
print(json.dumps({"import_s": round(t_import, 3),
                  **{f"{p}_s": round(marks[i + 1] - marks[i], 4) for i, p in enumerate(phases)},
                  **{f"{p}_gc": gc_in(marks[i], marks[i + 1]) for i, p in enumerate(phases)}}))
"""


def export(path: str, layers: int) -> int:
    import warnings

    import torch
    sys.path[:0] = [os.path.join(ROOT, "src")]
    import ostinato
    from ostinato.passes.manager import DEFAULT_PIPELINE
    from transformers import MambaConfig, MambaForCausalLM
    warnings.simplefilter("ignore")
    torch.manual_seed(0)
    model = MambaForCausalLM(MambaConfig(hidden_size=768, num_hidden_layers=layers, state_size=16, expand=2,
                                         vocab_size=50280)).eval()

    class Logits(torch.nn.Module):
        def __init__(self, m):
            super().__init__()
            self.m = m

        def forward(self, ids):
            return self.m(input_ids=ids, use_cache=False).logits
    prog = ostinato.export(Logits(model), (torch.randint(0, 1000, (1, 32)),), passes=DEFAULT_PIPELINE, cache=False)
    prog.save(path)
    return len(prog.graph.nodes)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=24)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--out", default="gc_pause.json")
    args = ap.parse_args(argv)
    work = tempfile.mkdtemp(prefix="ost-gc-")
    path = os.path.join(work, "mamba.ost")
    env = dict(os.environ, OSTINATO_CACHE_DIR=os.path.join(work, "cache"),
               PYTHONPATH=os.pathsep.join([os.path.join(ROOT, "src"), os.environ.get("PYTHONPATH", "")]))
    os.environ["OSTINATO_CACHE_DIR"] = env["OSTINATO_CACHE_DIR"]
    nodes = export(path, args.layers)
    rows = {"paused": [], "not paused": []}
    subprocess.run([sys.executable, "-c", CHILD, path, args.device], env=env, check=True, capture_output=True)
    for _ in range(args.repeats):
        for name, flag in (("paused", "1"), ("not paused", "0")):
            p = subprocess.run([sys.executable, "-c", CHILD, path, args.device], env=dict(env, OSTINATO_GC_PAUSE=flag),
                               check=True, capture_output=True, text=True)
            rows[name].append(json.loads(p.stdout.strip().splitlines()[-1]))
            print(name, rows[name][-1], flush=True)
    summary = {name: {k: statistics.median(r[k] for r in runs) for k in ("load_s", "compile_s", "first_call_s")}
               for name, runs in rows.items()}
    print(json.dumps(summary))
    with open(args.out, "w") as f:
        json.dump({"layers": args.layers, "nodes": nodes, "device": args.device, "python": sys.version.split()[0],
                   "summary_median": summary, "runs": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
