"""What the batch-32 fold plan's primitives cost on a GPU, before building it (issue #15, 6 launches a layer).

docs/architecture.md's plan for a batched decode layer at 6 launches with every product on cuBLAS: each
RMSNorm folded into the next products' weights (``rstd(x) * (x @ (W * w)^T)``), the products kept in fp32
until the scale (``torch.mm(..., out_dtype=torch.float32)``, ``aten.mm.dtype``), and each residual add the
beta=1 accumulation of the product before it, in place (``x.addmm_(h, W^T)``). This times, on one GPU,
each primitive against what the layer runs today, every figure the median of CUDA-graph replays of one
op (so launch overhead is out of it, as in a replayed step):

- ``mm_bf16`` / ``mm_f32_out``: x [rows, K] @ W^T, bf16 out / fp32 out (is aten.mm.dtype there, and as fast?);
- ``mm_then_add`` / ``addmm_inplace``: h @ W^T then a residual add (two kernels, eager's) / one in-place
  cuBLAS call with beta=1;
- ``add_rms_norm``: today's fused add + RMSNorm launch (here torch's ops, for scale: an upper bound).

It also checks that the fp32-out product and the in-place accumulation equal their references.

    python bench/fold_primitives.py --out fold_primitives.json
"""
from __future__ import annotations

import argparse
import json
import platform
import statistics

import torch

# Llama-3.2-1B's and a hidden-4096 Llama's products: (name, K, N)
SHAPES = (("1b_qkv", 2048, 3072), ("1b_gate_up", 2048, 16384), ("1b_o", 2048, 2048), ("1b_down", 8192, 2048),
          ("4096_qkv", 4096, 6144), ("4096_gate_up", 4096, 28672), ("4096_o", 4096, 4096),
          ("4096_down", 14336, 4096))


def graph_time(fn, reps: int = 50, trials: int = 7) -> float:
    """Median microseconds of one call of ``fn``, replayed ``reps`` times per trial in a CUDA graph."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(reps):
            fn()
    g.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(trials):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b) * 1e3 / reps)
    return statistics.median(times)


def run(rows: int) -> list[dict]:
    out = []
    dev = "cuda"
    for name, k, n in SHAPES:
        x = torch.randn(rows, k, device=dev, dtype=torch.bfloat16)
        w = (torch.randn(n, k, device=dev) / k ** 0.5).bfloat16()
        r = torch.randn(rows, n, device=dev, dtype=torch.bfloat16)
        y = torch.empty(rows, n, device=dev, dtype=torch.bfloat16)
        row = {"shape": name, "rows": rows, "K": k, "N": n, "weight_MB": n * k * 2 / 1e6}
        row["mm_bf16_us"] = graph_time(lambda: torch.mm(x, w.t(), out=y))
        try:
            y32 = torch.mm(x, w.t(), out_dtype=torch.float32)
            ref = x.float() @ w.float().t()
            row["mm_f32_out_max_err"] = float((y32 - ref).abs().max() / ref.abs().max())
            row["mm_f32_out_us"] = graph_time(lambda: torch.mm(x, w.t(), out_dtype=torch.float32))
        except Exception as e:  # noqa: BLE001 - the point is whether it exists here
            row["mm_f32_out_error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
        acc = r.clone()
        row["mm_then_add_us"] = graph_time(lambda: torch.add(torch.mm(x, w.t()), r, out=y))
        row["addmm_inplace_us"] = graph_time(lambda: acc.addmm_(x, w.t()))
        check = r.clone().addmm_(x, w.t())
        ref = (r.float() + x.float() @ w.float().t())
        row["addmm_inplace_max_err"] = float((check.float() - ref).abs().max() / ref.abs().max())
        if name.endswith("_o"):
            wn = torch.rand(n, device=dev, dtype=torch.bfloat16)

            def add_norm():
                s = torch.add(r, y)
                h = s.float()
                h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-5)
                return wn * h.bfloat16()
            row["add_rms_norm_torch_us"] = graph_time(add_norm)
        out.append(row)
        print(json.dumps(row), flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", default="32,1", help="comma-separated row counts (batch sizes of a decode step)")
    ap.add_argument("--out")
    a = ap.parse_args()
    results = [r for rows in a.rows.split(",") for r in run(int(rows))]
    meta = {"torch": torch.__version__, "cuda": torch.version.cuda, "device": torch.cuda.get_device_name(),
            "python": platform.python_version()}
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"meta": meta, "results": results}, f, indent=1)
    print(json.dumps(meta))


if __name__ == "__main__":
    main()
