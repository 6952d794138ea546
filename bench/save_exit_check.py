"""What the saving process's exit check costs, and what it saves the next load (program/reader.check_saved).

Fresh processes, each with a private, empty cache: one exports a stack of ``--layers`` fp32
``Linear(--width, --width)`` and saves it, with an ``atexit`` timer registered before ostinato is imported
(handlers run last-registered first, so it runs after the check); then a second process loads the file
with ``verify="checksums"``. With the check (the default) and without (``OSTINATO_CHECK_SAVED=0``),
``--repeats`` times each, interleaved.

    .venv/bin/python bench/save_exit_check.py [--layers 16 --width 4096 --repeats 3] [--out FILE.json]
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

SAVE = """
import atexit, sys, time
marks = dict()
atexit.register(lambda: print("EXIT", time.perf_counter() - marks["saved"], flush=True))
import torch, ostinato
torch.manual_seed(0)
model = torch.nn.Sequential(*[torch.nn.Linear({width}, {width}) for _ in range({layers})])
ostinato.export(model, (torch.randn(2, {width}),)).save(sys.argv[1])
marks["saved"] = time.perf_counter()
"""
LOAD = """
import sys, time, ostinato
t0 = time.perf_counter()
prog = ostinato.load(sys.argv[1], verify="checksums")
print("LOAD", time.perf_counter() - t0, prog.timings["load_data_hash"], flush=True)
"""


def one(check: bool, layers: int, width: int) -> dict:
    with tempfile.TemporaryDirectory(prefix="ost-exit-check-") as work:
        env = dict(os.environ, OSTINATO_CACHE_DIR=os.path.join(work, "cache"),
                   OSTINATO_CHECK_SAVED="1" if check else "0",
                   PYTHONPATH=os.pathsep.join([os.path.join(ROOT, "src"), os.environ.get("PYTHONPATH", "")]))
        path = os.path.join(work, "m.ost")
        out = subprocess.run([sys.executable, "-c", SAVE.format(width=width, layers=layers), path], env=env,
                             check=True, capture_output=True, text=True).stdout
        exit_s = float(next(line.split()[1] for line in out.splitlines() if line.startswith("EXIT")))
        out = subprocess.run([sys.executable, "-c", LOAD, path], env=env, check=True, capture_output=True,
                             text=True).stdout
        _, load_s, hash_s = next(line.split() for line in out.splitlines() if line.startswith("LOAD"))
        return {"check": check, "bytes": os.path.getsize(path), "exit_handlers_s": exit_s,
                "next_load_s": float(load_s), "next_load_data_hash_s": float(hash_s)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--width", type=int, default=4096)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", help="write the figures as JSON here")
    args = ap.parse_args()
    rows = []
    for _ in range(args.repeats):
        for check in (True, False):
            r = one(check, args.layers, args.width)
            rows.append(r)
            print(f"check {'on ' if check else 'off'}: {r['bytes'] / 1e9:.2f} GB, exit handlers "
                  f"{r['exit_handlers_s']:.3f} s, next load {r['next_load_s']:.3f} s "
                  f"(data hash {r['next_load_data_hash_s']:.3f} s)", flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"machine": platform.machine(), "cpus": os.cpu_count(), "python": platform.python_version(),
                       "layers": args.layers, "width": args.width, "runs": rows}, f, indent=1)


if __name__ == "__main__":
    main()
