"""Issue #15's launch census: CUDA launches per decoder layer of a decode step, per transformers family.

For each family (a tiny random ``from_config`` model: hidden 64, 4 heads, 2 KV heads where the family
groups them, vocabulary 128), each attention implementation ("sdpa", "eager") and each batch, one
decode step over transformers' static cache (``TorchExportableModuleWithStaticCache``, exported with
torch.export's strict tracing as tests/models/test_hf_decoders.py does) is exported in bf16 with the
pipeline a CUDA export runs (``DEFAULT_PIPELINE``: a CPU export leaves out ``small_matvec``), and its
launch list is worked out on the CPU by ``ostinato.codegen.report.launch_table(graph, "cuda")``.

Launches per layer are the difference between the same family exported at two depths (2 and 3 layers;
2 and 4 where layers alternate sliding and full attention, Gemma 2 and 3), divided by the layers
added: nothing has to guess where a layer starts. The rows that difference adds (a multiset of
(kind, ops)) are the per-layer launches; those that are neither a fused group nor an ``ost.*`` op are
the layer's unfused ATen launches.

Correctness (on the CPU): the shallower bf16 program is compiled (``ostinato.compile``) and run for a
few decode steps against a deep copy of the eager wrapper (the max |logit difference| is reported); at
batch 1 the family is also exported in fp32 and must match eager within 1e-4.

Where transformers' wrapper does not trace, the family says how it differs: OPT derives its positions
from the cache's length (data-dependent: the sdpa path fails to export, the eager one exports with
symbolic sizes), so its wrapper passes the cache positions as ``position_ids``; Falcon-7B's multi-query
config needs ``num_key_value_heads`` for the cache's size. Mixtral is counted with each of transformers'
experts implementations (grouped_mm, the default; batched_mm; eager). A family that fails
(construction, export, compile) records its stage and the first line of its error (with its innermost
cause's) and the census goes on; a family transformers refuses an attention implementation for (Gemma 2
and BLOOM have no sdpa) is marked so.

    .venv/bin/python bench/launch_census.py --out census.json
    .venv/bin/python bench/launch_census.py --families llama,gpt2 --attn sdpa --batches 1
"""
from __future__ import annotations

import argparse
import collections
import copy
import json
import os
import sys
import time
import traceback
import warnings
from typing import Any, Callable

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import ostinato  # noqa: E402
from ostinato.codegen.report import launch_table  # noqa: E402
from ostinato.passes.manager import DEFAULT_PIPELINE  # noqa: E402

VOCAB, CACHE_LEN, STEPS = 128, 16, 3
LIMIT = 6            # issue #15: launches per decoder layer
FP32_TOL = 1e-4
_IDS = dict(pad_token_id=0, bos_token_id=1, eos_token_id=2)
_LLAMA_LIKE = dict(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
                   vocab_size=VOCAB, max_position_embeddings=64, **_IDS)


def _alternating(layers: int) -> list[str]:
    return ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(layers)]


# family -> (config class, its keywords but the depth, the keyword of the depth, the two depths compared)
FAMILIES: dict[str, tuple[str, Callable[[], dict], str, tuple[int, int]]] = {
    "llama": ("LlamaConfig", lambda: dict(_LLAMA_LIKE), "num_hidden_layers", (2, 3)),
    "mistral": ("MistralConfig", lambda: dict(_LLAMA_LIKE, sliding_window=4), "num_hidden_layers", (2, 3)),
    "qwen2": ("Qwen2Config", lambda: dict(_LLAMA_LIKE), "num_hidden_layers", (2, 3)),
    "qwen3": ("Qwen3Config", lambda: dict(_LLAMA_LIKE, head_dim=16), "num_hidden_layers", (2, 3)),
    "gemma": ("GemmaConfig", lambda: dict(_LLAMA_LIKE, head_dim=16), "num_hidden_layers", (2, 3)),
    # layers alternate sliding (window 4) and full attention: two layers added, one of each
    "gemma2": ("Gemma2Config", lambda: dict(_LLAMA_LIKE, head_dim=16, sliding_window=4), "num_hidden_layers", (2, 4)),
    "gemma3": ("Gemma3TextConfig", lambda: dict(_LLAMA_LIKE, head_dim=16, sliding_window=4), "num_hidden_layers",
               (2, 4)),
    "phi3": ("Phi3Config", lambda: dict(_LLAMA_LIKE), "num_hidden_layers", (2, 3)),
    "phi": ("PhiConfig", lambda: dict(_LLAMA_LIKE), "num_hidden_layers", (2, 3)),
    "gpt2": ("GPT2Config", lambda: dict(n_embd=64, n_head=4, n_inner=128, vocab_size=VOCAB, n_positions=64, **_IDS),
             "n_layer", (2, 3)),
    "gpt_neox": ("GPTNeoXConfig", lambda: dict(hidden_size=64, intermediate_size=128, num_attention_heads=4,
                                               vocab_size=VOCAB, max_position_embeddings=64, **_IDS),
                 "num_hidden_layers", (2, 3)),
    "opt": ("OPTConfig", lambda: dict(hidden_size=64, ffn_dim=128, num_attention_heads=4, word_embed_proj_dim=64,
                                      vocab_size=VOCAB, max_position_embeddings=64, **_IDS),
            "num_hidden_layers", (2, 3)),
    # Falcon-7B's layout (multi-query: one KV head, parallel attention and MLP); see make_config
    "falcon": ("FalconConfig", lambda: dict(hidden_size=64, num_attention_heads=4, vocab_size=VOCAB,
                                            max_position_embeddings=64, **_IDS), "num_hidden_layers", (2, 3)),
    "stablelm": ("StableLmConfig", lambda: dict(_LLAMA_LIKE), "num_hidden_layers", (2, 3)),
    "starcoder2": ("Starcoder2Config", lambda: dict(_LLAMA_LIKE), "num_hidden_layers", (2, 3)),
    "olmo": ("OlmoConfig", lambda: dict(_LLAMA_LIKE), "num_hidden_layers", (2, 3)),
    "olmo2": ("Olmo2Config", lambda: dict(_LLAMA_LIKE), "num_hidden_layers", (2, 3)),
    "cohere": ("CohereConfig", lambda: dict(_LLAMA_LIKE), "num_hidden_layers", (2, 3)),
    "granite": ("GraniteConfig", lambda: dict(_LLAMA_LIKE), "num_hidden_layers", (2, 3)),
    "gptj": ("GPTJConfig", lambda: dict(n_embd=64, n_head=4, n_inner=128, rotary_dim=8, vocab_size=VOCAB,
                                        n_positions=64, **_IDS), "n_layer", (2, 3)),
    "bloom": ("BloomConfig", lambda: dict(hidden_size=64, n_head=4, vocab_size=VOCAB, **_IDS), "n_layer", (2, 3)),
    "mixtral": ("MixtralConfig", lambda: dict(_LLAMA_LIKE, num_local_experts=4, num_experts_per_tok=2),
                "num_hidden_layers", (2, 3)),
    # the same with transformers' other experts implementations (the default above is grouped_mm)
    "mixtral-batched_mm": ("MixtralConfig", lambda: dict(_LLAMA_LIKE, num_local_experts=4, num_experts_per_tok=2),
                           "num_hidden_layers", (2, 3)),
    "mixtral-eager_experts": ("MixtralConfig", lambda: dict(_LLAMA_LIKE, num_local_experts=4, num_experts_per_tok=2),
                              "num_hidden_layers", (2, 3)),
    # other routers: top 4 of 8 normalized, the weights cast back to bf16 (Qwen3-MoE), not normalized (OLMoE)
    "qwen3_moe": ("Qwen3MoeConfig", lambda: dict(_LLAMA_LIKE, head_dim=16, num_experts=8, num_experts_per_tok=4,
                                                 moe_intermediate_size=96, norm_topk_prob=True),
                  "num_hidden_layers", (2, 3)),
    "olmoe": ("OlmoeConfig", lambda: dict(_LLAMA_LIKE, num_experts=8, num_experts_per_tok=2, norm_topk_prob=False),
              "num_hidden_layers", (2, 3)),
    # top 2 of the logits first, then the softmax over them (GraniteMoe); FlexOlmo; Qwen2-MoE's shared
    # expert beside the routed ones (a gated MLP and a sigmoid gate of its own)
    "granitemoe": ("GraniteMoeConfig", lambda: dict(_LLAMA_LIKE, num_local_experts=8, num_experts_per_tok=2),
                   "num_hidden_layers", (2, 3)),
    "flex_olmo": ("FlexOlmoConfig", lambda: dict(_LLAMA_LIKE, num_experts=8, num_experts_per_tok=2),
                  "num_hidden_layers", (2, 3)),
    "qwen2_moe": ("Qwen2MoeConfig", lambda: dict(_LLAMA_LIKE, num_experts=8, num_experts_per_tok=2,
                                                 moe_intermediate_size=96, shared_expert_intermediate_size=128,
                                                 norm_topk_prob=False, decoder_sparse_step=1, mlp_only_layers=[]),
                  "num_hidden_layers", (2, 3)),
}
# from_config keywords beyond the attention implementation
MODEL_KW = {"mixtral-batched_mm": {"experts_implementation": "batched_mm"},
            "mixtral-eager_experts": {"experts_implementation": "eager"}}


def make_config(family: str, layers: int):
    import transformers
    cls, kw, depth_key, _ = FAMILIES[family]
    kw = dict(kw(), **{depth_key: layers})
    if family == "gemma3":
        kw["layer_types"] = _alternating(layers)
    config = getattr(transformers, cls)(**kw)
    if family == "falcon" and config.multi_query and not config.new_decoder_architecture:
        # transformers' static-cache wrapper sizes the cache by ``num_key_value_heads`` (else the query
        # heads), which FalconConfig lacks; its multi-query attention writes one KV head
        config.num_key_value_heads = 1
    return config


# Families whose model derives its position ids from the cache's length as a tensor (OPT: a cumsum over
# a mask as long as past + new tokens, sliced at the past length), which torch.export cannot trace
# with static sizes; their wrapper passes the positions (the cache positions) instead.
PASS_POSITIONS = {"opt"}


def _positions_wrapper():
    from bench.suite.workloads import positions_wrapper
    return positions_wrapper()


def cache_kind(family: str) -> str:
    base = "static (TorchExportableModuleWithStaticCache)"
    return base + (", position_ids passed" if family in PASS_POSITIONS else "")


def build(family: str, layers: int, attn: str, batch: int, dtype: torch.dtype):
    """The family's model at ``layers`` behind transformers' static-cache export wrapper, and the inputs
    of STEPS decode steps (seeded). Every 1-d weight is made non-trivial (from_config leaves norms at 1,
    Gemma's at 0)."""
    from transformers import AutoModelForCausalLM, GenerationConfig
    from transformers.integrations.executorch import TorchExportableModuleWithStaticCache
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(make_config(family, layers), dtype=torch.float32,
                                             attn_implementation=attn, **MODEL_KW.get(family, {})).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1:
                p.uniform_(-0.5, 0.5) if name.endswith("bias") or family.startswith("gemma") else p.uniform_(0.5, 1.5)
    model = model.to(dtype=dtype)
    model.generation_config = GenerationConfig(use_cache=True, cache_implementation="static")
    cls = _positions_wrapper() if family in PASS_POSITIONS else TorchExportableModuleWithStaticCache
    wrapper = cls(model, batch_size=batch, max_cache_len=CACHE_LEN).eval()
    gen = torch.Generator().manual_seed(1)
    steps = [{"input_ids": torch.randint(0, VOCAB, (batch, 1), generator=gen), "cache_position": torch.tensor([pos])}
             for pos in range(STEPS)]
    return wrapper, steps


def export(wrapper, example: dict, cuda_pipeline: bool = True):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return ostinato.export(wrapper, (), example, trace_strict=True, cache=False,
                               passes=DEFAULT_PIPELINE if cuda_pipeline else None)


def row_key(row: dict) -> str:
    """A launch's kind; a fused group's as ``fused[its distinct ops, in order]`` (the bookkeeping group
    before the layers, which takes one more copy and add per layer, keeps one key at every depth)."""
    return row["kind"] if row["kind"] != "fused" else "fused[" + ",".join(dict.fromkeys(row["ops"])) + "]"


def is_unfused(key: str) -> bool:
    """A launch that is neither a generated group nor one of ostinato's fused ops: an ATen op on its own."""
    return not key.startswith(("fused[", "ost."))


def per_layer_rows(shallow: list[dict], deep: list[dict], added: int) -> dict[str, float]:
    """The launches the deeper export adds, per added layer: {row key: count per layer}."""
    diff = collections.Counter(map(row_key, deep))
    diff.subtract(collections.Counter(map(row_key, shallow)))
    return {k: v / added for k, v in sorted(diff.items()) if v}


ATTENTION_KINDS = ("ost.decode_attention_", "ost.sdpa", "aten.scaled_dot_product_attention")


def attention_strides(rows: list[dict]) -> list[int]:
    """The distinct distances (in launches) between consecutive attention launches: a cross-check of
    the per-layer count where every layer has one attention launch (empty where none is one)."""
    at = [i for i, r in enumerate(rows) if r["kind"] in ATTENTION_KINDS]
    return sorted({b - a for a, b in zip(at, at[1:])})


def max_diff(wrapper, prog, steps: list[dict]) -> float:
    """Max |ostinato - eager| over the logits of the decode steps (the eager wrapper is a deep copy made
    before the export, so both caches evolve apart)."""
    exe = ostinato.compile(prog)
    worst = 0.0
    for kwargs in steps:
        with torch.no_grad():
            expected = wrapper(**kwargs)
        got = exe(**kwargs)
        got = got[0] if isinstance(got, (tuple, list)) else got
        worst = max(worst, (got.float() - expected.float()).abs().max().item())
    return worst


def _first_line(exc: BaseException) -> str:
    """The error's first line, and its innermost cause's (ostinato's ExportError wraps torch.export's,
    whose own first line can be generic: Dynamo's "Explanation" line then says what failed)."""
    def line(e: BaseException) -> str:
        lines = [s.strip() for s in f"{type(e).__name__}: {e}".splitlines() if s.strip()]
        detail = next((s for s in lines[1:] if s.startswith("Explanation:")), None)
        return lines[0] + (f" [{detail}]" if detail else "")
    root = exc
    while root.__cause__ is not None:
        root = root.__cause__
    text = line(exc) + (f" <- {line(root)}" if root is not exc else "")
    return text[:400]


def census_one(family: str, attn: str, batch: int, *, check: bool = True, fp32_check: bool | None = None,
               cuda_pipeline: bool = True) -> dict[str, Any]:
    """One family/attention/batch: launches per layer and in all, the per-layer launches and unfused ATen
    ones, and the CPU comparison with eager. An error fills ``error`` (its stage and first line)."""
    depths = FAMILIES[family][3]
    out: dict[str, Any] = {"family": family, "attn": attn, "batch": batch, "dtype": "bfloat16", "depths": list(depths),
                           "cache": cache_kind(family), "error": None}
    t0 = time.perf_counter()
    stage = "build"
    try:
        rows = {}
        for layers in depths:
            stage = f"build L={layers}"
            wrapper, steps = build(family, layers, attn, batch, torch.bfloat16)
            ref = copy.deepcopy(wrapper) if layers == depths[0] and check else None
            stage = f"export L={layers}"
            prog = export(wrapper, steps[0], cuda_pipeline)
            stage = f"launch_table L={layers}"
            rows[layers] = launch_table(prog.graph, "cuda")
            if ref is not None:
                stage = f"compile/run bf16 L={layers}"
                out["bf16_max_diff"] = max_diff(ref, prog, steps)
        shallow, deep = rows[depths[0]], rows[depths[1]]
        added = depths[1] - depths[0]
        layer_rows = per_layer_rows(shallow, deep, added)
        out["launches_total"] = {str(k): len(v) for k, v in rows.items()}
        out["per_layer"] = (len(deep) - len(shallow)) / added
        out["per_layer_launches"] = layer_rows
        out["unfused_per_layer"] = {k: v for k, v in layer_rows.items() if is_unfused(k)}
        out["non_layer_launches"] = len(shallow) - depths[0] * out["per_layer"]
        out["attention_per_layer"] = sum(v for k, v in layer_rows.items() if k in ATTENTION_KINDS)
        out["attention_strides"] = attention_strides(deep)
        if (fp32_check if fp32_check is not None else (check and batch == 1)):
            stage = "fp32 check"
            wrapper, steps = build(family, depths[0], attn, batch, torch.float32)
            ref = copy.deepcopy(wrapper)
            out["fp32_max_diff"] = max_diff(ref, export(wrapper, steps[0], cuda_pipeline), steps)
            out["fp32_ok"] = out["fp32_max_diff"] <= FP32_TOL
    except Exception as exc:   # a family that fails is recorded, not fatal
        out["error"] = f"{stage}: {_first_line(exc)}"
        # transformers itself refuses the attention implementation for the family (Gemma 2, BLOOM: sdpa)
        out["unsupported"] = "does not support an attention implementation" in str(exc)
        out["traceback"] = traceback.format_exc(limit=-6)
    out["seconds"] = round(time.perf_counter() - t0, 1)
    return out


def _fmt_layer(r: dict) -> str:
    pl = r["per_layer"]
    return f"{pl:g}" + (" **>6**" if pl > LIMIT else "")


def markdown(results: list[dict]) -> str:
    lines = ["| family | attn | batch | per layer | total (L) | unfused ATen per layer | bf16 max diff | fp32 (1e-4) |",
             "|---|---|---|---|---|---|---|---|"]
    for r in results:
        head = f"| {r['family']} | {r['attn']} | {r['batch']} "
        if r.get("per_layer") is None:
            what = "n/a (transformers refuses it)" if r.get("unsupported") else "FAILED"
            error = r["error"] if len(r["error"]) <= 200 else r["error"][:200] + "..."
            lines.append(head + f"| {what} | | {error} | | |")
            continue
        totals = ", ".join(f"{v} (L{k})" for k, v in r["launches_total"].items())
        unfused = ", ".join(f"{k}×{v:g}" for k, v in r["unfused_per_layer"].items()) or "-"
        bf16 = f"{r['bf16_max_diff']:.3g}" if "bf16_max_diff" in r else "-"
        fp32 = ("ok" if r["fp32_ok"] else "FAIL") + f" ({r['fp32_max_diff']:.2g})" if "fp32_ok" in r else "-"
        if r["error"]:
            fp32 = f"ERROR {r['error']}"
        lines.append(head + f"| {_fmt_layer(r)} | {totals} | {unfused} | {bf16} | {fp32} |")
    return "\n".join(lines)


def run(families: list[str], attns: list[str], batches: list[int], *, check: bool = True,
        cuda_pipeline: bool = True, log: Callable[[str], None] | None = None) -> list[dict]:
    results = []
    for family in families:
        for attn in attns:
            for batch in batches:
                r = census_one(family, attn, batch, check=check, cuda_pipeline=cuda_pipeline)
                if log:
                    log(f"{family} {attn} b{batch}: per layer {r.get('per_layer')} "
                        f"{r['error'] or ''} ({r['seconds']} s)")
                results.append(r)
    return results


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--families", default=",".join(FAMILIES), help="comma-separated, of: " + ", ".join(FAMILIES))
    ap.add_argument("--attn", default="sdpa,eager")
    ap.add_argument("--batches", default="1,4")
    ap.add_argument("--no-check", action="store_true", help="launch counts only: no compile/compare with eager")
    ap.add_argument("--cpu-pipeline", action="store_true",
                    help="export with the CPU default pipeline (no small_matvec) instead of the CUDA one")
    ap.add_argument("--out", help="write the results as JSON here")
    args = ap.parse_args(argv)
    families = [f for f in args.families.split(",") if f]
    unknown = set(families) - set(FAMILIES)
    if unknown:
        ap.error(f"unknown families {sorted(unknown)}; known: {', '.join(FAMILIES)}")
    results = run(families, args.attn.split(","), [int(b) for b in args.batches.split(",")],
                  check=not args.no_check, cuda_pipeline=not args.cpu_pipeline,
                  log=lambda s: print(s, file=sys.stderr, flush=True))
    print(markdown(results))
    if args.out:
        meta = {"torch": torch.__version__, "transformers": __import__("transformers").__version__,
                "limit_per_layer": LIMIT, "pipeline": "cpu" if args.cpu_pipeline else "cuda"}
        with open(args.out, "w") as f:
            json.dump({"meta": meta, "results": results}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
