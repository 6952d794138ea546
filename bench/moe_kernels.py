"""ost.moe_up and ost.moe_down on the GPU at real models' expert shapes: time per call against the torch
ops they replace (eager: the chosen experts' weights gathered, a batched product, the gating or the
weighted sum; the ops' references), and the rate at which each reads its chosen experts' weights.

Shapes (hidden K, expert width I, experts E, chosen k): Mixtral-8x7B (4096, 14336, 8, 2), Qwen3-30B-A3B
(2048, 768, 128, 8), OLMoE-1B-7B (2048, 1024, 64, 8), Qwen1.5-MoE-A2.7B (2048, 1408, 60, 4; and its shared
expert, 5632 wide: ost.moe_down_shared against moe_down then the shared expert's ops), at 1 and 4 tokens (or
``--tokens``), bf16, random weights and logits. From 2 tokens the launchers take the grouped kernels; their
time is shown beside the per-choice kernels' at the same step (``*_per_choice_us``). Each result is checked against the reference first (max |difference|). Times: CUDA events
around 50 calls after 10 warm-up calls, the median of 5 such repeats.

    python3 bench/moe_kernels.py --out moe_kernels.json
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src"))

from ostinato.backends.cuda.kernels import moe  # noqa: E402
from ostinato.ir import fused_ops  # noqa: E402

SHAPES = {"mixtral-8x7b": (4096, 14336, 8, 2), "qwen3-30b-a3b": (2048, 768, 128, 8), "olmoe-1b-7b": (2048, 1024, 64, 8),
          "qwen1.5-moe-a2.7b": (2048, 1408, 60, 4)}
# shapes with a shared expert (its width), sigmoid-gated and added to the routed experts' sum: ost.moe_down_shared
SHARED = {"qwen1.5-moe-a2.7b": 5632}


def _time(fn, calls: int = 50, repeats: int = 5) -> float:
    for _ in range(10):
        fn()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(calls):
            fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / calls * 1e3)
    return statistics.median(times)


def one(name: str, tokens: int, dtype=torch.bfloat16, compare: bool = True) -> dict:
    """One shape at ``tokens``; ``compare`` False (a sweep): the kernels' own times only."""
    k_dim, inter, experts, top_k = SHAPES[name]
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(tokens, k_dim, device="cuda", generator=g).to(dtype)
    logits = (torch.randn(tokens, experts, device="cuda", generator=g) * 2).to(dtype)
    w_up = (torch.randn(experts, 2 * inter, k_dim, device="cuda", generator=g) * 0.02).to(dtype)
    w_down = (torch.randn(experts, k_dim, inter, device="cuda", generator=g) * 0.02).to(dtype)
    f32 = torch.float32
    h_ref, ids = fused_ops.moe_up(x, logits, w_up, top_k, f32)
    h, ids_k = moe.moe_up(x, logits, w_up, top_k, f32)
    # rows whose choice differs (a tie of two scores, broken apart by torch.topk and the kernel) are left out
    same = ids_k == ids
    o_ref = fused_ops.moe_down(h_ref, ids, logits, w_down, top_k, f32, True, None, dtype)
    o = moe.moe_down(h_ref, ids, logits, w_down, top_k, f32, True, None, dtype)
    chosen = len(set(torch.topk(logits.float().softmax(-1), top_k).indices.flatten().tolist()))
    size = dtype.itemsize
    up_bytes, down_bytes = chosen * 2 * inter * k_dim * size, chosen * k_dim * inter * size
    row = {"shape": name, "tokens": tokens, "K": k_dim, "I": inter, "E": experts, "k": top_k, "distinct_experts": chosen,
           "ids_differ": int((~same).sum().item()),
           "up_max_diff": (h.float() - h_ref.float())[same].abs().max().item(),
           "down_max_diff": (o.float() - o_ref.float()).abs().max().item()}
    for part, ours, ref, nbytes in (
            ("up", lambda: moe.moe_up(x, logits, w_up, top_k, f32), lambda: fused_ops.moe_up(x, logits, w_up, top_k, f32),
             up_bytes),
            ("down", lambda: moe.moe_down(h, ids, logits, w_down, top_k, f32, True, None, dtype),
             lambda: fused_ops.moe_down(h, ids, logits, w_down, top_k, f32, True, None, dtype), down_bytes)):
        t_ours = _time(ours)
        row[f"{part}_us"], row[f"{part}_TBps"] = round(t_ours, 2), round(nbytes / t_ours / 1e6, 2)
        if not compare:
            continue
        row[f"{part}_eager_us"] = round(_time(ref), 2)
        if moe.GROUPED_FROM <= tokens <= moe.MAX_TOKENS:   # the per-choice kernels at the same step
            saved, moe.GROUPED_FROM = moe.GROUPED_FROM, 10 ** 9
            try:
                row[f"{part}_per_choice_us"] = round(_time(ours), 2)
            finally:
                moe.GROUPED_FROM = saved
    if name in SHARED and compare:      # the down kernel with the shared expert, against it alone then the shared ops
        width = SHARED[name]
        gu = torch.randn(tokens, 2 * width + 1, device="cuda", generator=g).to(dtype)
        gate, up, logit = gu[:, :width], gu[:, width:2 * width], gu[:, -1:]
        w_s = (torch.randn(k_dim, width, device="cuda", generator=g) * 0.02).to(dtype)
        args = (h, ids, logits, w_down, top_k, f32, True, None, dtype, False, gate, up, "silu", w_s, logit)
        got, ref = moe.moe_down_shared(*args), fused_ops.moe_down_shared(*args)
        row["shared_max_diff"] = (got.float() - ref.float()).abs().max().item()
        def apart():
            experts = moe.moe_down(*args[:10])
            return experts + torch.sigmoid(logit) * torch.nn.functional.linear(fused_ops.swiglu(gate, up), w_s)
        t_ours, t_apart = _time(lambda: moe.moe_down_shared(*args)), _time(apart)
        row["down_shared_us"], row["down_then_shared_ops_us"] = round(t_ours, 2), round(t_apart, 2)
        row["down_shared_TBps"] = round((down_bytes + w_s.numel() * dtype.itemsize) / t_ours / 1e6, 2)
    return row


def sweep(name: str, tokens: int) -> list[dict]:
    """The kernels' time over their block choices (kernels/moe.py: _PROGRAMS, the programs aimed at, the up
    kernel's twice as many (_UP_PROGRAMS); _TILE, the weight elements a program reads per step, the up
    kernel's half per row; _MIN_BLOCK_N, the narrowest column block; _WARPS)."""
    saved = moe._PROGRAMS, moe._UP_PROGRAMS, moe._TILE, moe._MIN_BLOCK_N, moe._WARPS
    rows = []
    try:
        for programs in (1024, 2048):
            for tile in (8192, 16384):
                for min_n in (4, 8):
                    for warps in (4, 8):
                        moe._PROGRAMS, moe._UP_PROGRAMS = programs, 2 * programs
                        moe._TILE, moe._MIN_BLOCK_N, moe._WARPS = tile, min_n, warps
                        r = one(name, tokens)
                        rows.append({"shape": name, "tokens": tokens, "programs": programs, "tile": tile,
                                     "min_block_n": min_n, "warps": warps,
                                     **{k: r[k] for k in ("up_us", "down_us", "up_TBps", "down_TBps")}})
                        print(json.dumps(rows[-1]), flush=True)
    finally:
        moe._PROGRAMS, moe._UP_PROGRAMS, moe._TILE, moe._MIN_BLOCK_N, moe._WARPS = saved
    return rows


def sweep_grouped(name: str, tokens: int) -> list[dict]:
    """The grouped down kernel's time over its block choices (kernels/moe.py: _GROUPED_DOWN_N, its column
    block; _GROUPED_DOWN_K, its K step; _DOWN_PROGRAMS, the programs its expert splits aim at; 128 columns
    blocks of 16 for a hidden size of 2048: no split), with the up kernel's at its defaults. A choice that
    does not fit (shared memory) is recorded as its error."""
    keys = ("_GROUPED_DOWN_N", "_GROUPED_DOWN_K", "_DOWN_PROGRAMS")
    saved = tuple(getattr(moe, k) for k in keys)
    rows = []
    try:
        for down_n in (16, 32):
            for k_step in (128, 256):
                for programs in (128, 512, 1024):
                    choice = dict(zip(keys, (down_n, k_step, programs)))
                    for key, value in choice.items():
                        setattr(moe, key, value)
                    try:
                        r = one(name, tokens, compare=False)
                        got = {k: r[k] for k in ("up_us", "down_us", "up_TBps", "down_TBps")}
                    except Exception as e:  # noqa: BLE001 - a block too large for the GPU is a result
                        got = {"error": str(e)[:200]}
                    rows.append({"shape": name, "tokens": tokens, **{k.lstrip("_").lower(): v for k, v in choice.items()},
                                 **got})
                    print(json.dumps(rows[-1]), flush=True)
    finally:
        for key, value in zip(keys, saved):
            setattr(moe, key, value)
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--tokens", default="1,4")
    ap.add_argument("--out", default="moe_kernels.json")
    ap.add_argument("--sweep", default=None, help="SHAPE:TOKENS[,SHAPE:TOKENS] whose block choices to sweep")
    ap.add_argument("--sweep-grouped", default=None, help="SHAPE:TOKENS[,...] whose grouped kernels' blocks to sweep")
    args = ap.parse_args(argv)
    rows = []
    for name in args.shapes.split(","):
        for tokens in (int(t) for t in args.tokens.split(",")):
            row = one(name, tokens)
            rows.append(row)
            print(json.dumps(row), flush=True)
            torch.cuda.empty_cache()
    swept = []
    if args.sweep:
        for item in args.sweep.split(","):
            name, tokens = item.split(":")
            swept += sweep(name, int(tokens))
    for item in (args.sweep_grouped or "").split(",") if args.sweep_grouped else ():
        name, tokens = item.split(":")
        swept += sweep_grouped(name, int(tokens))
    meta = {"device": torch.cuda.get_device_name(), "torch": torch.__version__}
    with open(args.out, "w") as f:
        json.dump({"meta": meta, "rows": rows, "sweep": swept}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
