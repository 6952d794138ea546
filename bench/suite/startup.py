"""Time to first output in fresh processes (bench/suite/child.py), for one configuration: ostinato cold
(empty caches) and warm (the .ost on disk, the cache the cold process filled, an empty Triton
directory so kernels must come from ostinato's cache), torch.compile reduce-overhead cold (empty
Inductor and Triton caches; it also gives that runner's steady-state cell) and warm (its caches warm),
AOTInductor cold (export, compile and package with empty caches, load, first output) and warm (load
the package, first output), ExecuTorch cold (export, lower to XNNPACK, save the .pte, load, first
output) and warm (load the .pte, first output). The in-process AOTInductor and ExecuTorch runners
then load the files their cold processes made (bench/suite/peers.py).

Every cache directory is private to the configuration, under its work directory, as in
bench/startup.py; no Redis.
"""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from typing import Any

import torch
from torch.utils import _pytree as pytree

from . import ROOT
from .configs import Config
from .measure import Reference

CHILD_TIMEOUT_S = 900
STDERR_LINES = 40       # of a failed child's stderr, kept in the result (the JSON)
_FRAME = re.compile(r'\s+File "(?P<file>[^"]+)", line (?P<line>\d+) in (?P<func>\S+)')


_BYTECODE: dict = {}


def _env(**dirs: str) -> dict:
    # a crash prints the crashing thread's Python stack (faulthandler), which crash_site reads
    env = dict(os.environ, PYTHONUNBUFFERED="1", PYTHONFAULTHANDLER="1")
    env.pop("OSTINATO_REDIS_URL", None)
    env["PYTHONPATH"] = os.pathsep.join([os.path.join(ROOT, "src"), ROOT, env.get("PYTHONPATH", "")])
    # Python's bytecode cache primed once per run (bench/bytecode.py): children time the work, not the
    # compilation of every imported module on a machine without .pyc files.
    if not _BYTECODE:
        import tempfile
        from bench.bytecode import prime
        _BYTECODE.update(prime(dict(env), os.path.join(tempfile.gettempdir(), f"ostinato-bench-pycache-{os.getuid()}")))
    env["PYTHONPYCACHEPREFIX"] = _BYTECODE["folder"]
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env.update(dirs)
    return env


def run_child(mode: str, config: Config, workdir: str, env: dict, timeout: float = CHILD_TIMEOUT_S) -> dict:
    cmd = [sys.executable, "-m", "bench.suite.child", mode, config.name, workdir]
    t0 = time.perf_counter()
    p, failure = _run(cmd, env, timeout)
    if failure is not None:
        return failure
    process_s = time.perf_counter() - t0
    res = json.loads(p.stdout.strip().splitlines()[-1])
    res["process_s"] = process_s
    res["status"] = "error" if "error" in res else "ok"
    return res


def crash_site(stderr: str, frames: int = 3) -> str | None:
    """Where a process that died of a signal was, from faulthandler's report of the crashing thread
    (``Current thread ... (most recent call first):`` and its ``File "...", line N in f`` lines): the
    innermost ``frames`` frames as ``f (file.py:N) < g (other.py:M)``; None without such a report."""
    lines = stderr.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith("Current thread ")
                  and "most recent call first" in line), None)
    if start is None:
        return None
    sites = []
    for line in lines[start + 1:]:
        m = _FRAME.match(line)
        if m is None:
            break
        sites.append(f"{m['func']} ({os.path.basename(m['file'])}:{m['line']})")
    return " < ".join(sites[:frames]) or None


_PROBES: dict[str, dict | None] = {}


def aoti_probe(device: str, workdir: str) -> dict | None:
    """None when AOTInductor packages, loads and runs a small MLP on ``device`` in a fresh process
    (bench/aoti_probe.py, once per device and run), else that process's failure. On the lent GPU machine
    (torch 2.11) every package died in ``aoti_load_package``, the probe's too: there a configuration's
    AOTInductor cells say so instead of spending ~95 s each on a cold process that dies the same way.
    OSTINATO_SUITE_AOTI_PROBE=0 skips the probe (every configuration runs its own cold process)."""
    if os.environ.get("OSTINATO_SUITE_AOTI_PROBE", "1") == "0":
        return None
    if device not in _PROBES:
        env = _env(TORCHINDUCTOR_CACHE_DIR=os.path.join(workdir, "inductor-probe"),
                   TRITON_CACHE_DIR=os.path.join(workdir, "triton-probe"))
        cmd = [sys.executable, os.path.join(ROOT, "bench", "aoti_probe.py"), device]
        _PROBES[device] = _run(cmd, env, CHILD_TIMEOUT_S)[1]
    return _PROBES[device]


def _run(cmd: list[str], env: dict, timeout: float):
    """(the finished process, None) when ``cmd`` exits 0; else (None, its failure): the first line of its
    error, or the signal it died of with where (faulthandler's frames), and its stderr's last lines."""
    t0 = time.perf_counter()
    try:
        p = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return None, {"status": "error", "error": f"timed out after {timeout:.0f} s", "process_s": timeout}
    if p.returncode == 0:
        return p, None
    tail = [line for line in p.stderr.strip().splitlines() if line.strip()]
    last = (tail[-1] if tail else "")[:300]
    if p.returncode < 0:   # a crash (a loaded AOTInductor package, a runtime's kernel): said so
        try:
            sig = signal.Signals(-p.returncode).name
        except ValueError:
            sig = str(-p.returncode)
        site = crash_site(p.stderr)
        error = f"the process died of {sig}" + (f" in {site}" if site else f"; its last words: {last}" if last else "")
    else:
        error = last or f"exit status {p.returncode}"
    return None, {"status": "error", "error": error, "process_s": time.perf_counter() - t0,
                  "returncode": p.returncode, "stderr_tail": tail[-STDERR_LINES:]}


def peer_modes(runner_names: list[str]) -> tuple[str, ...]:
    """The peers whose cold and warm processes the runners call for: "aoti", "executorch"."""
    out = []
    if any(r in ("aoti", "aoti_cuda_graph") for r in runner_names):
        out.append("aoti")
    if "executorch_xnnpack" in runner_names:
        out.append("executorch")
    return tuple(out)


def write_io(config: Config, workdir: str, steps: list, ref: Reference, timing: dict) -> None:
    """WORKDIR/io.pt: what a child process reads (the configuration, steps, eager's outputs, tolerance)."""
    os.makedirs(workdir, exist_ok=True)
    to_cpu = lambda x: x.detach().cpu() if isinstance(x, torch.Tensor) else x   # noqa: E731
    torch.save({"config": config.as_dict(), "steps": pytree.tree_map(to_cpu, steps), "refs": pytree.tree_map(to_cpu, ref.outputs),
                "tolerance": ref.tolerance, "timing": timing}, os.path.join(workdir, "io.pt"))


def measure_startup(config: Config, workdir: str, steps: list, ref: Reference, timing: dict,
                    torch_compile: bool, log, peers: tuple[str, ...] = (), ostinato: bool = True) -> dict[str, Any]:
    """The fresh-process measurements, by name: ostinato's two (when ``ostinato``), torch.compile's
    two when ``torch_compile``, and each peer's (``peers``: "aoti", "executorch") cold and warm."""
    write_io(config, workdir, steps, ref, timing)
    d = lambda name: os.path.join(workdir, name)   # noqa: E731
    ost = dict(OSTINATO_CACHE_DIR=d("ostinato-cache"))
    plan = [("ostinato_cold", _env(**ost, TRITON_CACHE_DIR=d("triton-ost-cold"))),
            ("ostinato_warm", _env(**ost, TRITON_CACHE_DIR=d("triton-ost-warm")))] if ostinato else []
    if torch_compile:
        tc = _env(TORCHINDUCTOR_CACHE_DIR=d("inductor"), TRITON_CACHE_DIR=d("triton-tc"),
                  OSTINATO_CACHE_DIR=d("ostinato-unused"))
        plan += [("torch_compile_cold", tc), ("torch_compile_warm", tc)]
    for peer in peers:
        # AOTInductor's cold process compiles with empty Inductor and Triton caches of its own.
        penv = _env(TORCHINDUCTOR_CACHE_DIR=d(f"inductor-{peer}"), TRITON_CACHE_DIR=d(f"triton-{peer}"),
                    OSTINATO_CACHE_DIR=d("ostinato-unused"))
        plan += [(f"{peer}_cold", penv), (f"{peer}_warm", penv)]
    out: dict[str, Any] = {}
    if "aoti" in peers:
        failed = aoti_probe(config.device, os.path.dirname(os.path.abspath(workdir)))
        if failed is not None:
            out["aoti_cold"] = dict(failed, error=f"not run: AOTInductor fails in this environment: "
                                    f"bench/aoti_probe.py {config.device} (a small MLP): {failed['error']}")
            plan = [(m, e) for m, e in plan if m != "aoti_cold"]
            log(f"    aoti_cold: {out['aoti_cold']['error']}")
    for mode, env in plan:
        if mode.endswith("_warm") and out.get(mode[:-len("_warm")] + "_cold", {}).get("status") != "ok":
            what = {"ostinato_warm": "no .ost", "aoti_warm": "no .pt2 package", "executorch_warm": "no .pte"}
            if mode in what:
                out[mode] = {"status": "error", "error": f"{what[mode]}: the cold process failed"}
                continue
        log(f"    fresh process: {mode} ...")
        out[mode] = run_child(mode, config, workdir, env)
        r = out[mode]
        log(f"    {mode}: " + (f"{r['total_s']:.2f} s to first output" if r["status"] == "ok" else r["error"]))
    return out
