"""Program file load time against weight size (CPU), with and without sha256 verification.

For each size, exports a stack of Linear layers with about that many bytes of fp32 weights, saves it,
then loads it in fresh processes (median of --repeats): verify=False; verify=True of a fresh copy of the
file (another inode: its weights are hashed, as on the first load of any file); and verify=True of the
saved file once a load checked it (only the FlatBuffer is hashed: ``program/ir_cache.data_verified``). It reports the file size next to the weights'
raw size. The files were just written, so they are in the page cache: this measures ostinato's work, not
the disk. The fresh processes share a cache directory of their own.

    .venv/bin/python bench/program_load.py --sizes-mb 100 1000 --json out.json
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import torch

import ostinato

CHILD = """
import sys, time, ostinato
import ostinato.program.format as fmt
fmt.POPULATE = sys.argv[3] == "1"
t0 = time.perf_counter()
prog = ostinato.load(sys.argv[1], verify=sys.argv[2] == "1")
t1 = time.perf_counter()
print(t1 - t0)
"""


def make_program(mb: int) -> tuple[ostinato.Program, int]:
    dim = 2048
    per_layer = dim * dim * 4 + dim * 4
    layers = max(1, round(mb * 2**20 / per_layer))
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(dim, dim) for _ in range(layers)]).eval()
    prog = ostinato.export(model, (torch.randn(1, dim),))
    return prog, layers * per_layer


def fresh_load_seconds(path: str, verify: bool, repeats: int, env: dict, copy: bool = False,
                       populate: bool = True) -> list[float]:
    """Seconds to load ``path`` in fresh processes; ``copy``: each time a new copy of it (a file not
    checked here before); ``populate``: the mapping's page tables filled before the hash reads it
    (``program.format.POPULATE``)."""
    times = []
    for i in range(repeats):
        target = path
        if copy:
            target = f"{path}.copy{i}"
            shutil.copyfile(path, target)
        out = subprocess.run([sys.executable, "-c", CHILD, target, "1" if verify else "0",
                              "1" if populate else "0"], check=True,
                             capture_output=True, text=True, env=env)
        times.append(float(out.stdout.strip().splitlines()[-1]))
        if copy:
            os.remove(target)
    return times


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes-mb", type=int, nargs="+", default=[100, 1000])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--json", help="write the results here too")
    args = ap.parse_args()
    rows = []
    folder = tempfile.mkdtemp(prefix="ostinato-load-")
    env = dict(os.environ, OSTINATO_CACHE_DIR=os.path.join(folder, "cache"))
    env.pop("OSTINATO_REDIS_URL", None)
    for mb in args.sizes_mb:
        prog, raw = make_program(mb)
        path = os.path.join(folder, f"linear-{mb}mb.ost")
        t0 = time.perf_counter()
        prog.save(path)
        t_save = time.perf_counter() - t0
        del prog
        row = {"weights_mb": raw / 2**20, "file_mb": os.path.getsize(path) / 2**20, "save_s": t_save}
        time.sleep(0.2)   # older than ir_cache.RACY_NS: the first load below records its check
        fresh_load_seconds(path, True, 1, env)
        for name, verify, copy, populate in (("verify_False", False, False, True),
                                             ("verify_True_new_file", True, True, True),
                                             ("verify_True_new_file_no_populate", True, True, False),
                                             ("verify_True_recorded", True, False, True)):
            ts = fresh_load_seconds(path, verify, args.repeats, env, copy, populate)
            row[f"load_{name}_s"] = statistics.median(ts)
            row[f"load_{name}_all"] = ts
        rows.append(row)
        os.remove(path)
    report = {"device": "cpu", "torch": torch.__version__, "ostinato": ostinato.__version__,
              "date": time.strftime("%Y-%m-%d"), "repeats": args.repeats, "rows": rows}
    print(f"{'weights':>10} {'file':>10} {'verify=False':>13} {'verify=True, new file':>22} "
          f"{'(no populate)':>14} {'verify=True, recorded':>22}")
    for r in rows:
        print(f"{r['weights_mb']:8.1f}MB {r['file_mb']:8.1f}MB {1000 * r['load_verify_False_s']:11.1f}ms "
              f"{1000 * r['load_verify_True_new_file_s']:20.1f}ms "
              f"{1000 * r['load_verify_True_new_file_no_populate_s']:12.1f}ms {1000 * r['load_verify_True_recorded_s']:20.1f}ms")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
