"""What a fresh process's first cuBLAS and attention calls cost, and whether warming the libraries in a
background thread while the main thread does Python work (a warm start's load and compile) takes that
cost off the first call. Each variant runs in its own fresh process.

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
dtype, seq, busy, warm = getattr(torch, sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]), sys.argv[4] == "1"
torch.cuda.init(); torch.empty(1, device="cuda"); torch.cuda.synchronize()

def libraries():
    a = torch.zeros(8, 64, device="cuda", dtype=dtype)
    F.linear(a, torch.zeros(64, 64, device="cuda", dtype=dtype))
    q = torch.zeros(1, 2, 8, 64, device="cuda", dtype=dtype)
    F.scaled_dot_product_attention(q, q, q, is_causal=True)
    torch.cuda.synchronize()

t0 = time.perf_counter()
thread = threading.Thread(target=libraries) if warm else None
if thread is not None:
    thread.start()
x = 0
while time.perf_counter() - t0 < busy:     # the main thread's Python work (load + compile)
    x += 1
if thread is not None:
    thread.join()
out = {"warm_thread": warm, "busy_s": round(time.perf_counter() - t0, 3), "python_steps": x}
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
    for warm in ("0", "1", "0", "1"):
        p = subprocess.run([sys.executable, "-c", CHILD, args.dtype, str(args.seq), str(args.busy), warm],
                           capture_output=True, text=True, timeout=300)
        print(p.stdout.strip() or p.stderr[-2000:], flush=True)


if __name__ == "__main__":
    main()
