"""An RMSNorm folded into the projection after it, in bf16: how far from float64 against eager's own error.

A batched decode step (more than 16 rows) keeps its projections on cuBLAS, which takes neither a norm
before nor a gating after it, so a Llama layer is 8 launches there (issue #15 asks for 6). One way to 6
at cuBLAS's speed (not built; docs/architecture.md, "Matmuls with their neighbours") folds each norm
into the product it feeds: ``rms_norm(x) * w @ W^T`` equals ``rstd(x) * (x @ (W * w)^T)``, since rstd
is one number per row. ``W * w`` is a constant (folded once at compile), and ``rstd`` is applied by the
kernel that reads the product anyway (attention, SwiGLU). This measures what that costs in accuracy:
eager's path (HF's LlamaRMSNorm, then nn.Linear, in bf16) and the folded one, each against the module
in float64, as the largest error over the largest reference value, on random rows of varied scale:

- ``folded``: the product written in bf16 and then scaled (cuBLAS's bf16 output);
- ``folded_f32``: the product kept in fp32 until the scale (a bf16 product with an fp32 output).

A LayerNorm folds too (``--layer``): ``layer_norm(x) * w + b @ W^T`` equals ``rstd(x) * (x @ V^T) + W @ b``
with ``V`` the rows of ``W * w`` less their means (the product subtracts the row's mean itself), so the
rounding of ``V`` to bf16 costs an error that grows with the rows' mean against their spread, unless the
rounding keeps each row's sum near 0 (fold_weights does; ``plain``: rounded to nearest alone). The rows
are drawn with a mean of ``ratio`` times their standard deviation (0, 1, 4, 16), and the folded path is
ostinato's own reference ops (ir/fold_ops.py: fold_weights, fold_bias, row_scale with ``center``).

    .venv/bin/python bench/fold_numerics.py [--layer] [--out FILE.json]
"""
from __future__ import annotations

import argparse
import json
import platform

import torch

SHAPES = ((2048, 3072), (2048, 16384), (4096, 6144), (4096, 28672))   # Llama-3.2-1B's and 8B's q/k/v, gate/up


def errors(hidden: int, out: int, rows: int = 32, eps: float = 1e-5, trials: int = 5) -> dict[str, float]:
    worst = {"eager": 0.0, "folded": 0.0, "folded_f32": 0.0}
    for _ in range(trials):
        x = (torch.randn(rows, hidden) * torch.rand(rows, 1) * 4).bfloat16()
        w = torch.empty(hidden).uniform_(0.5, 1.5).bfloat16()
        W = (torch.randn(out, hidden) / hidden ** 0.5).bfloat16()
        x64 = x.double()
        ref = (x64 * torch.rsqrt(x64.pow(2).mean(-1, keepdim=True) + eps) * w.double()) @ W.double().T
        rstd = torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + eps)
        eager = (w * (x.float() * rstd).bfloat16()) @ W.T
        folded_w = (W.float() * w.float()).bfloat16()
        folded = ((x @ folded_w.T).float() * rstd).bfloat16()
        folded_f32 = ((x.float() @ folded_w.float().T) * rstd).bfloat16()
        scale = ref.abs().max().item()
        for name, y in (("eager", eager), ("folded", folded), ("folded_f32", folded_f32)):
            worst[name] = max(worst[name], (y.double() - ref).abs().max().item() / scale)
    return worst


RATIOS = (0.0, 1.0, 4.0, 16.0)     # a LayerNorm's rows: mean / standard deviation


def layer_errors(hidden: int, out: int, ratio: float, rows: int = 32, eps: float = 1e-5,
                 trials: int = 5) -> dict[str, float]:
    """eager's LayerNorm (bf16 out) then the bf16 product, and the fold (fp32 product), against float64."""
    from ostinato.ir.fold_ops import fold_bias, fold_weights, linear_out, row_scale
    worst = {"eager": 0.0, "plain": 0.0, "folded_f32": 0.0}
    for _ in range(trials):
        spread = torch.rand(rows, 1) * 4 + 0.1
        x = ((torch.randn(rows, hidden) + ratio) * spread).bfloat16()
        w = torch.empty(hidden).uniform_(0.5, 1.5).bfloat16()
        b = torch.empty(hidden).uniform_(-0.5, 0.5).bfloat16()
        W = (torch.randn(out, hidden) / hidden ** 0.5).bfloat16()
        ref = torch.nn.functional.layer_norm(x.double(), (hidden,), w.double(), b.double(), eps) @ W.double().T
        eager = torch.nn.functional.layer_norm(x, (hidden,), w, b, eps) @ W.T
        (p,) = linear_out(x, fold_weights([W], w, 0.0, True), [out], torch.float32)
        folded = row_scale(p, x, eps, torch.bfloat16, fold_bias(W, b, None), True)
        v = W.float() * w.float()
        (p,) = linear_out(x, (v - v.mean(-1, keepdim=True)).bfloat16(), [out], torch.float32)
        plain = row_scale(p, x, eps, torch.bfloat16, fold_bias(W, b, None), True)
        scale = ref.abs().max().item()
        for name, y in (("eager", eager), ("plain", plain), ("folded_f32", folded)):
            worst[name] = max(worst[name], (y.double() - ref).abs().max().item() / scale)
    return worst


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", help="write the figures as JSON here")
    ap.add_argument("--layer", action="store_true", help="a LayerNorm folded (rows of several mean / spread ratios)")
    args = ap.parse_args()
    torch.manual_seed(0)
    rows = []
    if args.layer:
        print("| K -> N | mean / std | eager | folded, rounded to nearest | folded (fold_weights) |\n|---|---|---|---|---|")
        for hidden, out in SHAPES[:3]:
            for ratio in RATIOS:
                e = layer_errors(hidden, out, ratio)
                rows.append({"k": hidden, "n": out, "mean_over_std": ratio, **e})
                print(f"| {hidden} -> {out} | {ratio:g} | {e['eager']:.2e} | {e['plain']:.2e} | {e['folded_f32']:.2e} |")
        if args.out:
            with open(args.out, "w") as f:
                json.dump({"torch": torch.__version__, "machine": platform.machine(), "rows": 32, "trials": 5,
                           "norm": "layer_norm", "results": rows}, f, indent=1)
        return
    print("| K -> N | eager | folded (bf16 product) | folded (fp32 product) |\n|---|---|---|---|")
    for hidden, out in SHAPES:
        e = errors(hidden, out)
        rows.append({"k": hidden, "n": out, **e})
        print(f"| {hidden} -> {out} | {e['eager']:.2e} | {e['folded']:.2e} | {e['folded_f32']:.2e} |")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"torch": torch.__version__, "machine": platform.machine(), "rows": 32, "trials": 5,
                       "results": rows}, f, indent=1)


if __name__ == "__main__":
    main()
