"""One ostinato run per model family of the GPU suite, checked against eager: the workload a
compute-sanitizer run wraps (scripts/gpu_reliability.py, issue #17).

For each family the first GPU configuration of the matrix is built at its small parameters
(``workloads.small_params``: the same builder, model classes and code paths, shrunk), eager's outputs
for three steps are taken from the model's initial buffers, then the program is exported, compiled
(``--replay``: CUDA-graph capture and replay; otherwise the plan runs launch by launch) and run for the
same three steps from the same initial buffers. One JSON line per family on stdout (``FAMILY {...}``)
and a summary line at the end.

    PYTHONPATH=src python3 scripts/replay_families.py --replay --families resnet,vit
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "src"))


def family_configs(device: str = "cuda") -> dict:
    from bench.suite import configs
    out: dict = {}
    for c in configs.select(device):
        out.setdefault(c.family, c)
    return out


def run_family(cfg, replay: bool, steps: int = 3) -> dict:
    import torch

    import ostinato
    from bench.suite import measure, workloads
    wl = workloads.build(cfg.builder, workloads.small_params(cfg), cfg.device, cfg.dtype)
    initial = {n: b.detach().clone() for n, b in wl.model.named_buffers()}

    def restore() -> None:
        with torch.no_grad():
            for n, b in wl.model.named_buffers():
                b.copy_(initial[n])

    todo = [wl.steps[i % len(wl.steps)] for i in range(steps)]
    refs = [measure.snapshot(measure.call(wl.model, s)) for s in todo]
    restore()
    args, kwargs = wl.steps[0]
    prog = ostinato.export(wl.model, args, kwargs, **wl.export_options)
    restore()
    exe = ostinato.compile(prog, device=cfg.device, replay=replay)
    tol = measure.TOLERANCE[cfg.dtype]
    errors = [measure.max_error(measure.snapshot(measure.call(exe, s)), r) for s, r in zip(todo, refs)]
    if cfg.device == "cuda":
        torch.cuda.synchronize()
    stats = exe.stats()
    return {"config": cfg.name, "max_error": max(errors), "tolerance": tol, "ok": max(errors) <= tol,
            "launches": stats.get("kernels"), "replays": stats.get("replays")}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--replay", action="store_true", help="compile with replay=True (CUDA graphs)")
    ap.add_argument("--families", default="", help="comma-separated family names (default: all)")
    ap.add_argument("--device", default="cuda", help="the matrix's device whose families run (cpu: a check here)")
    ap.add_argument("--list", action="store_true", help="print the families and their configurations")
    args = ap.parse_args()
    fams = family_configs(args.device)
    if args.list:
        for f, c in fams.items():
            print(f, c.name)
        return 0
    wanted = [f for f in args.families.split(",") if f] or list(fams)
    unknown = [f for f in wanted if f not in fams]
    if unknown:
        print(f"unknown families {unknown}; known: {sorted(fams)}", file=sys.stderr)
        return 2
    results = {}
    for f in wanted:
        t0 = time.perf_counter()
        print(f"=== family {f} ({fams[f].name}) replay={args.replay}", flush=True)
        try:
            res = run_family(fams[f], args.replay)
        except Exception as e:  # noqa: BLE001 - reported per family
            traceback.print_exc()
            res = {"config": fams[f].name, "ok": False, "error": f"{type(e).__name__}: {str(e)[:300]}"}
        res["seconds"] = round(time.perf_counter() - t0, 1)
        results[f] = res
        print("FAMILY", f, json.dumps(res), flush=True)
    bad = [f for f, r in results.items() if not r["ok"]]
    print("SUMMARY", json.dumps({"families": len(results), "failed": bad}), flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
