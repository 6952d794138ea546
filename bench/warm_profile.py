"""Where a warm start's time goes: for each configuration directory that bench/run_suite.py left in
--workdir (its model.ost, io.pt and the ostinato cache the cold process filled), run the suite's
``ostinato_warm`` child again in fresh processes, each under cProfile, and write what they spent to
--out: per process the child's own phase times (load, compile, first output) and the functions with the
most cumulative and own time.

The first repeat after the suite's warm process finds the data hash recorded (the suite's own warm
process hashed), so later repeats time the steady warm start; ``--repeats`` says how many.

  python bench/run_suite.py --configs NAME --runners eager,ostinato_replay --workdir WD ...
  python bench/warm_profile.py --workdir WD --out DIR
"""
from __future__ import annotations

import argparse
import glob
import io
import json
import os
import pstats
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [ROOT, os.path.join(ROOT, "src")]


PRELUDE = """import importlib, runpy, sys
import ostinato  # every variant alike: imported before the clock
for spec in {sets!r}:
    target, value = spec.split("=", 1)
    module, attr = target.split(":")
    setattr(importlib.import_module(module), attr, eval(value))
sys.argv = ["bench.suite.child"] + sys.argv[1:]
runpy.run_module("bench.suite.child", run_name="__main__", alter_sys=True)
"""


def profile_once(cfg_dir: str, name: str, out_prefix: str, top: int, profile: bool = True,
                 sets: list[str] | None = None) -> dict:
    prof = out_prefix + ".prof"
    from bench.suite.startup import _env, _run      # as the suite's children: Python's bytecode primed
    env = _env(OSTINATO_CACHE_DIR=os.path.join(cfg_dir, "ostinato-cache"),
               TRITON_CACHE_DIR=tempfile.mkdtemp(prefix="triton-warm-profile-"))
    if sets is not None:      # a variant: ostinato imported (outside the child's clock) and patched first
        cmd = [sys.executable, "-c", PRELUDE.format(sets=sets), "ostinato_warm", name, cfg_dir]
    else:
        cmd = [sys.executable, *(["-m", "cProfile", "-o", prof] if profile else []), "-m", "bench.suite.child",
               "ostinato_warm", name, cfg_dir]
    p, failure = _run(cmd, env, 600)         # the suite's runner of children: its errors, its crash sites
    if failure is not None:
        return failure
    rec: dict = {"status": "ok", "child": json.loads(p.stdout.strip().splitlines()[-1])}
    if profile and os.path.exists(prof):
        text = io.StringIO()
        stats = pstats.Stats(prof, stream=text)
        stats.sort_stats("cumulative").print_stats("ostinato/", top)   # import torch is outside the clocks
        stats.sort_stats("tottime").print_stats(top)
        stats.print_callers(r"torch\.empty|copy_|synchronize|_cuda_init", 12)   # who pays the first uses
        with open(out_prefix + ".txt", "w") as f:
            f.write(text.getvalue())
    return rec


def _summary(rec: dict) -> str:
    """One warm process's times and phases, or its error."""
    if rec.get("status") != "ok":
        return f"failed: {rec.get('error')}"
    c = rec["child"]
    times = [f"{k} {c[k]:.3f}" for k in ("load_s", "compile_s", "first_output_s", "total_s") if k in c]
    return ", ".join(times + [f"{k} {v:.3f}" for k, v in c.get("phases", {}).items()])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workdir", required=True, help="bench/run_suite.py's --workdir")
    ap.add_argument("--out", required=True)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--top", type=int, default=45)
    ap.add_argument("--no-profile", action="store_true", help="time the warm processes without cProfile")
    ap.add_argument("--variant", action="append", default=[], metavar="NAME=MODULE:ATTR=VALUE[;...]",
                    help="instead: unprofiled warm processes with these module attributes set first (each "
                         "variant --repeats times, interleaved; 'NAME=' sets nothing). Every variant imports "
                         "ostinato before the child's clock starts, so their load_s compare with each other, "
                         "not with the suite's ostinato_warm")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    report = {}
    for cfg_dir in sorted(glob.glob(os.path.join(a.workdir, "*"))):
        if not os.path.exists(os.path.join(cfg_dir, "model.ost")):
            continue
        import torch
        name = torch.load(os.path.join(cfg_dir, "io.pt"), weights_only=True)["config"]["name"]
        runs = []
        variants = [(v.split("=", 1)[0], [x for x in v.split("=", 1)[1].split(";") if x]) for v in a.variant]
        for i in range(a.repeats):
            for vname, sets in (variants or [(None, None)]):
                tag = f"{os.path.basename(cfg_dir)}-{vname + '-' if vname else ''}{i}"
                rec = profile_once(cfg_dir, name, os.path.join(a.out, tag), a.top, not a.no_profile and not variants,
                                   sets)
                rec["variant"] = vname
                runs.append(rec)
                print(f"{name} {vname or ''} #{i}: {_summary(rec)}", flush=True)
        report[name] = runs
    with open(os.path.join(a.out, "warm_profile.json"), "w") as f:
        json.dump(report, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
