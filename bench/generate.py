"""Generation: time to first token and decode tokens/s at batch 1, ostinato against transformers, in one run.

For each shape (the suite's transformers shapes, ``bench/suite/workloads.HF_SHAPES``: real widths of
Llama-3.2-1B, Qwen2.5-0.5B, Gemma-2B, ... with random weights, seeded), one model is built on the
device in the dtype and generated from by

- ``ostinato``: ``ostinato.llm.export_causal_lm`` then ``compile(replay=True)``; ``exe.generate`` with
  its ``stats`` (time to first token: prefill and the first sample, synced; decode: the rest, synced at
  the end, so the loop's own syncs are only its stop checks, and there are none here).
- ``hf-compiled``: transformers' ``generate`` with a static cache, which compiles the model's forward
  itself (``CompileConfig(fullgraph=True, mode="reduce-overhead")``: CUDA graphs on the GPU).
- ``hf-eager``: the same with ``disable_compile=True`` (on a GPU, generate would compile otherwise).

transformers' times come from a streamer that stamps each token as generate hands it over (the first
``put`` is the prompt, before prefill). Every runner generates ``--new-tokens`` greedily with no stop
token; the first run of each is a warm-up (captures, compilation) reported apart, then ``--runs``
timed runs give the medians. The greedy tokens are compared with transformers' eager ones (how many
leading tokens agree; with random weights in bf16 a near-tie can flip a token, so this is reported,
not asserted).

    .venv/bin/python bench/generate.py --device cuda --dtype bfloat16 --json gen.json
    .venv/bin/python bench/generate.py --device cpu --shapes llama-mini --new-tokens 16 --peers hf-eager
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import ostinato  # noqa: E402
import ostinato.llm  # noqa: E402
from bench.suite.workloads import HF_SHAPES, _LAYERS_KEY  # noqa: E402

DEFAULT_SHAPES = "llama-3.2-1b,qwen2.5-0.5b,gemma-2b"
PEERS = ("hf-compiled", "hf-eager")


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def build(shape: str, layers: int | None, device: torch.device, dtype: torch.dtype, cache: int):
    import transformers
    cls, kw = HF_SHAPES[shape]
    if layers is not None:
        kw = dict(kw, **{_LAYERS_KEY.get(cls, "num_hidden_layers"): layers})
    config = getattr(transformers, cls)(max_position_embeddings=max(4096, cache), pad_token_id=0, bos_token_id=1,
                                        eos_token_id=2, **kw)
    torch.manual_seed(0)
    with torch.device(device):
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=dtype).eval()
    return model


class Clock:
    """A transformers streamer that stamps each ``put`` (the prompt first, then one per new token)."""

    def __init__(self):
        self.stamps: list[float] = []

    def put(self, value) -> None:
        self.stamps.append(time.perf_counter())

    def end(self) -> None:
        pass


def compile_options(compiled: bool) -> dict:
    """generate's own switch: with a static cache on a GPU it compiles the forward by itself
    (CompileConfig, reduce-overhead by default); ``disable_compile`` keeps it eager."""
    if not compiled:
        return {"disable_compile": True}
    from transformers import CompileConfig
    config = CompileConfig(fullgraph=True, mode="reduce-overhead")
    config._compile_all_devices = True   # also on the CPU, where generate would not compile by itself
    return {"compile_config": config}


def run_hf(model, ids: torch.Tensor, new: int, device: torch.device, compiled: bool) -> tuple[dict, list[int]]:
    clock = Clock()
    sync(device)
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=new, min_new_tokens=new, do_sample=False,
                             cache_implementation="static", streamer=clock, pad_token_id=0,
                             **compile_options(compiled))
    sync(device)
    end = time.perf_counter()
    s = clock.stamps
    ttft = s[1] - s[0]
    decode = end - s[1]
    return {"ttft_s": ttft, "decode_tokens_per_s": (new - 1) / decode, "total_s": end - s[0]}, \
        out[0, ids.shape[1]:].tolist()


def run_ostinato(exe, ids: torch.Tensor, new: int) -> tuple[dict, list[int]]:
    stats: dict = {}
    out = exe.generate(ids, new, stop=[], stats=stats)
    return {k: stats[k] for k in ("ttft_s", "decode_tokens_per_s", "total_s")}, out[0, ids.shape[1]:].tolist()


def measure(fn, runs: int) -> dict:
    first, tokens = fn()
    timed = [fn()[0] for _ in range(runs)]
    med = {k: statistics.median(t[k] for t in timed) for k in timed[0]}
    return {"first_run": first, "median": med, "tokens": tokens}


def leading_agreement(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def bench_shape(shape: str, args, device: torch.device, dtype: torch.dtype) -> dict:
    cache = args.prompt + args.new_tokens
    model = build(shape, args.layers, device, dtype, cache)
    vocab = model.get_output_embeddings().weight.shape[0]
    ids = torch.randint(3, vocab, (1, args.prompt), generator=torch.Generator().manual_seed(1)).to(device)
    row: dict = {"shape": shape, "class": type(model).__name__, "layers": model.config.num_hidden_layers,
                 "parameters": sum(p.numel() for p in model.parameters())}
    t0 = time.perf_counter()
    prog = ostinato.llm.export_causal_lm(model, max_cache_len=cache)
    row["ostinato_export_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    exe = ostinato.compile(prog, device=device, replay=True)
    row["ostinato_compile_s"] = time.perf_counter() - t0
    results = {"ostinato": measure(lambda: run_ostinato(exe, ids, args.new_tokens), args.runs)}
    del exe
    if "hf-eager" in args.peers:
        results["hf-eager"] = measure(lambda: run_hf(model, ids, args.new_tokens, device, False), args.runs)
    if "hf-compiled" in args.peers:
        t0 = time.perf_counter()
        results["hf-compiled"] = measure(lambda: run_hf(model, ids, args.new_tokens, device, True), args.runs)
        row["hf_compiled_first_and_timed_s"] = time.perf_counter() - t0
    ref = results.get("hf-eager", results.get("hf-compiled", {})).get("tokens")
    for name, r in results.items():
        r["leading_tokens_equal_to_hf"] = None if ref is None else leading_agreement(r["tokens"], ref)
        del r["tokens"]
    row["runners"] = results
    if "hf-compiled" in results:
        o, h = results["ostinato"]["median"], results["hf-compiled"]["median"]
        row["decode_speedup_vs_hf_compiled"] = o["decode_tokens_per_s"] / h["decode_tokens_per_s"]
        row["ttft_ratio_vs_hf_compiled"] = o["ttft_s"] / h["ttft_s"]
    return row


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default=DEFAULT_SHAPES, help=f"comma-separated HF_SHAPES names ({DEFAULT_SHAPES})")
    ap.add_argument("--layers", type=int, default=None, help="override each shape's depth")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--prompt", type=int, default=128, help="prompt tokens (default 128)")
    ap.add_argument("--new-tokens", type=int, default=128, help="tokens generated per run (default 128)")
    ap.add_argument("--runs", type=int, default=5, help="timed runs after the warm-up (default 5)")
    ap.add_argument("--peers", default=",".join(PEERS), help="transformers runners: hf-compiled,hf-eager or none")
    ap.add_argument("--json", metavar="FILE", help="write the results as JSON")
    args = ap.parse_args(argv)
    args.peers = [] if args.peers == "none" else args.peers.split(",")
    device, dtype = torch.device(args.device), getattr(torch, args.dtype)
    import transformers
    report = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu",
              "dtype": args.dtype, "prompt": args.prompt, "new_tokens": args.new_tokens, "runs": args.runs,
              "versions": {"ostinato": ostinato.__version__, "torch": torch.__version__,
                           "transformers": transformers.__version__, "python": platform.python_version()},
              "shapes": []}
    for shape in args.shapes.split(","):
        row = bench_shape(shape, args, device, dtype)
        report["shapes"].append(row)
        print(f"{shape} ({row['class']}, {row['layers']} layers):")
        for name, r in row["runners"].items():
            m = r["median"]
            print(f"  {name:12s} TTFT {m['ttft_s'] * 1e3:9.2f} ms  decode {m['decode_tokens_per_s']:9.1f} tok/s  "
                  f"(first run: TTFT {r['first_run']['ttft_s'] * 1e3:.1f} ms)  leading tokens equal to HF: "
                  f"{r['leading_tokens_equal_to_hf']}")
        if "decode_speedup_vs_hf_compiled" in row:
            print(f"  ostinato / hf-compiled: decode {row['decode_speedup_vs_hf_compiled']:.2f}x, "
                  f"TTFT ratio {row['ttft_ratio_vs_hf_compiled']:.2f}")
        sys.stdout.flush()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
