"""What a fresh process's first cuBLAS and attention calls cost, and whether warming the libraries in a
background thread while the main thread does Python work (a warm start's load and compile) takes that
cost off the first call. Each variant runs in its own fresh process, twice: no warming, a
thread warming at another shape (what ``compile`` does), a thread warming at the timed shape, and the main
thread warming at the timed shape while a worker thread does the Python work.

    python bench/library_init_probe.py [--dtype bfloat16] [--seq 16] [--busy 0.2]

Prints one JSON line per variant: the first and second call of a linear and of a causal SDPA, in ms.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys

CHILD = r"""
import json, sys, threading, time
import torch
import torch.nn.functional as F
dtype, seq, busy, mode = getattr(torch, sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]), sys.argv[4]
torch.cuda.init(); torch.empty(1, device="cuda"); torch.cuda.synchronize()
SHAPE = (1, 4, seq, 32)          # the timed SDPA's shape below

def libraries(shape=(1, 2, 8, 64)):
    a = torch.zeros(8, 64, device="cuda", dtype=dtype)
    F.linear(a, torch.zeros(64, 64, device="cuda", dtype=dtype))
    q = torch.zeros(*shape, device="cuda", dtype=dtype)
    F.scaled_dot_product_attention(q, q, q, is_causal=True)
    torch.cuda.synchronize()

def python_work():
    global steps
    t = time.perf_counter()
    while time.perf_counter() - t < busy:     # a warm start's Python work (load + compile)
        steps += 1

# none: no warming; thread: a thread warms at another shape while the main thread works (what compile
# does); thread-same: the same, at the timed shape; main-same: the main thread warms at the timed shape
# while a worker thread does the Python work
steps = 0
t0 = time.perf_counter()
if mode == "none":
    python_work()
elif mode in ("thread", "thread-same"):
    thread = threading.Thread(target=libraries, args=((SHAPE,) if mode == "thread-same" else ()))
    thread.start(); python_work(); thread.join()
else:
    worker = threading.Thread(target=python_work)
    worker.start(); libraries(SHAPE); worker.join()
out = {"mode": mode, "busy_s": round(time.perf_counter() - t0, 3), "python_steps": steps}
x = torch.randn(1, seq, 128, device="cuda", dtype=dtype)
w = torch.randn(384, 128, device="cuda", dtype=dtype)
q = torch.randn(1, 4, seq, 32, device="cuda", dtype=dtype)
for name, fn in (("linear", lambda: F.linear(x, w)),
                 ("sdpa", lambda: F.scaled_dot_product_attention(q, q, q, is_causal=True))):
    for k in ("first", "second"):
        t = time.perf_counter(); fn(); torch.cuda.synchronize()
        out[f"{name}_{k}_ms"] = round((time.perf_counter() - t) * 1e3, 3)
print(json.dumps(out))
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--seq", type=int, default=16)
    ap.add_argument("--busy", type=float, default=0.2, help="seconds of Python work on the main thread")
    args = ap.parse_args()
    for mode in ("none", "thread", "thread-same", "main-same") * 2:
        p = subprocess.run([sys.executable, "-c", CHILD, args.dtype, str(args.seq), str(args.busy), mode],
                           capture_output=True, text=True, timeout=300)
        print(p.stdout.strip() or p.stderr[-2000:], flush=True)


if __name__ == "__main__":
    main()
