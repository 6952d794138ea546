"""Where a cold ``ostinato.export`` spends its time, for one suite configuration, in a fresh process
with an empty cache: cProfile's functions by cumulative time, and the export report's stages.

    PYTHONPATH=src:. python3 scripts/profile_export.py gpu/tiny-decoder-h128-l32 [--top 40] [--out F.json]
        [--first-call]     (compile(replay=True) and the first call too)
"""
from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("config")
    ap.add_argument("--top", type=int, default=40)
    ap.add_argument("--out")
    ap.add_argument("--first-call", action="store_true",
                    help="also compile(replay=True) and make the first call, inside the profile")
    args = ap.parse_args()
    os.environ["OSTINATO_CACHE_DIR"] = tempfile.mkdtemp(prefix="ostinato-profile-export-")
    import torch
    from bench.suite import configs, workloads
    cfg = configs.by_name(args.config)
    if cfg.device == "cuda":
        torch.cuda.init()
        torch.empty(1, device="cuda")
    wl = workloads.build(cfg.builder, cfg.params, cfg.device, cfg.dtype)
    a, kw = wl.steps[0]
    prof = cProfile.Profile()
    t0 = time.perf_counter()
    prof.enable()
    import ostinato
    prog = ostinato.export(wl.model, a, kw, **wl.export_options)
    seconds = time.perf_counter() - t0
    stages = {"export_s": seconds}
    if args.first_call:
        t1 = time.perf_counter()
        exe = ostinato.compile(prog, device=cfg.device, replay=True)
        stages["compile_s"] = time.perf_counter() - t1
        t1 = time.perf_counter()
        with torch.no_grad():
            exe(*a, **kw)
        if cfg.device == "cuda":
            torch.cuda.synchronize()
        stages["first_call_s"] = time.perf_counter() - t1
        stages["kernels"] = {k: v for k, v in exe.stats().items() if k.startswith("kernel")}
    prof.disable()
    text = io.StringIO()
    pstats.Stats(prof, stream=text).sort_stats("cumulative").print_stats(args.top)
    pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(args.top)
    report = {"config": args.config, **stages, "export_report": prog.export_report}
    print(json.dumps(report, indent=1, default=str))
    print(text.getvalue())
    if args.out:
        with open(args.out, "w") as f:
            json.dump({**report, "profile": text.getvalue()}, f, indent=1, default=str)


if __name__ == "__main__":
    main()
