"""Where a warm start's time goes: export and run once (filling the caches), then, in a fresh process,
profile ostinato.load + compile + the first call (cProfile, top entries by cumulative time).

    PYTHONPATH=src python3 scripts/profile_warm_start.py --device cuda --dtype bfloat16
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

COLD = r"""
import sys; sys.path.insert(0, {root!r})
import torch, ostinato
from examples.tiny_decoder import TinyDecoder, decode_inputs
device, dtype, path = sys.argv[1], getattr(torch, sys.argv[2]), sys.argv[3]
torch.manual_seed(0)
model = TinyDecoder(dim=128, layers=64).eval().to(device=device, dtype=dtype)
prog = ostinato.export(model, tuple(t.to(device) for t in decode_inputs(0)))
prog.save(path)
ostinato.compile(ostinato.load(path, verify=False), device=device, replay=True)(*(t.to(device) for t in decode_inputs(0)))
"""

WARM = r"""
import sys, time, cProfile, pstats; sys.path.insert(0, {root!r})
import torch, ostinato
from examples.tiny_decoder import decode_inputs
device, path = sys.argv[1], sys.argv[3]
if device == "cuda":
    torch.cuda.init(); torch.empty(1, device="cuda"); torch.cuda.synchronize()
args = tuple(t.to(device) for t in decode_inputs(0))
pr = cProfile.Profile()
t0 = time.perf_counter(); pr.enable()
prog = ostinato.load(path, verify=False)
t1 = time.perf_counter()
exe = ostinato.compile(prog, device=device, replay=True)
t2 = time.perf_counter()
exe(*args)
if device == "cuda":
    torch.cuda.synchronize()
t3 = time.perf_counter(); pr.disable()
print(f"load {{t1-t0:.3f}} compile {{t2-t1:.3f}} first {{t3-t2:.3f}} (profiled)")
pstats.Stats(pr).sort_stats("cumulative").print_stats(40)
pstats.Stats(pr).sort_stats("tottime").print_stats(30)
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32")
    args = ap.parse_args()
    work = tempfile.mkdtemp(prefix="ostinato-warm-")
    env = dict(os.environ, OSTINATO_CACHE_DIR=os.path.join(work, "cache"), TRITON_CACHE_DIR=os.path.join(work, "t1"))
    path = os.path.join(work, "model.ost")
    subprocess.run([sys.executable, "-c", COLD.format(root=ROOT), args.device, args.dtype, path], env=env, check=True)
    env["TRITON_CACHE_DIR"] = os.path.join(work, "t2")
    subprocess.run([sys.executable, "-c", WARM.format(root=ROOT), args.device, args.dtype, path], env=env, check=True)


if __name__ == "__main__":
    main()
