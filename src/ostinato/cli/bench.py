"""Run the benchmark suite (bench/suite in an ostinato checkout): each configuration of the matrix by
torch eager, a CUDA graph of eager, torch.compile (default, reduce-overhead) and ostinato with and
without replay; outputs checked against eager, then timed. Writes results.json, results.md and
speedup.png to --out. Progress goes to stderr."""
from __future__ import annotations

import argparse
import json
import os
import sys

from ..errors import OstinatoError

HELP = "run the benchmark suite against eager, CUDA graphs and torch.compile"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--device", choices=["cpu", "cuda"], default=None,
                   help="which configurations to run (default: cuda when torch sees a GPU, else cpu)")
    p.add_argument("--quick", action="store_true",
                   help="a representative subset (under 8 minutes on one GPU): torch.compile in reduce-overhead "
                        "mode only, start-up figures for the tiny decoder only")
    p.add_argument("--part", metavar="K/N", help="run the K-th of N parts of the selection (1-based), balanced "
                                                  "by estimated (or --costs measured) time")
    p.add_argument("--configs", metavar="PATTERN", help="comma-separated globs or substrings of configuration names")
    p.add_argument("--runners", metavar="LIST", help="comma-separated runners (default: all that apply, the "
                   "A/B ones aside): eager, cuda_graph_eager, torch_compile, torch_compile_ro, ostinato, "
                   "ostinato_replay, aoti, aoti_cuda_graph, executorch_xnnpack; A/B: ostinato_replay_unfused, "
                   "ostinato_replay_nolinear, ostinato_replay_noattention, ostinato_replay_nchw; "
                   "on request where MLX is installed: ostinato_mlx, ostinato_mlx_replay (CPU configurations; "
                   "on Linux these are MLX's CPU build, not Metal)")
    p.add_argument("--no-startup", action="store_true", help="skip the fresh-process time-to-first-output figures")
    p.add_argument("--startup-configs", metavar="PATTERN", help="measure the fresh-process figures only for the "
                                                                "configurations these globs or substrings match")
    p.add_argument("--out", metavar="DIR", default="bench-results", help="output directory (default bench-results)")
    p.add_argument("--merge", nargs="+", metavar="JSON", help="merge these parts' results.json into one report "
                                                              "in --out instead of running")
    p.add_argument("--costs", nargs="+", metavar="JSON", help="earlier results.json whose measured wall times "
                                                              "replace the estimates when splitting --part")
    p.add_argument("--list", action="store_true", help="list the selected configurations with estimated "
                                                       "seconds and the parts they need, and exit")
    p.add_argument("--trial-seconds", type=float, default=None, help="target duration of one timed trial "
                                                                     "(default 0.05)")
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads here and in the fresh processes "
                                                          "(default: torch's); 1 on a shared, busy CPU")
    p.add_argument("--workdir", help="where fresh processes keep .ost files and caches (default: a temporary "
                                     "directory)")


def locate_checkout() -> str:
    """The checkout holding bench/suite: OSTINATO_CHECKOUT, the one ostinato was imported from, or the
    current directory."""
    here = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    for root in (os.environ.get("OSTINATO_CHECKOUT"), here, os.getcwd()):
        if root and os.path.isfile(os.path.join(root, "bench", "suite", "run.py")):
            return root
    raise OstinatoError("the benchmark suite lives in an ostinato checkout (bench/suite), and none was found\n"
                        "Fix: run from a git checkout (PYTHONPATH=src or pip install -e .), "
                        "or set OSTINATO_CHECKOUT=/path/to/checkout")


def _parse_part(text: str) -> tuple[int, int]:
    try:
        k, n = (int(x) for x in text.split("/"))
    except ValueError:
        raise OstinatoError(f"--part {text!r} is not K/N\nFix: --part 2/5 runs the second of five parts") from None
    if not 1 <= k <= n:
        raise OstinatoError(f"--part {text}: K must be between 1 and N\nFix: --part 1/{max(n, 1)}")
    return k, n


def run(args: argparse.Namespace) -> int:
    root = locate_checkout()
    if root not in sys.path:
        sys.path.insert(0, root)
    from bench.suite import configs, report, run as suite_run
    if args.merge:
        docs = []
        for path in args.merge:
            with open(path) as f:
                docs.append(json.load(f))
        paths = report.write(report.merge(docs), args.out)
        sys.stderr.write(f"merged {len(docs)} results into {paths['json']}, {paths['markdown']}, {paths['chart']}\n")
        return 0
    import torch
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available() and not args.list:
        raise OstinatoError("--device cuda: torch sees no CUDA device\nFix: run on a GPU machine, or --device cpu")
    wanted = args.runners.split(",") if args.runners else None
    unknown = [r for r in wanted or [] if r not in configs.RUNNERS]
    if unknown:
        raise OstinatoError(f"unknown runners {unknown}\nFix: choose from {', '.join(configs.RUNNERS)}")
    if wanted is None and args.quick:
        wanted = list(configs.QUICK_RUNNERS)
    selected = configs.select(device, args.configs, args.quick)
    if not selected:
        raise OstinatoError(f"no {device} configuration matches {args.configs!r}\nFix: ostinato bench --list "
                            f"--device {device} shows them")
    measured = configs.load_measured(args.costs) if args.costs else None
    startup = not args.no_startup

    def cost(c):
        return configs.estimate_seconds(c, wanted or list(configs.RUNNERS),
                                        configs.wants_startup(c, startup, args.quick, args.startup_configs), measured)
    selection = {"device": device, "quick": args.quick, "configs": args.configs, "runners": wanted,
                 "startup": startup, "startup_configs": args.startup_configs, "part": args.part,
                 "threads": args.threads or None}
    if args.part:
        k, n = _parse_part(args.part)
        selected = configs.split_parts(selected, n, cost)[k - 1]
    if args.list:
        for c in selected:
            sys.stdout.write(f"{c.name:36s} {c.category:15s} ~{cost(c):6.0f} s\n")
        sys.stdout.write(f"{len(selected)} configurations, ~{sum(map(cost, selected)):.0f} s; "
                         f"{configs.parts_needed(selected, cost)} part(s) of at most {configs.PART_BUDGET_S:.0f} s\n")
        return 0
    sys.stderr.write(f"ostinato bench: {len(selected)} {device} configurations, estimated "
                     f"{sum(map(cost, selected)):.0f} s\n")
    timing = {"trial_seconds": args.trial_seconds} if args.trial_seconds else {}
    if args.threads:
        torch.set_num_threads(args.threads)
        os.environ["OMP_NUM_THREADS"] = str(args.threads)   # the fresh processes inherit it
    os.makedirs(args.out, exist_ok=True)
    partial = os.path.join(args.out, "results.partial.json")

    def checkpoint(doc: dict) -> None:
        # What a run cut short (a time limit) has measured so far: --merge takes it like a full result.
        with open(partial + ".tmp", "w") as f:
            json.dump({**doc, "selection": selection, "partial": True}, f, indent=1, default=str)
        os.replace(partial + ".tmp", partial)

    doc = suite_run.run_suite(selected, wanted, startup, quick=args.quick, workdir=args.workdir, timing=timing,
                              startup_only=args.startup_configs, checkpoint=checkpoint)
    doc["selection"] = selection
    paths = report.write(doc, args.out)
    if os.path.exists(partial):
        os.remove(partial)
    sys.stderr.write(f"wrote {paths['json']}, {paths['markdown']}, {paths['chart']}; "
                     f"{len(doc['regressions'])} regressions, {len(doc['failures'])} failures\n")
    return 0
