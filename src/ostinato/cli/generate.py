"""Generate tokens with a causal-LM program (made by ``ostinato.llm.export_causal_lm``): prefill the
prompt once, then one decode step per token (replayed: ``--no-replay`` runs the plan step by step).

The prompt is token ids (``--prompt-ids 1,2,3``), or text with ``--tokenizer DIR`` (a local
transformers tokenizer directory; ``--prompt "..."``), which also decodes the output. A progress line
goes to stderr on a terminal; stdout gets the tokens (and text), then a table: time to first token
(load and compile excluded), decode tokens per second and the run's total. ``--runs N`` generates N
times: the first run captures the replayed plans, the table shows the first and the median of the
others.
"""
from __future__ import annotations

import argparse
import platform
import statistics
import sys

import torch

from .. import __version__
from . import write_json
from ..errors import InputError, OstinatoError
from ..program import load
from ..replay import compile
from .progress import Stages
from .run import run_device

HELP = "generate tokens with a causal-LM program (prefill, then decode steps)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("file", help="a .ost program from ostinato.llm.export_causal_lm")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt-ids", metavar="ID,ID,...", help="the prompt as comma-separated token ids")
    src.add_argument("--prompt", metavar="TEXT", help="the prompt as text (needs --tokenizer)")
    p.add_argument("--tokenizer", metavar="DIR", help="a local transformers tokenizer directory (no download)")
    p.add_argument("--max-new-tokens", type=int, default=128, help="tokens to generate at most (default 128)")
    p.add_argument("--temperature", type=float, default=0.0, help="0 (default): greedy; else sampling")
    p.add_argument("--top-k", type=int, default=None, help="sample from the k most likely tokens")
    p.add_argument("--top-p", type=float, default=None, help="sample from the smallest set of mass >= p")
    p.add_argument("--seed", type=int, default=None, help="seed of the sampling generator")
    p.add_argument("--stop", metavar="ID,ID,...", default=None,
                   help="token ids that end generation (default: the model's EOS ids; 'none': never stop)")
    p.add_argument("--device", default="cpu", help="cpu (default), cuda or cuda:N, or mlx (mlx:cpu / mlx:gpu)")
    p.add_argument("--no-replay", action="store_true", help="run each step's plan instead of replaying it")
    p.add_argument("--runs", type=int, default=1, help="generate this many times (default 1); see above")
    p.add_argument("--no-verify", action="store_true", help="skip the sha256 and shape checks on load")
    p.add_argument("--json", action="store_true", help="print one JSON object (for machines) and nothing else")


def _ids(text: str, flag: str) -> list[int]:
    try:
        ids = [int(x) for x in text.replace(" ", "").split(",") if x != ""]
    except ValueError:
        raise InputError(f"{flag} {text!r}: not a comma-separated list of integers\nFix: {flag} 1,2,3") from None
    if not ids:
        raise InputError(f"{flag}: no token ids given\nFix: {flag} 1,2,3")
    return ids


def _tokenizer(path: str):
    try:
        from transformers import AutoTokenizer
    except ImportError as e:
        raise OstinatoError("--tokenizer needs transformers\nFix: pip install 'transformers>=4.50,<6'") from e
    try:
        return AutoTokenizer.from_pretrained(path, local_files_only=True)
    except (OSError, ValueError) as e:
        raise OstinatoError(f"--tokenizer {path}: no tokenizer there ({str(e).splitlines()[0]})\nFix: name a "
                            "directory holding a tokenizer saved by save_pretrained (tokenizer.json ...)") from e


def run(args: argparse.Namespace) -> int:
    if args.max_new_tokens < 1 or args.runs < 1:
        raise OstinatoError("--max-new-tokens and --runs must be >= 1\nFix: --max-new-tokens 128 --runs 1")
    if args.prompt is not None and not args.tokenizer:
        raise OstinatoError("--prompt TEXT needs --tokenizer DIR\nFix: add --tokenizer, or give --prompt-ids")
    target, _ = run_device(args.device)
    tok = _tokenizer(args.tokenizer) if args.tokenizer else None
    if args.prompt is not None:
        prompt = tok(args.prompt)["input_ids"]
    else:
        prompt = _ids(args.prompt_ids, "--prompt-ids")
    stop = None if args.stop is None else ([] if args.stop.lower() == "none" else _ids(args.stop, "--stop"))

    with Stages(enabled=None if not args.json else False) as stages:
        stages.begin("load")
        prog = load(args.file, verify=not args.no_verify)
        info = prog.info.get("llm")
        if not isinstance(info, dict):
            raise OstinatoError(f"{args.file} is not a causal-LM program (no prefill/decode record)\nFix: export "
                                "it with ostinato.llm.export_causal_lm(model, max_cache_len) and save that")
        stages.begin("compile")
        exe = compile(prog, device=target, replay=not args.no_replay)
        ids = torch.tensor([prompt] * info["batch"], dtype=torch.long)
        runs = []
        for r in range(args.runs):
            stages.begin(f"generate (run {r + 1} of {args.runs})" if args.runs > 1 else "generate",
                         total=args.max_new_tokens)
            stats: dict = {}
            out = exe.generate(ids, args.max_new_tokens, temperature=args.temperature, top_k=args.top_k,
                               top_p=args.top_p, seed=args.seed, stop=stop, stats=stats,
                               callback=lambda step, t: stages.advance(f"{step + 1} tokens"))
            runs.append(stats)
    new = out[0, len(prompt):].tolist()

    def row(s: dict) -> dict:
        return {"ttft_ms": s["ttft_s"] * 1e3, "decode_tokens_per_s": s["decode_tokens_per_s"],
                "new_tokens": s["new_tokens"], "total_s": s["total_s"]}

    report = {
        "file": args.file, "model": info.get("model", "?"), "family": info.get("family", "?"),
        "device": exe.backend.label or str(exe.device), "replay": not args.no_replay, "prompt_tokens": len(prompt),
        "tokens": new, "text": tok.decode(new) if tok is not None else None,
        "timings": {"load_s": stages.seconds["load"], "compile_s": stages.seconds["compile"],
                    "first_run": row(runs[0])},
        "versions": {"ostinato": __version__, "torch": torch.__version__, "python": platform.python_version()},
    }
    if len(runs) > 1:
        later = [row(s) for s in runs[1:]]
        report["timings"]["later_runs_median"] = {k: statistics.median(x[k] for x in later) for k in later[0]}
    if args.json:
        write_json(report)
    else:
        _print_report(report)
    return 0


def _print_report(r: dict) -> None:
    from rich.table import Table

    from .progress import report_console
    console = report_console()
    console.print(f"{r['file']}: {r['model']} on {r['device']}, {'replay' if r['replay'] else 'step by step'}, "
                  f"prompt {r['prompt_tokens']} tokens")
    console.print("tokens: " + ",".join(str(t) for t in r["tokens"]), soft_wrap=True)
    if r["text"] is not None:
        console.print("text:   " + r["text"], soft_wrap=True, markup=False)
    t = r["timings"]
    table = Table("", "time to first token (ms)", "decode tokens/s", "new tokens", "total (s)", box=None,
                  pad_edge=False)
    for c in table.columns[1:]:
        c.justify = "right"
    cols = [("first run" + (" (captures)" if r["replay"] else ""), t["first_run"])]
    if "later_runs_median" in t:
        cols.append(("later runs (median)", t["later_runs_median"]))
    for label, x in cols:
        table.add_row(label, f"{x['ttft_ms']:.2f}", f"{x['decode_tokens_per_s']:.1f}", f"{x['new_tokens']:.0f}",
                      f"{x['total_s']:.3f}")
    console.print(table)
    console.print(f"load {t['load_s']:.3f} s, compile {t['compile_s']:.3f} s (not in the table)")
