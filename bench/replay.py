"""One decode step of the tiny decoder (64 layers, hidden 128 by default): ostinato with replay,
ostinato without replay, and torch eager, measured in this one run.

Rounds interleave the runners; each round times ``--steps`` decode steps (each step's tokens and
position written into the inputs first, as a generation loop would). The median over rounds of the
mean step time is reported, with the arena against the sum of temporaries of the captured plan.
Every runner's outputs are checked against eager's before anything is timed.

    .venv/bin/python bench/replay.py --json out.json [--device cuda --dtype bfloat16]
"""
from __future__ import annotations

import argparse
import copy
import json
import os
import platform
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import ostinato  # noqa: E402
from examples.tiny_decoder import TinyDecoder, decode_inputs  # noqa: E402


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_steps(fn, inputs: list, steps: int, device: torch.device) -> float:
    """Mean seconds per decode step over ``steps`` steps cycling through ``inputs``."""
    sync(device)
    t0 = time.perf_counter()
    for i in range(steps):
        fn(*inputs[i % len(inputs)])
    sync(device)
    return (time.perf_counter() - t0) / steps


def cuda_graph_of(model: torch.nn.Module, example: tuple):
    """Eager's step captured as a torch.cuda.CUDAGraph (static inputs copied in, as a user would);
    its KV-cache buffers are updated in place by the graph itself. Warm-up steps write the cache too;
    the runners' caches differ then, which does not change a decode step's time."""
    static = tuple(t.clone() for t in example)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side), torch.no_grad():
        for _ in range(3):
            model(*static)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph), torch.no_grad():
        out = model(*static)

    def step(*args):
        for s, a in zip(static, args):
            s.copy_(a)
        graph.replay()
        return out
    step.model = model   # the graph reads the model's weights and caches: keep them alive with it
    return step


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=64)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--steps", type=int, default=100, help="decode steps per round")
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    ap.add_argument("--torch-compile", action="store_true",
                    help="add torch.compile(mode='reduce-overhead') (its first call, compilation included, is timed)")
    ap.add_argument("--runners", default="", help="comma-separated subset of the runners (default: all)")
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    device, dtype = torch.device(args.device), getattr(torch, args.dtype)
    torch.manual_seed(0)
    model = TinyDecoder(dim=args.dim, layers=args.layers).eval().to(device=device, dtype=dtype)
    example = tuple(t.to(device) for t in decode_inputs(0))
    t0 = time.perf_counter()
    prog = ostinato.export(copy.deepcopy(model), example)
    export_s = time.perf_counter() - t0
    gen = torch.Generator().manual_seed(1)
    inputs = [tuple(t.to(device) for t in decode_inputs(s, generator=gen)) for s in range(model.max_seq)]

    eager = copy.deepcopy(model)
    plain = ostinato.compile(prog, device=device)
    replay = ostinato.compile(prog, device=device, replay=True)
    runners = {"eager": torch.no_grad()(eager), "ostinato": plain, "ostinato_replay": replay}
    if device.type == "cuda" and (not args.runners or "cuda_graph_eager" in args.runners):
        runners["cuda_graph_eager"] = cuda_graph_of(copy.deepcopy(model), inputs[0])
    first_call = {}
    if args.torch_compile:
        compiled = torch.compile(copy.deepcopy(model), mode="reduce-overhead")
        t0 = time.perf_counter()
        with torch.no_grad():
            compiled(*inputs[0])
        sync(device)
        first_call["torch_compile"] = time.perf_counter() - t0
        runners["torch_compile"] = torch.no_grad()(compiled)
    if args.runners:
        runners = {k: v for k, v in runners.items() if k == "eager" or k in args.runners.split(",")}
    # Same outputs first, over a few steps with state: a fast wrong answer is no result.
    tol = {torch.float32: 1e-4, torch.bfloat16: 5e-2, torch.float16: 5e-3}[dtype]
    for step in range(4):
        ref = runners["eager"](*inputs[step])
        for name in [k for k in runners if k != "eager"]:
            out = runners[name](*inputs[step])
            err = (out.float() - ref.float()).abs().max().item()
            if err > tol * max(1.0, ref.float().abs().max().item()):
                raise SystemExit(f"{name} differs from eager at step {step} by {err}: not timing a wrong answer")
    for fn in runners.values():   # warm-up, and every runner's state back in step
        time_steps(fn, inputs, 10, device)
    times: dict[str, list[float]] = {k: [] for k in runners}
    for _ in range(args.rounds):
        for name, fn in runners.items():
            times[name].append(time_steps(fn, inputs, args.steps, device))
    med = {k: statistics.median(v) * 1e3 for k, v in times.items()}
    report = replay.memory_report()[0] if replay.memory_report() else None
    result = {
        "model": f"TinyDecoder(dim={args.dim}, layers={args.layers})", "nodes": prog.num_nodes,
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu",
        "dtype": args.dtype, "torch": torch.__version__, "python": platform.python_version(),
        "threads": torch.get_num_threads(), "date": time.strftime("%Y-%m-%d"),
        "export_s": export_s, "first_call_s": first_call, "step_ms_median": med,
        "step_ms_min": {k: min(v) * 1e3 for k, v in times.items()},
        "step_ms_max": {k: max(v) * 1e3 for k, v in times.items()},
        "over_eager": {k: v / med["eager"] for k, v in med.items()},
        "memory": report and {"arena_bytes": report.arena_bytes, "naive_bytes": report.naive_bytes,
                              "temporaries": report.temporaries, "fallback_launches": report.fallback_launches},
        "stats": replay.stats(),
    }
    print(f"{result['model']}, {prog.num_nodes} nodes, {args.dtype} on {result['device']}, torch {torch.__version__}, "
          f"{result['threads']} threads; median of {args.rounds} rounds x {args.steps} steps")
    for k, v in med.items():
        print(f"  {k:16s} {v:8.3f} ms/step  ({v / med['eager']:.2f}x eager's time)")
    if report is not None:
        print(f"  replay memory: {report}; {report.fallback_launches} launches copy into the arena")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
