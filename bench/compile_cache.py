"""Cold against warm ``ostinato.compile`` of the 64-layer tiny Llama, each in a fresh process.

Exports and saves the model once. Then, per round, one process compiles it with an empty cache
directory (cold: lowering and code generation, then the plan is stored) and one compiles it with the
directory the cold one filled (warm: the plan is read from disk). Each child reports its compile time,
its load time and the time to the first output; the median over rounds is printed.

    .venv/bin/python bench/compile_cache.py --json out.json
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import ostinato  # noqa: E402
from examples.tiny_decoder import tiny_llama  # noqa: E402

CHILD = """
import json, sys, time
t0 = time.perf_counter()
import torch, ostinato
t1 = time.perf_counter()
prog = ostinato.load(sys.argv[1])
t2 = time.perf_counter()
exe = ostinato.compile(prog)
t3 = time.perf_counter()
exe(torch.zeros(1, 1, dtype=torch.long), torch.tensor([0]))
t4 = time.perf_counter()
print(json.dumps({"source": exe.plan_source, "import_s": t1 - t0, "load_s": t2 - t1, "compile_s": t3 - t2,
                  "first_call_s": t4 - t3, "load_to_output_s": t4 - t1}))
"""


def child(path: str, cache_dir: str) -> dict:
    env = dict(os.environ, OSTINATO_CACHE_DIR=cache_dir,
               PYTHONPATH=os.pathsep.join([os.path.join(ROOT, "src"), os.environ.get("PYTHONPATH", "")]))
    env.pop("OSTINATO_REDIS_URL", None)
    out = subprocess.run([sys.executable, "-c", CHILD, path], env=env, capture_output=True, text=True,
                         check=True, timeout=600)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args()
    model, example = tiny_llama(args.layers)
    prog = ostinato.export(model, example)
    runs: dict[str, list[dict]] = {"cold": [], "warm": []}
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "tiny_llama.ost")
        prog.save(path)
        for r in range(args.rounds):
            cache_dir = os.path.join(tmp, f"cache{r}")
            runs["cold"].append(child(path, cache_dir))
            runs["warm"].append(child(path, cache_dir))
    for kind, want in (("cold", "compiled"), ("warm", "cache")):
        got = {r["source"] for r in runs[kind]}
        if got != {want}:
            raise SystemExit(f"{kind} compiles reported {got}, expected {want!r}")
    med = {kind: {k: statistics.median(r[k] for r in rs) * 1e3 for k in rs[0] if k.endswith("_s")}
           for kind, rs in runs.items()}
    result = {"model": f"TinyDecoder(dim=128, layers={args.layers})", "nodes": prog.num_nodes,
              "machine": {"cpu": platform.processor() or platform.machine(), "torch": torch.__version__,
                          "python": platform.python_version(), "ostinato": ostinato.__version__},
              "median_ms": med, "rounds": args.rounds,
              "compile_speedup": med["cold"]["compile_s"] / med["warm"]["compile_s"]}
    print(f"{result['model']}: {prog.num_nodes} nodes; median of {args.rounds} fresh processes each")
    for kind in ("cold", "warm"):
        m = med[kind]
        print(f"  {kind}: compile {m['compile_s']:.1f} ms, load {m['load_s']:.1f} ms, first call "
              f"{m['first_call_s']:.1f} ms, load→first output {m['load_to_output_s']:.1f} ms")
    print(f"  warm compile is {result['compile_speedup']:.2f}x faster than cold")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
