"""Issue #15: decode steps of transformers families the suite's matrix leaves out, timed against
torch.compile reduce-overhead in one run: Falcon-7B (multi-query, parallel attention and MLP), GPT-J-6B
(interleaved partial rotary), BLOOM-560m (ALiBi, eager attention), OLMo-2-1B (whole-row q/k norms) and
Mixtral-8x7B (mixture of experts: routing, then 2 of 8 experts per token through grouped_mm) and
Qwen1.5-MoE-A2.7B (4 of 60 experts, and a shared expert gated by a sigmoid),
at the named models' widths with fewer layers (``--layers``), batch 1, a static cache of 256.

Each family is a suite configuration (``bench/suite``: the ``hf-decoder`` builder, transformers' static-cache
export wrapper around a ``from_config`` model with random weights), run by the suite's own runners, checks
and report: every runner's outputs are checked against eager before it is timed, the runners' trials are
interleaved. No fresh-process start-up figures (``bench/run_suite.py`` has those for the matrix).

    python3 bench/family_decode.py --device cuda --out $OUT/family-decode
    .venv/bin/python bench/family_decode.py --device cpu --small --out /tmp/family   # the same code, narrowed
"""
from __future__ import annotations

import argparse
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [os.path.join(ROOT, "src"), ROOT]

from bench.suite import configs, report, run as suite_run, workloads  # noqa: E402

# shape (bench/suite/workloads.HF_SHAPES) -> layers timed by default
FAMILIES = {"falcon-7b": 4, "gpt-j-6b": 4, "bloom-560m": 12, "olmo2-1b": 8, "mixtral-8x7b": 2,
            "qwen1.5-moe-a2.7b": 4, "stablelm-2-1.6b": 8, "olmo-1b": 8, "qwen3-30b-a3b": 4, "olmoe-1b-7b": 4,
            "gpt2-medium": 8, "opt-1.3b": 8, "starcoder2-3b": 8}
MOE = {"mixtral-8x7b", "qwen1.5-moe-a2.7b", "qwen3-30b-a3b", "olmoe-1b-7b"}
# a batched MoE step may route up to a quarter of its sequences apart from eager (bench/suite/measure.Reference;
# the report gives each runner's count). Mixtral-8x7B at batch 32 with random weights (an H200, 3 check steps):
# reduce-overhead's outputs left eager's on 6 or 7 sequences, ostinato's on 5, every other within the tolerance
# (docs/benchmarks/moe_gpu/call11-call14)
MOE_ROW_SLACK = 4       # one sequence in this many
RUNNERS = ["eager", "cuda_graph_eager", "torch_compile_ro", "ostinato_replay"]


def family_configs(device: str, shapes: list[str], layers: int | None = None, small: bool = False,
                   batch: int = 1) -> list:
    """One decode configuration per shape; ``small``: the suite's narrowed version (hidden 64, 2 layers);
    ``batch``: sequences a step (past 16 a batched step: its norms fold into cuBLAS products)."""
    unknown = sorted(set(shapes) - set(FAMILIES))
    if unknown:
        raise SystemExit(f"family_decode: unknown families {unknown}; known: {', '.join(FAMILIES)}")
    dtype = "bfloat16" if device == "cuda" else "float32"
    prefix = "gpu" if device == "cuda" else "cpu"
    out = []
    for shape in shapes:
        depth = layers or FAMILIES[shape]
        name = f"{prefix}/{shape}-l{depth}-decode" + (f"-b{batch}" if batch != 1 else "")
        params = {"shape": shape, "batch": batch, "tokens": 1, "cache": 256, "layers": depth}
        if shape in MOE and batch > 1:
            params["row_slack"] = max(1, batch // MOE_ROW_SLACK)
        cfg = configs.Config(name, "small-llm", shape, "hf-decoder", params,
                             device, dtype, {"build": 10, "export": 10, "compile": 20, "step": 0.03})
        if small:
            cfg = configs.Config(cfg.name + "-small", cfg.category, cfg.family, cfg.builder,
                                 workloads.small_params(cfg), device, dtype, cfg.est)
        out.append(cfg)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cuda")
    ap.add_argument("--families", default=",".join(FAMILIES), help="comma-separated, of: " + ", ".join(FAMILIES))
    ap.add_argument("--layers", type=int, default=None, help="every family's depth (default: per family)")
    ap.add_argument("--runners", default=",".join(RUNNERS), help="comma-separated suite runners")
    ap.add_argument("--small", action="store_true", help="the narrowed models (a CPU check of the same code)")
    ap.add_argument("--batch", type=int, default=1, help="sequences a decode step (default 1)")
    ap.add_argument("--workdir", default=None)
    ap.add_argument("--out", default="family-decode")
    args = ap.parse_args(argv)
    selected = family_configs(args.device, args.families.split(","), args.layers, args.small, args.batch)
    wanted = [r for r in args.runners.split(",") if r]
    unknown = [r for r in wanted if r not in configs.RUNNERS]
    if unknown:
        ap.error(f"unknown runners {unknown}; known: {', '.join(configs.RUNNERS)}")
    os.makedirs(args.out, exist_ok=True)
    partial = os.path.join(args.out, "results.partial.json")

    def checkpoint(doc: dict) -> None:   # what a run cut short has measured (--merge of run_suite takes it)
        with open(partial + ".tmp", "w") as f:
            json.dump(doc, f, indent=1, default=str)
        os.replace(partial + ".tmp", partial)

    doc = suite_run.run_suite(selected, wanted, False, workdir=args.workdir, checkpoint=checkpoint)
    doc["selection"] = {"device": args.device, "families": args.families, "layers": args.layers, "batch": args.batch,
                        "runners": wanted, "small": args.small, "script": "bench/family_decode.py"}
    paths = report.write(doc, args.out)
    if os.path.exists(partial):
        os.remove(partial)
    sys.stderr.write(f"wrote {paths['json']}, {paths['markdown']}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
