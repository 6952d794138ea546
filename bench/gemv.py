"""Matmul groups (codegen/linear.py) against cuBLAS at decode shapes: one row, an RMSNorm before the
projection (and SwiGLU after two, for the gated shapes), eight independent layers per step so the
kernels dominate. Runners, measured in one run with their replays interleaved:

- ``cublas``: ostinato with matmul groups off (the norm's kernel, then cuBLAS), replayed;
- ``gemv``: ostinato with matmul groups, the launcher's block sizes (``linear_blocks``);
- ``gemv NBLOCKxRBLOCKwW``: the same with forced block sizes (``--sweep``): the data for the heuristic.

Reported per shape: microseconds per layer and the weights' read rate (GB/s). Every runner's outputs
are checked against eager first.

    PYTHONPATH=src python bench/gemv.py --json out.json [--sweep]
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src"))

import ostinato  # noqa: E402
from ostinato.backends.cuda.kernels import fused  # noqa: E402

LAYERS = 8
# (name, K, N, gated): Llama-3.2-1B's qkv, o, gate_up (+SwiGLU), down, lm_head; the hidden-4096
# decoder's; Gemma-2B's lm_head
SHAPES = [("qkv-2048x3072", 2048, 3072, False), ("o-2048x2048", 2048, 2048, False),
          ("gate_up-2048x2x8192", 2048, 8192, True), ("down-8192x2048", 8192, 2048, False),
          ("qkv-4096x12288", 4096, 12288, False), ("gate_up-4096x2x11008", 4096, 11008, True),
          ("lm_head-2048x128256", 2048, 128256, False)]


class NormProj(torch.nn.Module):
    def __init__(self, k: int, n: int, gated: bool):
        super().__init__()
        self.w = torch.nn.ParameterList([torch.nn.Parameter(torch.rand(k) + 0.5) for _ in range(LAYERS)])
        self.a = torch.nn.ModuleList([torch.nn.Linear(k, n, bias=False) for _ in range(LAYERS)])
        self.b = torch.nn.ModuleList([torch.nn.Linear(k, n, bias=False) for _ in range(LAYERS)]) if gated else None
        self.gated = gated

    def forward(self, x):
        outs = []
        for i in range(LAYERS):
            xf = x.float()
            h = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6)).to(x.dtype) * self.w[i]
            outs.append(F.silu(self.a[i](h)) * self.b[i](h) if self.gated else self.a[i](h))
        return outs


def time_replays(fns: dict, x, reps: int, rounds: int) -> dict[str, float]:
    """Median over rounds of the mean time per call (ms), the runners interleaved."""
    import statistics
    times = {k: [] for k in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            fn(x)
            torch.cuda.synchronize()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(reps):
                fn(x)
            end.record()
            torch.cuda.synchronize()
            times[name].append(start.elapsed_time(end) / reps)
    return {k: statistics.median(v) for k, v in times.items()}


def build(prog, x, linear: bool, blocks=None):
    os.environ["OSTINATO_FUSE_LINEAR"] = "1" if linear else "0"
    fused._LAUNCHERS.clear()
    saved = fused.linear_blocks
    if blocks is not None:
        fused.linear_blocks = lambda m, n, k, s: blocks
    try:
        exe = ostinato.compile(prog, device="cuda", replay=True, cache=False)
        exe(x)          # plans made, kernels compiled, the step captured
        torch.cuda.synchronize()
    finally:
        fused.linear_blocks = saved
    return exe


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json")
    ap.add_argument("--sweep", action="store_true", help="also time forced block sizes")
    ap.add_argument("--shapes", default="", help="comma-separated substrings of shape names")
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    torch.manual_seed(0)
    report = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "layers": LAYERS, "shapes": {}}
    for name, k, n, gated in SHAPES:
        if args.shapes and not any(s in name for s in args.shapes.split(",")):
            continue
        model = NormProj(k, n, gated).to("cuda", torch.bfloat16).eval()
        x = torch.randn(1, 1, k, device="cuda", dtype=torch.bfloat16)
        prog = ostinato.export(model, (x,))
        fns = {"cublas": build(prog, x, False), "gemv": build(prog, x, True)}
        if args.sweep:
            for nb in (4, 8, 16, 32, 64):
                for rb in (64, 128, 256, 512):
                    for w in (4, 8):
                        if nb * rb * (2 if gated else 1) <= 16384:
                            fns[f"gemv {nb}x{rb}w{w}"] = build(prog, x, True, (nb, rb, w))
        with torch.no_grad():
            ref = model(x)
        for fname, fn in fns.items():
            for got, want in zip(fn(x), ref):
                err = (got.float() - want.float()).abs().max().item()
                scale = want.float().abs().max().item() + 1e-6
                assert err / scale < 3e-2, f"{name} {fname}: max error {err} (scale {scale})"
        ms = time_replays(fns, x, args.reps, args.rounds)
        weight_bytes = k * n * (2 if gated else 1) * 2
        rows = {f: {"us_per_layer": round(t * 1000 / LAYERS, 2),
                    "GBps": round(weight_bytes * LAYERS / (t * 1e-3) / 1e9, 1)} for f, t in ms.items()}
        best = min(rows, key=lambda f: rows[f]["us_per_layer"])
        report["shapes"][name] = {"rows": rows, "best": best}
        print(f"{name}: cublas {rows['cublas']['us_per_layer']} us ({rows['cublas']['GBps']} GB/s), "
              f"gemv {rows['gemv']['us_per_layer']} us ({rows['gemv']['GBps']} GB/s), best {best} "
              f"{rows[best]['us_per_layer']} us", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
