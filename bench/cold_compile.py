"""Cold kernel compiles: in worker processes (the default) against one at a time in-process
(``OSTINATO_COMPILE_WORKERS=0``), in fresh processes with empty caches, for GPU-suite configurations.

Per configuration and setting, two fresh processes (bench/suite/child.py):
  ostinato_cold_step  export, compile(replay=False), first output: ops whose kernels are still compiling
                      run their torch references, so the first output does not wait for compiles; then
                      the time until every compile is done, and each output's error against eager
  ostinato_cold       export, compile(replay=True), first output: the capture waits for the compiles
Both report the kernels compiled, the seconds their compiles took summed over workers (what a serial
compile would have spent) and the op calls that ran their reference meanwhile.

    PYTHONPATH=src python3 bench/cold_compile.py --out cold_compile.json [--configs gpu/unet-r32,...]
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from bench.suite import configs, measure, workloads  # noqa: E402
from bench.suite.run import environment  # noqa: E402
from bench.suite.startup import _env, run_child, write_io  # noqa: E402

DEFAULT = ("gpu/unet-r32", "gpu/dit-b2-r32", "gpu/tiny-decoder-h128-l32", "gpu/llama-3.2-1b-decode",
           "gpu/resnet50-b1", "gpu/convnext-tiny-b1")


def run_config(name: str, workdir: str, settings: list[tuple[str, str]], log) -> dict:
    cfg = configs.by_name(name)
    wl = workloads.build(cfg.builder, cfg.params, cfg.device, cfg.dtype)
    ref = measure.Reference([measure.snapshot(measure.call(wl.model, wl.steps[i % len(wl.steps)]))
                             for i in range(measure.CHECK_STEPS)], measure.tolerance(cfg.dtype, cfg.device))
    cdir = os.path.join(workdir, name.replace("/", "_"))
    write_io(cfg, cdir, wl.steps, ref, {})
    del wl
    rec: dict = {"config": name, "tolerance": ref.tolerance}
    for label, workers in settings:
        for mode in ("ostinato_cold_step", "ostinato_cold"):
            cache = os.path.join(cdir, f"cache-{label}-{mode}")
            shutil.rmtree(cache, ignore_errors=True)
            env = _env(OSTINATO_CACHE_DIR=cache, TRITON_CACHE_DIR=os.path.join(cdir, f"triton-{label}-{mode}"),
                       OSTINATO_COMPILE_WORKERS=workers)
            r = run_child(mode, cfg, cdir, env)
            rec[f"{label}/{mode}"] = r
            if r["status"] == "ok":
                k = r.get("kernels", {})
                log(f"  {name} {label} {mode}: first output {r['total_s']:.2f} s"
                    + (f", all compiled {r['all_compiled_s']:.2f} s" if "all_compiled_s" in r else "")
                    + f"; {k.get('kernels_compiled', 0)} kernels compiled ({k.get('kernel_compile_seconds', 0):.1f} s "
                      f"summed), {k.get('kernel_calls_deferred', 0)} calls deferred"
                    + (f"; errors {r['first_error']:.2g} / {r.get('compiled_error', float('nan')):.2g}"
                       if "first_error" in r else ""))
            else:
                log(f"  {name} {label} {mode}: {r['error']}")
    return rec


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--configs", default=",".join(DEFAULT))
    ap.add_argument("--workers", default="", help="OSTINATO_COMPILE_WORKERS of the parallel setting "
                                                   "(default: the cores less one, at most 8)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--workdir")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("bench/cold_compile.py needs a CUDA device (kernels compile for it)")
    workdir = args.workdir or tempfile.mkdtemp(prefix="ostinato-cold-compile-")
    settings = [("workers", args.workers), ("in-process", "0")]
    report = {"environment": environment("cuda"), "settings": dict(settings), "results": []}

    def log(msg: str) -> None:
        print(msg, flush=True)

    for name in args.configs.split(","):
        t0 = time.perf_counter()
        try:
            rec = run_config(name, workdir, settings, log)
        except Exception as e:  # noqa: BLE001 - recorded; the other configurations still run
            rec = {"config": name, "error": measure.describe_error(e)}
            log(f"  {name}: {rec['error']}")
        rec["wall_s"] = time.perf_counter() - t0
        report["results"].append(rec)
        with open(args.out, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
