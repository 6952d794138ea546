"""The GPU check: run on the lent GPU (device tool) to test and measure what CI cannot.

Runs the `cuda`-marked tests, then bench/replay.py on CUDA (fp32 and bf16), and writes one JSON report
(device, versions, test summary, figures) to $OUT/gpu_check.json (or --out). ``--slow`` also runs the tests
CI's command leaves out (tests/slow_tests.txt, marked slow: model checks, interpreted whole-model kernels,
fresh-process suites) on the machine's cores, each in its own pytest worker; ``--slow-only`` only them.

    PYTHONPATH=src python3 scripts/gpu_check.py
    PYTHONPATH=src python3 scripts/gpu_check.py --slow-only
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(cmd: list[str], timeout: int) -> tuple[int, str]:
    t0 = time.perf_counter()
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "src") + os.pathsep + os.environ.get("PYTHONPATH", ""),
               PYTHONUNBUFFERED="1")
    try:
        p = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
        out, rc = p.stdout + p.stderr, p.returncode
    except subprocess.TimeoutExpired as e:
        out, rc = (e.stdout or b"").decode() if isinstance(e.stdout, bytes) else (e.stdout or ""), 124
    print(f"$ {' '.join(cmd)}  (rc {rc}, {time.perf_counter() - t0:.1f}s)\n{out[-6000:]}", flush=True)
    return rc, out


def slow_files() -> list[str]:
    """The test files tests/slow_tests.txt names (its ids' paths)."""
    with open(os.path.join(ROOT, "tests", "slow_tests.txt")) as f:
        ids = {line.split("#", 1)[0].strip() for line in f} - {""}
    return sorted({i.split("::", 1)[0] for i in ids})


def environment() -> dict:
    """Date, device and versions (torch, CUDA, Triton, Python): the head of every GPU report."""
    import torch
    report: dict = {"date": time.strftime("%Y-%m-%d %H:%M:%S"), "torch": torch.__version__,
                    "cuda": torch.version.cuda, "python": sys.version.split()[0],
                    "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None}
    for name in ("triton", "numpy", "transformers"):    # (the interpreted and model tests depend on them)
        try:
            report[name] = __import__(name).__version__
        except ImportError:
            report[name] = None
    return report


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--bench", nargs="*", default=["float32:64:128", "bfloat16:64:128"],
                    help="bench/replay.py configurations as DTYPE:LAYERS:HIDDEN")
    ap.add_argument("--torch-compile", action="store_true", help="add torch.compile reduce-overhead to the benches")
    ap.add_argument("--skip-tests", action="store_true")
    ap.add_argument("--name", default="gpu_check", help="the report's file name, without .json")
    ap.add_argument("--slow", action="store_true", help="also run the tests marked slow (tests/slow_tests.txt)")
    ap.add_argument("--slow-only", action="store_true", help="run the slow tests and nothing else")
    args = ap.parse_args()
    report = environment()
    if args.slow or args.slow_only:
        workers = str(max(2, min(16, os.cpu_count() or 2)))
        # only the files that hold slow tests: a module of others may import what this machine lacks (redis)
        rc, out = run([sys.executable, "-m", "pytest", "-q", "-m", "slow and not cuda", "-p", "no:cacheprovider",
                       "-n", workers, "--timeout", "900", *slow_files(), "-rfEs"], timeout=1800)
        report["slow_tests"] = {"rc": rc, "summary": out.strip().splitlines()[-1] if out.strip() else ""}
        if args.slow_only:
            args.skip_tests, args.bench = True, []
    if not args.skip_tests:
        rc, out = run([sys.executable, "-m", "pytest", "-q", "-m", "cuda", "-p", "no:cacheprovider",
                       "-n", "4", "tests/replay", "tests/backends", "-rfEs"], timeout=420)
        report["cuda_tests"] = {"rc": rc, "summary": out.strip().splitlines()[-1] if out.strip() else ""}
    report["bench"] = {}
    for spec in args.bench:
        dtype, layers, dim = spec.split(":")
        path = os.path.join(args.out, f"replay_{dtype}_{layers}x{dim}.json")
        cmd = [sys.executable, "bench/replay.py", "--device", "cuda", "--dtype", dtype, "--layers", layers,
               "--dim", dim, "--json", path] + (["--torch-compile"] if args.torch_compile else [])
        rc, _ = run(cmd, timeout=400)
        if rc == 0 and os.path.exists(path):
            with open(path) as f:
                report["bench"][spec] = json.load(f)
        else:
            report["bench"][spec] = {"rc": rc}
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, args.name + ".json"), "w") as f:
        json.dump(report, f, indent=2)
    print(json.dumps({k: v for k, v in report.items() if k != "bench"}, indent=2))
    for dtype, b in report["bench"].items():
        print(dtype, json.dumps(b.get("step_ms_median", b)))


if __name__ == "__main__":
    main()
