"""ostinato demo: export a 64-layer tiny decoder (hidden 128), run it on the CPU, check it against eager.

Run through `bash scripts/demo.sh` (installs everything first) or `.venv/bin/python examples/demo.py`.
"""
from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import ostinato  # noqa: E402
from examples.tiny_decoder import TinyDecoder, decode_inputs  # noqa: E402


def trimmed_mean_ms(times: list[float], trim: float = 0.1) -> float:
    times = sorted(times)
    k = int(len(times) * trim)
    kept = times[k:len(times) - k] or times
    return 1000 * statistics.fmean(kept)


CHECK_STEPS = 8


def run_saved(path: str, out: str) -> int:
    """In a fresh process: load the saved program, run the check steps, save the outputs."""
    t0 = time.perf_counter()
    prog = ostinato.load(path)
    t_load = time.perf_counter() - t0
    exe = ostinato.compile(prog, device="cpu")
    gen = torch.Generator().manual_seed(1)
    outs = [exe(*decode_inputs(step, generator=gen)) for step in range(CHECK_STEPS)]
    torch.save(outs, out)
    print(json.dumps({"load_seconds": t_load, "first_output_seconds": time.perf_counter() - t0}))
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--layers", type=int, default=64)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--steps", type=int, default=20, help="timed decode steps per runner")
    ap.add_argument("--run-saved", nargs=2, metavar=("PROGRAM", "OUT"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.run_saved:
        return run_saved(*args.run_saved)
    torch.manual_seed(0)
    torch.set_num_threads(max(1, min(4, os.cpu_count() or 1)))
    max_seq = 8 + 3 * args.steps + 8
    model = TinyDecoder(dim=args.dim, layers=args.layers, max_seq=max_seq).eval()
    eager = copy.deepcopy(model)

    t0 = time.perf_counter()
    prog = ostinato.export(model, decode_inputs(0))
    t_export = time.perf_counter() - t0
    t0 = time.perf_counter()
    exe = ostinato.compile(prog, device="cpu")
    t_compile = time.perf_counter() - t0
    replay = ostinato.compile(prog, device="cpu", replay=True)   # captures on its first call

    # Correctness: 8 decode steps with the KV cache evolving on both sides.
    worst = worst_replay = 0.0
    refs = []
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for step in range(CHECK_STEPS):
            inputs = decode_inputs(step, generator=gen)
            ref, out, rep = eager(*inputs), exe(*inputs), replay(*inputs)
            refs.append(ref)
            worst = max(worst, (ref - out).abs().max().item())
            worst_replay = max(worst_replay, (ref - rep).abs().max().item())

    # Save the program, then load and run it in a fresh process.
    folder = tempfile.mkdtemp(prefix="ostinato-demo-")
    path = os.path.join(folder, "tiny_decoder.ost")
    t0 = time.perf_counter()
    prog.save(path)
    t_save = time.perf_counter() - t0
    child = subprocess.run([sys.executable, os.path.abspath(__file__), "--run-saved", path,
                            os.path.join(folder, "outs.pt")], capture_output=True, text=True)
    if child.returncode != 0:
        print(child.stderr, file=sys.stderr)
        print("demo: FAILED: the saved program did not run in a fresh process", file=sys.stderr)
        return 1
    fresh = json.loads(child.stdout.strip().splitlines()[-1])
    saved_outs = torch.load(os.path.join(folder, "outs.pt"))
    worst_saved = max((r - o).abs().max().item() for r, o in zip(refs, saved_outs))
    ok = worst <= 1e-5 and worst_replay <= 1e-5 and worst_saved <= 1e-5 and len(saved_outs) == CHECK_STEPS

    # Step time, eager vs ostinato, over the same positions.
    def timed(fn, start: int) -> list[float]:
        times = []
        with torch.no_grad():
            for i in range(args.steps):
                inputs = decode_inputs(start + i, generator=gen)
                t = time.perf_counter()
                fn(*inputs)
                times.append(time.perf_counter() - t)
        return times

    eager_ms = trimmed_mean_ms(timed(eager, 8))
    ost_ms = trimmed_mean_ms(timed(exe, 8 + args.steps))
    replay_ms = trimmed_mean_ms(timed(replay, 8 + 2 * args.steps))
    memory = replay.memory_report()[0]

    ops = prog.op_counts()
    rows = [
        ("model", f"TinyDecoder: {args.layers} layers, hidden {args.dim}, KV cache {max_seq}"),
        ("graph nodes", f"{prog.num_nodes} ({len(ops)} distinct ops)"),
        ("top ops", ", ".join(f"{k} x{v}" for k, v in sorted(ops.items(), key=lambda kv: -kv[1])[:4])),
        ("export", f"{t_export:.2f} s"),
        ("compile (cpu)", f"{1000 * t_compile:.1f} ms"),
        ("max |ostinato - eager|, 8 steps", f"{worst:.2e} ({'OK' if worst <= 1e-5 else 'MISMATCH'})"),
        ("max |replay - eager|, 8 steps", f"{worst_replay:.2e} ({'OK' if worst_replay <= 1e-5 else 'MISMATCH'})"),
        ("save .ost", f"{1000 * t_save:.0f} ms, {os.path.getsize(path) / 2**20:.1f} MiB"),
        ("fresh process: load", f"{1000 * fresh['load_seconds']:.0f} ms (weights mmapped, sha256 checked)"),
        ("fresh process: 8 steps", f"max |diff| vs eager {worst_saved:.2e} "
                                   f"({'OK' if worst_saved <= 1e-5 else 'MISMATCH'})"),
        ("eager step", f"{eager_ms:.2f} ms"),
        ("ostinato step (no replay)", f"{ost_ms:.2f} ms  ({eager_ms / ost_ms:.2f}x eager)"),
        ("ostinato step (replay)", f"{replay_ms:.2f} ms  ({eager_ms / replay_ms:.2f}x eager)"),
        ("replay memory", str(memory)),
        ("versions", f"ostinato {ostinato.__version__}, torch {torch.__version__}"),
    ]
    width = max(len(k) for k, _ in rows)
    print("\nostinato demo (CPU)")
    print("-" * (width + 50))
    for k, v in rows:
        print(f"{k:<{width}}  {v}")
    print("-" * (width + 50))
    if not ok:
        print("demo: FAILED: ostinato's outputs differ from eager's", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
