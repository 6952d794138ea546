"""Issue #17's GPU checks, run on the lent GPU (device tool); one JSON report per stage under $OUT.

Stages (each fits one device call of 10 minutes; jobs of a stage run in parallel, each in its own
process with its own log under $OUT/logs/):
  mixed      issue #17's case (tests/replay/mixed_case.py) in several set-up orders, with and without
             the capture's cuBLAS-workspace clearing, and without ostinato; the 1,000-step mixed test;
             the `cuda` tests of the kernel table (guard bands, largest sizes) and of symbolic sizes
  memcheck   compute-sanitizer --tool memcheck over the kernel table's and the generated kernels'
             `cuda` tests, and one run per suite model family (scripts/replay_families.py): replayed
             (CUDA graphs, caching allocator) and step by step with PYTORCH_NO_CUDA_MEMORY_CACHING=1, so
             that each tensor is its own allocation and an access past it is an error
  memcheck-tests  memcheck over every `cuda` test but the `slow` ones (caching allocator: replay tests
             capture), one job per test directory
  racecheck  compute-sanitizer --tool racecheck (shared-memory hazards) over the Triton kernels' tests

    PYTHONPATH=src python3 scripts/gpu_reliability.py --stage mixed --out $OUT
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PY = sys.executable
SANITIZER_ERRORS = re.compile(r"ERROR SUMMARY: (\d+) error")
PYTEST_SUMMARY = re.compile(r"^=*\s*(\d+ (?:passed|failed|errors?|skipped|deselected).*?) in [\d.]+s", re.M)


def _families() -> list[str]:
    sys.path.insert(0, ROOT)
    from scripts.replay_families import family_configs
    return list(family_configs("cuda"))


def sanitizer() -> str:
    found = shutil.which("compute-sanitizer")
    if found:
        return found
    for root in ("/usr/local/cuda/bin", "/usr/local/cuda/compute-sanitizer", "/opt/nvidia/compute-sanitizer"):
        path = os.path.join(root, "compute-sanitizer")
        if os.path.exists(path):
            return path
    raise SystemExit("compute-sanitizer not found (PATH, /usr/local/cuda)")


def run_job(name: str, cmd: list[str], out: str, timeout: int, env: dict | None = None) -> dict:
    os.makedirs(os.path.join(out, "logs"), exist_ok=True)
    log = os.path.join(out, "logs", name + ".log")
    full_env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "src") + os.pathsep + ROOT, PYTHONUNBUFFERED="1",
                    **(env or {}))
    t0 = time.perf_counter()
    with open(log, "w") as f:
        f.write("$ " + " ".join(cmd) + "\n")
        f.flush()
        try:
            rc = subprocess.run(cmd, cwd=ROOT, env=full_env, stdout=f, stderr=subprocess.STDOUT,
                                timeout=timeout).returncode
        except subprocess.TimeoutExpired:
            rc = 124
    text = open(log, errors="replace").read()
    res: dict = {"rc": rc, "seconds": round(time.perf_counter() - t0, 1), "cmd": " ".join(cmd[-12:])}
    errs = SANITIZER_ERRORS.findall(text)
    if errs:
        res["sanitizer_errors"] = sum(int(e) for e in errs)
    m = PYTEST_SUMMARY.findall(text)
    if m:
        res["pytest"] = m[-1]
    lines = [line for line in text.splitlines() if line.startswith(("FAMILY", "SUMMARY", "{"))]
    if lines:
        res["lines"] = lines[-40:]
    if rc != 0:
        res["tail"] = text[-2500:]
    print(f"[{name}] rc {rc} {res['seconds']}s {res.get('pytest', '')} "
          f"{'sanitizer errors ' + str(res['sanitizer_errors']) if errs else ''}", flush=True)
    return res


def jobs_for(stage: str) -> list[tuple]:
    """(name, command, timeout seconds, extra env) of each job of ``stage``."""
    mixed = os.path.join("tests", "replay", "mixed_case.py")
    pytest = [PY, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "cuda", "-rfE"]
    exact = {"PYTORCH_NO_CUDA_MEMORY_CACHING": "1", "OSTINATO_TEST_NO_CUDNN_SDPA": "1"}
    if stage == "mixed":
        jobs = []
        for order, extra, runs in (("ost,graph,ro", [], 2), ("ost,graph,ro", ["--no-own-workspace"], 2),
                                   ("graph,ro", [], 1), ("graph,ost,ro", [], 1), ("ro,graph,ost", [], 1),
                                   ("ost,ro", ["--no-own-workspace"], 2), ("ost,ro", [], 2),
                                   ("ro,ost", ["--no-own-workspace"], 1), ("graph,graph2,eager", [], 1)):
            for k in range(runs):
                name = f"case-{order.replace(',', '-')}{'-noown' if extra else ''}-{k}"
                jobs.append((name, [PY, mixed, order, *extra], 480, None))
        jobs.append(("mixed-1000-steps", pytest + ["tests/replay/test_mixed_cuda.py", "-k", "interleaved"], 480, None))
        jobs.append(("kernel-table", pytest + ["tests/backends/test_triton_kernels.py"], 480, None))
        jobs.append(("symbolic-sizes", pytest + ["tests/codegen/test_cuda_fused.py", "-k", "symbolic"], 480, None))
        return jobs
    cs = sanitizer()
    if stage == "memcheck":
        tool = [cs, "--tool", "memcheck", "--print-limit", "30"]
        fams = _families()
        groups = [fams[i::4] for i in range(4)]
        jobs = [("memcheck-torch-only-sdpa", tool + [PY, "-c", TORCH_SDPA], 300, {"PYTORCH_NO_CUDA_MEMORY_CACHING": "1"}),
                ("memcheck-kernel-table", tool + pytest + ["tests/backends/test_triton_kernels.py"], 560, exact),
                ("memcheck-generated", tool + pytest + ["tests/codegen/test_cuda_fused.py", "-k",
                                                        "symbolic and step or zoo and step"], 560, exact)]
        for i, g in enumerate(groups):
            fam = [os.path.join("scripts", "replay_families.py"), "--families", ",".join(g)]
            jobs.append((f"memcheck-families-replay-{i}", tool + [PY] + fam + ["--replay"], 560, None))
            jobs.append((f"memcheck-families-step-{i}", tool + [PY] + fam, 560,
                         {"PYTORCH_NO_CUDA_MEMORY_CACHING": "1"}))
        return jobs
    if stage == "memcheck-tests":     # every `cuda` test but the slow ones, with the caching allocator
        tool = [cs, "--tool", "memcheck", "--print-limit", "30"]
        quick = [c if c != "cuda" else "cuda and not slow" for c in pytest]
        nocudnn = {"OSTINATO_TEST_NO_CUDNN_SDPA": "1"}
        return [("memcheck-tests-ops", tool + quick + ["tests/ops/test_op_table.py"], 580, nocudnn),
                ("memcheck-tests-replay", tool + quick + ["tests/replay"], 580, nocudnn),
                ("memcheck-tests-codegen", tool + quick + ["tests/codegen"], 580, nocudnn),
                ("memcheck-tests-other", tool + quick + ["-v", "tests/backends", "tests/dynamo", "tests/llm", "tests/runtime",
                                                         "tests/models", "-k", "not test_kernel_on_gpu"], 580, nocudnn)]
    if stage == "racecheck":
        tool = [cs, "--tool", "racecheck", "--print-limit", "30"]
        return [("racecheck-torch-only-sdpa", tool + [PY, "-c", TORCH_SDPA], 300, None),
                ("racecheck-kernel-table", tool + pytest + ["tests/backends/test_triton_kernels.py"], 560,
                 {"OSTINATO_TEST_NO_CUDNN_SDPA": "1"}),
                ("racecheck-generated", tool + pytest + ["tests/codegen/test_cuda_fused.py", "-k", "zoo and step"], 560,
                 None)]
    raise SystemExit(f"unknown stage {stage!r}")


# torch alone, no ostinato: the SDPA calls of the kernel table's fallback cases (torch picks cuDNN's
# attention for them on sm90), to show whether a sanitizer report there is torch's
TORCH_SDPA = ("import torch, torch.nn.functional as F\n"
              "for dt in (torch.float16, torch.bfloat16):\n"
              "    for shape, causal in (((1, 2, 5, 16), True), ((1, 2, 2, 16), False)):\n"
              "        q, k, v = (torch.randn(shape, device='cuda', dtype=dt) for _ in range(3))\n"
              "        F.scaled_dot_product_attention(q, k, v, is_causal=causal)\n"
              "    q = torch.randn(1, 4, 1, 64, device='cuda', dtype=dt)\n"
              "    k, v = (torch.randn(1, 2, 4099, 64, device='cuda', dtype=dt) for _ in range(2))\n"
              "    mask = (torch.arange(4099, device='cuda') <= torch.tensor([[4098]], device='cuda'))\n"
              "    F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)\n"
              "torch.cuda.synchronize(); print('torch-only SDPA done')")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--stage", required=True, choices=["mixed", "memcheck", "memcheck-tests", "racecheck"])
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--parallel", type=int, default=8)
    ap.add_argument("--only", default="", help="run only the jobs whose name contains this")
    args = ap.parse_args()
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from gpu_check import environment
    report: dict = {"stage": args.stage, **environment()}
    if args.stage != "mixed":
        v = subprocess.run([sanitizer(), "--version"], capture_output=True, text=True)
        report["compute_sanitizer"] = v.stdout.strip().splitlines()[-1] if v.stdout.strip() else v.stderr[-200:]
    jobs = [j for j in jobs_for(args.stage) if args.only in j[0]]
    t0 = time.perf_counter()
    with ThreadPoolExecutor(args.parallel) as pool:
        futures = {name: pool.submit(run_job, name, cmd, args.out, timeout, env) for name, cmd, timeout, env in jobs}
        report["jobs"] = {name: f.result() for name, f in futures.items()}
    report["seconds"] = round(time.perf_counter() - t0, 1)
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, f"gpu_reliability_{args.stage}.json")
    with open(path, "w") as f:
        json.dump(report, f, indent=2)
    print(json.dumps({k: v for k, v in report.items() if k != "jobs"}, indent=2))


if __name__ == "__main__":
    main()
