"""Probe: decode-shaped GEMVs (one row) as the generated kernels run them, against the same loop with more
software-pipeline stages and against split-K with an in-kernel fixup (each program reduces a slice of K into
an fp32 partial; the program that arrives last for its columns sums the partials in a fixed order, rounds,
and resets its counter: one launch, deterministic). Each shape runs as 16 launches over 16 different weights
(more than the L2 holds) in one CUDA graph; outputs are checked against torch first.

    python bench/splitk_probe.py --json out.json
"""
from __future__ import annotations

import argparse
import json
import statistics

import torch
import triton
import triton.language as tl

from graph_timing import interleaved_graph_times


@triton.jit
def gemv(x, w, out, K, NBLOCK: tl.constexpr, RBLOCK: tl.constexpr):
    col = tl.program_id(0) * NBLOCK + tl.arange(0, NBLOCK)
    acc = tl.zeros([NBLOCK, RBLOCK], tl.float32)
    for r0 in range(0, K, RBLOCK):
        r = r0 + tl.arange(0, RBLOCK)
        a = tl.load(x + r).to(tl.float32)
        acc += tl.load(w + col[:, None].to(tl.int64) * K + r[None, :]).to(tl.float32) * a[None, :]
    tl.store(out + col, tl.sum(acc, 1).to(tl.bfloat16))


@triton.jit
def gemv_splitk(x, w, out, ws, cnt, K, N, KS, S: tl.constexpr, NBLOCK: tl.constexpr, RBLOCK: tl.constexpr):
    pid = tl.program_id(0)
    sid = tl.program_id(1)
    col = pid * NBLOCK + tl.arange(0, NBLOCK)
    acc = tl.zeros([NBLOCK, RBLOCK], tl.float32)
    for r0 in range(sid * KS, sid * KS + KS, RBLOCK):
        r = r0 + tl.arange(0, RBLOCK)
        a = tl.load(x + r).to(tl.float32)
        acc += tl.load(w + col[:, None].to(tl.int64) * K + r[None, :]).to(tl.float32) * a[None, :]
    tl.store(ws + sid * N + col, tl.sum(acc, 1))
    tl.debug_barrier()
    old = tl.atomic_add(cnt + pid, 1, sem="acq_rel", scope="gpu")
    if old == S - 1:
        tot = tl.zeros([NBLOCK], tl.float32)
        for s in range(S):
            tot += tl.load(ws + s * N + col, cache_modifier=".cg")
        tl.store(out + col, tot.to(tl.bfloat16))
        tl.atomic_xchg(cnt + pid, 0, sem="relaxed", scope="gpu")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--rounds", type=int, default=5)
    a = ap.parse_args()
    dev, dt, layers = "cuda", torch.bfloat16, 16
    shapes = {"down-8192x2048": (8192, 2048), "o-2048x2048": (2048, 2048), "qkv-2048x3072": (2048, 3072),
              "up-2048x8192": (2048, 8192)}
    report = {"device": torch.cuda.get_device_name(), "triton": triton.__version__, "torch": torch.__version__,
              "shapes": {}}
    for sname, (K, N) in shapes.items():
        g = torch.Generator(device=dev).manual_seed(0)
        ws = [(torch.randn(N, K, device=dev, generator=g) * 0.02).to(dt) for _ in range(layers)]
        x = torch.randn(K, device=dev, generator=g).to(dt)
        ref = [(w.float() @ x.float()) for w in ws]
        outs = [torch.empty(N, device=dev, dtype=dt) for _ in range(layers)]
        variants = {}
        for nb, rb in ((8, 512), (4, 512), (8, 256)):
            for st in (1, 2, 3, 4, 6):
                variants[f"plain {nb}x{rb} s{st}"] = (
                    lambda nb=nb, rb=rb, st=st: [gemv[(N // nb,)](x, w, o, K, NBLOCK=nb, RBLOCK=rb, num_stages=st)
                                                 for w, o in zip(ws, outs)])
        for S in (2, 4, 8):
            for nb, rb in ((8, 512), (8, 256), (16, 256), (4, 512)):
                if K // S < rb:
                    continue
                wsp = [torch.empty(S, N, device=dev, dtype=torch.float32) for _ in range(layers)]
                cnt = [torch.zeros(N // nb, device=dev, dtype=torch.int32) for _ in range(layers)]
                variants[f"splitk S{S} {nb}x{rb}"] = (
                    lambda S=S, nb=nb, rb=rb, wsp=wsp, cnt=cnt: [
                        gemv_splitk[(N // nb, S)](x, w, o, p, c, K, N, K // S, S=S, NBLOCK=nb, RBLOCK=rb)
                        for w, o, p, c in zip(ws, outs, wsp, cnt)])
        graphs, errs = {}, {}
        for name, fn in variants.items():
            try:
                fn(); fn()
                torch.cuda.synchronize()
                errs[name] = max(float((o.float() - r).abs().max()) for o, r in zip(outs, ref))
                gr = torch.cuda.CUDAGraph()
                with torch.cuda.graph(gr):
                    fn()
                gr.replay(); torch.cuda.synchronize()
                errs[name] = max(errs[name], max(float((o.float() - r).abs().max()) for o, r in zip(outs, ref)))
                graphs[name] = gr
            except Exception as e:   # noqa: BLE001
                errs[name] = f"failed: {str(e).splitlines()[0][:200]}"
        times = interleaved_graph_times(graphs, a.reps, a.rounds)
        us = {k: statistics.median(v) * 1e3 / layers for k, v in times.items()}
        nbytes = N * K * 2
        report["shapes"][sname] = {"us_per_launch": us, "TBps": {k: nbytes / (v * 1e-6) / 1e12 for k, v in us.items()},
                                   "max_abs_err": errs}
        best = sorted(us.items(), key=lambda kv: kv[1])[:5]
        print(sname, "plain 8x512 s3:", round(us.get("plain 8x512 s3", -1), 2), "best:",
              [(k, round(v, 2), round(nbytes / (v * 1e-6) / 1e12, 2)) for k, v in best], flush=True)
        bad = {k: v for k, v in errs.items() if isinstance(v, str) or v > 0.05}
        if bad:
            print("  errors:", bad, flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
