"""Depthwise convolutions on the GPU: torch over NCHW (its own kernel), torch over NHWC (cuDNN) and
ostinato's Triton kernel over NCHW (backends/cuda/kernels/conv.py), at the shapes of the suite's models,
with the kernel's tile swept (``--sweep``). Each runner's 20 calls are captured in one CUDA graph and
replayed; reported: microseconds per call (median of rounds, the runners interleaved) and the rate of
the activations' read and write (GB/s). Every result is checked against torch's NCHW first.

    PYTHONPATH=src python bench/depthwise.py --json out.json [--sweep]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src"))

from ostinato.backends.cuda.kernels import conv  # noqa: E402
from ostinato.backends.cuda.kernels.common import cdiv  # noqa: E402
from ostinato.backends.cuda.runtime import awaiting_compiles  # noqa: E402

# (name, [N, C, H, W], kernel, stride, padding): conv-stack's blocks, MobileNetV3's and EfficientNet's
# depthwise stages, ConvNeXt's 7x7
SHAPES = [("conv-stack-b8", (8, 64, 64, 64), 3, 1, 1), ("conv-stack-b1", (1, 64, 64, 64), 3, 1, 1),
          ("mbv3-b32-72x56-s2", (32, 72, 56, 56), 3, 2, 1), ("mbv3-b32-240x14-5x5", (32, 240, 14, 14), 5, 1, 2),
          ("effnet-b32-96x112-s2", (32, 96, 112, 112), 3, 2, 1), ("convnext-b32-96x56-7x7", (32, 96, 56, 56), 7, 1, 3),
          ("convnext-b1-384x14-7x7", (1, 384, 14, 14), 7, 1, 3)]
CALLS = 20


def graphed(fn):
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(CALLS):
            fn()
    return g


def time_graphs(graphs: dict, rounds: int = 15, reps: int = 10) -> dict[str, float]:
    times = {k: [] for k in graphs}
    for _ in range(rounds):
        for name, g in graphs.items():
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(reps):
                g.replay()
            end.record()
            end.synchronize()
            times[name].append(start.elapsed_time(end) * 1000 / (reps * CALLS))
    return {k: statistics.median(v) for k, v in times.items()}


def forced_tile(x, w, b, stride, pad, bh, bw):
    n, c, h, wd = x.shape
    kh = w.shape[2]
    oh, ow = (h + 2 * pad - kh) // stride + 1, (wd + 2 * pad - kh) // stride + 1
    out = torch.empty((n, c, oh, ow), dtype=x.dtype, device=x.device)
    conv.LIBRARY.kernel("depthwise_conv2d", KH=kh, KW=kh, HAS_BIAS=True, BLOCK_H=bh, BLOCK_W=bw)(
        x, w, b, out, c, 1, h, wd, oh, ow, *x.stride(), stride, stride, pad, pad, 1, 1,
        grid=(n * c, cdiv(oh, bh), cdiv(ow, bw)))
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    ap.add_argument("--sweep", action="store_true")
    args = ap.parse_args()
    torch.manual_seed(0)
    report = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "shapes": {}}
    for name, shape, k, stride, pad in SHAPES:
        c = shape[1]
        x = torch.randn(shape, device="cuda", dtype=torch.bfloat16)
        xl = x.contiguous(memory_format=torch.channels_last)
        w = torch.randn(c, 1, k, k, device="cuda", dtype=torch.bfloat16) / k
        wl = w.contiguous(memory_format=torch.channels_last)
        b = torch.randn(c, device="cuda", dtype=torch.bfloat16)
        ref = F.conv2d(x, w, b, stride, pad, 1, c)
        runners = {"torch_nchw": lambda: F.conv2d(x, w, b, stride, pad, 1, c),
                   "cudnn_nhwc": lambda: F.conv2d(xl, wl, b, stride, pad, 1, c),
                   "ostinato": lambda: conv.depthwise_conv2d(x, w, b, [stride] * 2, [pad] * 2, [1, 1], False, [0, 0], c)}
        if args.sweep:
            for tile in ((8, 64), (16, 64), (32, 64), (64, 64), (4, 128), (8, 128), (16, 128), (32, 32)):
                runners[f"ostinato {tile[0]}x{tile[1]}"] = (
                    lambda t=tile: forced_tile(x, w, b, stride, pad, *t))
        checked, graphs = {}, {}
        for rname, fn in runners.items():
            with awaiting_compiles():
                got = fn()
            torch.cuda.synchronize()
            err = (got.float() - ref.float()).abs().max().item()
            checked[rname] = err
            if err > 0.05 * (1 + ref.float().abs().max().item()):
                print(f"{name} {rname}: WRONG (max error {err:.3g})", flush=True)
                continue
            graphs[rname] = graphed(fn)
        times = time_graphs(graphs)
        moved = (x.numel() + ref.numel()) * 2
        row = {r: {"us": round(t, 2), "GBps": round(moved / (t * 1e-6) / 1e9, 1), "max_err": checked[r]}
               for r, t in times.items()}
        report["shapes"][name] = row
        print(name, {r: v["us"] for r, v in row.items()}, flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
