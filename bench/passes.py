"""What the pass pipeline does to the 64-layer tiny Llama (hidden 128): node count after export and
after each pass, and the CPU step time of one decode step without passes, with them, and eager, all
measured in this one run (rounds interleaved, median over rounds of the mean step time).

    .venv/bin/python bench/passes.py --json out.json
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


def step_time(fn, inputs, steps: int) -> float:
    """Mean seconds per call over ``steps`` calls cycling through ``inputs``."""
    t0 = time.perf_counter()
    for i in range(steps):
        fn(*inputs[i % len(inputs)])
    return (time.perf_counter() - t0) / steps


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=64)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--steps", type=int, default=100, help="decode steps per round")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model = TinyDecoder(dim=args.dim, layers=args.layers).eval()
    example = decode_inputs(0)

    raw = ostinato.export(copy.deepcopy(model), example, passes=[])
    fused = ostinato.export(copy.deepcopy(model), example)
    passes = fused.info["passes"]
    timings = {r["pass"]: fused.timings.get(f"pass.{r['pass']}", fused.timings["torch_export"]) for r in passes}
    assert passes[0]["nodes"] == raw.num_nodes, (passes[0], raw.num_nodes)

    gen = torch.Generator().manual_seed(1)
    inputs = [decode_inputs(s % model.max_seq, generator=gen) for s in range(model.max_seq)]
    runners = {"eager": torch.no_grad()(copy.deepcopy(model)),
               "ostinato_no_passes": ostinato.compile(raw, cache=False),
               "ostinato_pipeline": ostinato.compile(fused, cache=False)}
    # Same outputs first: a fast wrong answer is no result.
    ref = runners["eager"](*inputs[0])
    for name in ("ostinato_no_passes", "ostinato_pipeline"):
        torch.testing.assert_close(runners[name](*inputs[0]), ref, rtol=1e-4, atol=1e-4)
    for fn in runners.values():
        step_time(fn, inputs, 10)  # warm-up
    samples: dict[str, list[float]] = {k: [] for k in runners}
    for _ in range(args.rounds):
        for name, fn in runners.items():
            samples[name].append(step_time(fn, inputs, args.steps))
    ms = {k: statistics.median(v) * 1e3 for k, v in samples.items()}

    result = {
        "model": f"TinyDecoder(dim={args.dim}, layers={args.layers}, heads=4, kv_heads=2, max_seq=64)",
        "machine": {"cpu": platform.processor() or platform.machine(), "threads": torch.get_num_threads(),
                    "torch": torch.__version__, "python": platform.python_version(),
                    "ostinato": ostinato.__version__},
        "nodes_after": [{"pass": r["pass"], "nodes": r["nodes"], "ms": timings[r["pass"]] * 1e3} for r in passes],
        "ops_after_pipeline": fused.op_counts(),
        "step_ms": ms,
        "speedup_pipeline_vs_no_passes": ms["ostinato_no_passes"] / ms["ostinato_pipeline"],
        "speedup_pipeline_vs_eager": ms["eager"] / ms["ostinato_pipeline"],
        "rounds": args.rounds, "steps_per_round": args.steps,
    }
    print(f"{result['model']}, torch {torch.__version__}, {torch.get_num_threads()} threads")
    print(f"  {'pass':<18}{'nodes':>7}{'ms':>10}")
    for r in result["nodes_after"]:
        print(f"  {r['pass']:<18}{r['nodes']:>7}{r['ms']:>10.2f}")
    print("  step time (median of rounds): " + ", ".join(f"{k} {v:.3f} ms" for k, v in ms.items()))
    print(f"  pipeline vs no passes: {result['speedup_pipeline_vs_no_passes']:.2f}x; "
          f"pipeline vs eager: {result['speedup_pipeline_vs_eager']:.2f}x")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
