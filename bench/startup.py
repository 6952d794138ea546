"""Cold start in fresh processes: a transformers decoder's first output with ostinato (export, compile,
first call) next to torch.compile(mode="reduce-overhead")'s first call, at several depths; and the
export cache's hit (the same architecture with new weights: the graph is reused, the weights mapped).

Models are written outside this repository: transformers' LlamaForCausalLM from a config, random weights
(hidden 128 at 16/32/64/128 layers by default, and a Llama-3.2-1B-shaped one). Each measurement is its
own process with private, empty caches (ostinato's, Triton's, Inductor's; Python's bytecode cache is
primed first, bench/bytecode.py); clocks start after
``import torch``, CUDA initialisation and the model's construction, so ``import ostinato`` is inside
them, as torch.compile's imports are. Per configuration, in order:

- ``ostinato_cold``: empty caches; export (regional, export cache miss), save, compile, first output;
- ``ostinato_export_full``: the same export with ``regional=False`` (export seconds only; --full-export);
- ``ostinato_warm``: a new process, the caches the cold one left: load the saved file, compile (a plan
  and kernel cache hit), first output (the warm start);
- ``ostinato_cache_hit``: a new process, the caches the cold one left, the model with *other* weights:
  export (an export-cache hit), save (the weights' write), compile, first output;
- ``torch_compile``: torch.compile(mode="reduce-overhead"), first call, empty Inductor/Triton caches.

After its first output each ostinato row calls again: ``second_call_s`` (that call alone) and, with
replay, the calls until one replays a captured graph: ``first_replay_call`` (its number: 2 where the
first call captured, 3 by default, where the second call captures) and ``first_replay_output_s``
(from the first output's clock start, as ``first_output_s``, to that call's output), with
``uncaptured_calls``. The first call of a shape runs step by step and the second captures (replay's
default), so ``first_output_s`` holds no capture: these keys show when it happened. ``max_abs_err`` is
the first output's; ``replay_max_abs_err`` the replayed one's.

    .venv/bin/python bench/startup.py --device cpu --out docs/benchmarks/startup_cpu.json
    .venv/bin/python bench/startup.py --device cuda --dtype bfloat16 --out startup_gpu.json
    .venv/bin/python bench/startup.py --layers 64 --no-1b --no-torch-compile     # one quick row
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# transformers' Llama-3.2-1B shapes (config.json of meta-llama/Llama-3.2-1B), random weights.
LLAMA_1B = dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
                num_key_value_heads=8, head_dim=64, vocab_size=128256, max_position_embeddings=131072,
                rope_theta=500000.0, tie_word_embeddings=True, rms_norm_eps=1e-5)
TINY = dict(hidden_size=128, intermediate_size=256, num_attention_heads=4, num_key_value_heads=2,
            vocab_size=1024, max_position_embeddings=512)

CHILD = r"""
import json, os, sys, time
sys.path.insert(0, {root!r})
import torch
mode, device, dtype, config, seq, seed, path, replay = sys.argv[1:9]
dtype, seq, seed, config = getattr(torch, dtype), int(seq), int(seed), json.loads(config)
if device == "cuda":
    torch.cuda.init(); torch.empty(1, device="cuda"); torch.cuda.synchronize()
def sync():
    if device == "cuda":
        torch.cuda.synchronize()
import transformers
torch.manual_seed(seed)
with torch.device(device):
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**config)).to(dtype).eval()
ids = torch.randint(0, config["vocab_size"], (1, seq), device=device, generator=None)
kwargs = {{"use_cache": False}}
out = {{"params": sum(p.numel() for p in model.parameters())}}
def later_calls(exe, t0, offset):
    # the second call; with replay, the calls until one replays a captured graph (the first calls on a
    # cold kernel cache run step by step while the kernels compile, and capture nothing)
    t1 = time.perf_counter()
    y = exe(ids, **kwargs); sync()
    out["second_call_s"] = time.perf_counter() - t1
    runner = getattr(exe, "runner", None)
    if runner is None:
        return None
    n = 2
    while runner.stats()["replays"] == 0 and n < 2000 and time.perf_counter() - t1 < 300:
        y = exe(ids, **kwargs); sync()
        n += 1
    stats = runner.stats()
    if stats["replays"]:
        out["first_replay_call"] = n
        out["first_replay_output_s"] = time.perf_counter() - t0 - offset
    out["uncaptured_calls"] = stats.get("uncaptured_calls", 0)
    return y if stats["replays"] else None
if mode == "ostinato_warm":
    t0 = time.perf_counter()
    import ostinato
    out["import_s"] = time.perf_counter() - t0
    t1 = time.perf_counter()
    prog = ostinato.load(path)
    out["load_s"] = time.perf_counter() - t1
    profile = os.environ.get("OSTINATO_STARTUP_PROFILE")     # a folder: compile and the first call under cProfile
    if profile:
        import cProfile, pstats
        def dump(pr, what):
            with open(os.path.join(profile, "warm_%s_%d.txt" % (what, config["num_hidden_layers"])), "w") as f:
                for order in ("cumulative", "tottime"):
                    pstats.Stats(pr, stream=f).sort_stats(order).print_stats(45)
        pr = cProfile.Profile(); pr.enable()
    t1 = time.perf_counter()
    exe = ostinato.compile(prog, device=device, replay=replay == "on")
    out["compile_s"] = time.perf_counter() - t1
    out["plan_source"] = exe.plan_source
    if profile:
        pr.disable(); dump(pr, "compile")
        pr = cProfile.Profile(); pr.enable()
    t1 = time.perf_counter()
    y = exe(ids, **kwargs); sync()
    out["first_call_s"] = time.perf_counter() - t1
    out["first_output_s"] = time.perf_counter() - t0
    if profile:
        pr.disable(); dump(pr, "first_call")
    out["kernel_stats"] = {{k: v for k, v in exe.stats().items() if isinstance(v, (int, float))}}
    first = y.logits.float().clone()    # a replay rewrites the captured outputs in place
    again = later_calls(exe, t0, 0.0)
    with torch.no_grad():
        ref = model(ids, **kwargs).logits
    out["max_abs_err"] = float((first - ref.float()).abs().max())
    if again is not None:
        out["replay_max_abs_err"] = float((again.logits.float() - ref.float()).abs().max())
elif mode.startswith("ostinato"):
    t0 = time.perf_counter()
    import ostinato   # inside the clock, as torch.compile's imports are on its side
    out["import_s"] = time.perf_counter() - t0
    t1 = time.perf_counter()
    prog = ostinato.export(model, (ids,), kwargs, regional=mode != "ostinato_export_full")
    out["export_s"] = time.perf_counter() - t1
    out["export_timings"] = {{k: v for k, v in prog.timings.items() if "." not in k}}
    out["regional"] = prog.export_report.get("regional")
    out["cache_hit"] = prog.export_report.get("cache", {{}}).get("hit")
    out["nodes"] = prog.num_nodes
    if mode == "ostinato_export_full":
        print(json.dumps(out)); sys.exit(0)
    t1 = time.perf_counter()
    prog.save(path)
    out["save_s"] = time.perf_counter() - t1
    t1 = time.perf_counter()
    exe = ostinato.compile(prog, device=device, replay=replay == "on")
    out["compile_s"] = time.perf_counter() - t1
    t1 = time.perf_counter()
    y = exe(ids, **kwargs); sync()
    out["first_call_s"] = time.perf_counter() - t1
    # the kernels the first call compiled (in worker processes: their seconds overlap) or took from the cache
    out["kernel_stats"] = {{k: v for k, v in exe.stats().items() if isinstance(v, (int, float))}}
    # Cold first output: export + compile + first call (import included; the file's write is not).
    out["first_output_s"] = time.perf_counter() - t0 - out["save_s"]
    first = y.logits.float().clone()    # a replay rewrites the captured outputs in place
    again = later_calls(exe, t0, out["save_s"])
    with torch.no_grad():
        ref = model(ids, **kwargs).logits
    out["max_abs_err"] = float((first - ref.float()).abs().max())
    if again is not None:
        out["replay_max_abs_err"] = float((again.logits.float() - ref.float()).abs().max())
else:
    compiled = torch.compile(model, mode="reduce-overhead")
    t0 = time.perf_counter()
    with torch.no_grad():
        y = compiled(ids, **kwargs)
    sync()
    out["first_output_s"] = time.perf_counter() - t0
print(json.dumps(out))
"""


def child(mode: str, args, config: dict, seed: int, path: str, env: dict) -> dict:
    cmd = [sys.executable, "-c", CHILD.format(root=ROOT), mode, args.device, args.dtype, json.dumps(config),
           str(args.seq), str(seed), path, args.replay]
    t0 = time.perf_counter()
    try:
        p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.timeout)
    except subprocess.TimeoutExpired:
        return {"status": "timeout", "timeout_s": args.timeout}
    if p.returncode != 0:
        return {"status": "error", "error": p.stderr[-3000:]}
    res = json.loads(p.stdout.strip().splitlines()[-1])
    res["status"] = "ok"
    res["process_s"] = time.perf_counter() - t0
    return res


def configurations(args) -> list[tuple[str, dict]]:
    out = [(f"llama-hidden{args.dim}-{n}L", dict(TINY, hidden_size=args.dim, intermediate_size=2 * args.dim,
                                                    num_hidden_layers=n))
           for n in args.layers]
    if not args.no_1b:
        out.append(("llama-3.2-1b-shaped", dict(LLAMA_1B)))
    return out


def run_config(name: str, config: dict, args, work: str, base: dict, log) -> dict:
    d = os.path.join(work, name)
    os.makedirs(d, exist_ok=True)
    env = dict(base, OSTINATO_CACHE_DIR=os.path.join(d, "ostinato"), TRITON_CACHE_DIR=os.path.join(d, "triton"),
               TORCHINDUCTOR_CACHE_DIR=os.path.join(d, "inductor-unused"))
    path = os.path.join(d, "model.ost")
    rec = {"config": config}
    rec["ostinato_cold"] = child("ostinato_cold", args, config, 0, path, env)
    log(name, "ostinato_cold", rec["ostinato_cold"])
    if args.full_export:
        env_full = dict(env, OSTINATO_CACHE_DIR=os.path.join(d, "ostinato-full"))
        rec["ostinato_export_full"] = child("ostinato_export_full", args, config, 0, path, env_full)
        log(name, "ostinato_export_full", rec["ostinato_export_full"])
    # The saved file, the caches the cold process left: load, compile and first call (the warm start).
    rec["ostinato_warm"] = child("ostinato_warm", args, config, 0, path, env)
    log(name, "ostinato_warm", rec["ostinato_warm"])
    if args.warm_repeats > 1:   # more fresh processes of the same warm start: its spread
        runs = [rec["ostinato_warm"]] + [child("ostinato_warm", args, config, 0, path, env)
                                         for _ in range(args.warm_repeats - 1)]
        firsts = sorted(r["first_output_s"] for r in runs if r.get("status") == "ok")
        rec["ostinato_warm_repeats"] = {"first_output_s": [r.get("first_output_s") for r in runs],
                                        "load_s": [r.get("load_s") for r in runs],
                                        "compile_s": [r.get("compile_s") for r in runs],
                                        "first_call_s": [r.get("first_call_s") for r in runs],
                                        "median_first_output_s": firsts[len(firsts) // 2] if firsts else None}
        print(f"  {name:24s} ostinato_warm x{len(runs)}: first output "
              f"{', '.join(f'{x:.3f}' for x in firsts)} s", flush=True)
    # Same caches, other weights: the export cache's hit (and warm compile caches).
    rec["ostinato_cache_hit"] = child("ostinato_cache_hit", args, config, 1, path + ".new", env)
    log(name, "ostinato_cache_hit", rec["ostinato_cache_hit"])
    if not args.no_torch_compile and (not args.torch_compile_layers
                                      or config["num_hidden_layers"] in args.torch_compile_layers
                                      or name.startswith("llama-3.2")):
        tc_env = dict(base, TORCHINDUCTOR_CACHE_DIR=os.path.join(d, "inductor"),
                      TRITON_CACHE_DIR=os.path.join(d, "triton-tc"))
        rec["torch_compile"] = child("torch_compile", args, config, 0, "", tc_env)
        log(name, "torch_compile", rec["torch_compile"])
        cold, tc = rec["ostinato_cold"], rec["torch_compile"]
        if cold.get("status") == tc.get("status") == "ok":
            rec["cold_over_torch_compile"] = cold["first_output_s"] / tc["first_output_s"]
    return rec


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--layers", type=_ints, default=[16, 32, 64, 128],
                    help="depths of the hidden-DIM decoder, comma-separated (default 16,32,64,128)")
    ap.add_argument("--dim", type=int, default=128, help="hidden size of those decoders (default 128)")
    ap.add_argument("--seq", type=int, default=16, help="tokens in the example call (default 16)")
    ap.add_argument("--no-1b", action="store_true", help="leave out the Llama-3.2-1B-shaped model")
    ap.add_argument("--no-torch-compile", action="store_true", help="leave out torch.compile's first call")
    ap.add_argument("--torch-compile-layers", type=_ints, default=None,
                    help="run torch.compile only at these depths (default: every one; the 1B model always)")
    ap.add_argument("--full-export", action="store_true",
                    help="also time a full export (regional=False) in its own process, for the export/depth table")
    ap.add_argument("--replay", choices=["on", "off"], default="on",
                    help="ostinato.compile(..., replay=): on (default): the first call runs step by step and the "
                         "second captures (first_replay_output_s: when the first replayed output came; with "
                         "OSTINATO_CAPTURE_CALL=1 the first call captures, except on a cold kernel cache)")
    ap.add_argument("--timeout", type=int, default=600, help="seconds per process (default 600)")
    ap.add_argument("--warm-repeats", type=int, default=1,
                    help="fresh processes of the warm start per configuration (default 1); their first outputs "
                         "and median go to ostinato_warm_repeats")
    ap.add_argument("--cold-bytecode", action="store_true",
                    help="leave Python's bytecode cache as the machine has it (default: one process fills a "
                         "private one first, bench/bytecode.py: a machine without .pyc files would otherwise "
                         "time the bytecode compiler in every fresh process)")
    ap.add_argument("--out", "--json", dest="out", help="write the JSON report here")
    ap.add_argument("--keep-work", action="store_true",
                    help="keep the temporary folder of program files and caches (about 10 GB per 1B configuration)")
    args = ap.parse_args()
    work = tempfile.mkdtemp(prefix="ostinato-startup-")
    base = dict(os.environ, PYTHONUNBUFFERED="1")
    base.pop("OSTINATO_REDIS_URL", None)
    base["PYTHONPATH"] = os.path.join(ROOT, "src") + os.pathsep + base.get("PYTHONPATH", "")
    bytecode = None
    if not args.cold_bytecode:
        sys.path.insert(0, ROOT)
        from bench.bytecode import prime
        bytecode = prime(base, os.path.join(work, "pycache"))

    def log(name, mode, r):
        if r.get("status") != "ok":
            print(f"  {name:24s} {mode:22s} {r.get('status')}: {r.get('error', '')[-300:]}", flush=True)
            return
        parts = [f"{k} {r[k]:.2f}s" for k in ("first_output_s", "export_s", "load_s", "save_s", "compile_s",
                                               "first_call_s", "second_call_s", "first_replay_output_s")
                 if isinstance(r.get(k), float)]
        if "first_replay_call" in r:
            parts.append(f"first replay at call {r['first_replay_call']} ({r['uncaptured_calls']} uncaptured)")
        print(f"  {name:24s} {mode:22s} {', '.join(parts)}", flush=True)

    import torch
    import transformers
    report = {"bench": "startup", "device": args.device,
              "device_name": torch.cuda.get_device_name(0) if args.device == "cuda" else "cpu",
              "dtype": args.dtype, "seq": args.seq, "replay": args.replay, "torch": torch.__version__,
              "transformers": transformers.__version__, "date": time.strftime("%Y-%m-%d"),
              "cpu_threads": torch.get_num_threads(), "bytecode": bytecode or "not primed (--cold-bytecode)",
              "results": {}}
    print(json.dumps({k: v for k, v in report.items() if k != "results"}), flush=True)
    try:
        for name, config in configurations(args):
            report["results"][name] = run_config(name, config, args, work, base, log)
            if args.out:   # written after every configuration: a run cut short keeps what it measured
                with open(args.out, "w") as f:
                    json.dump(report, f, indent=2)
    finally:
        if not args.keep_work:
            shutil.rmtree(work, ignore_errors=True)
    rows = [(n, r) for n, r in report["results"].items()]
    print(f"\n{'model':24s} {'cold s':>8s} {'export s':>9s} {'warm s':>8s} {'hit export s':>13s} {'t.compile s':>12s} "
          f"{'ratio':>7s} {'cold replay s':>14s}")
    for n, r in rows:
        c, w, h, tc = r["ostinato_cold"], r["ostinato_warm"], r["ostinato_cache_hit"], r.get("torch_compile", {})
        f = lambda d, k: f"{d[k]:.2f}" if d.get("status") == "ok" and k in d else "-"  # noqa: E731
        ratio = f"{r['cold_over_torch_compile']:.3f}" if "cold_over_torch_compile" in r else "-"
        print(f"{n:24s} {f(c, 'first_output_s'):>8s} {f(c, 'export_s'):>9s} {f(w, 'first_output_s'):>8s} {f(h, 'export_s'):>13s} "
              f"{f(tc, 'first_output_s'):>12s} {ratio:>7s} {f(c, 'first_replay_output_s'):>14s}")


if __name__ == "__main__":
    main()
