"""Fault figures for docs/reliability.md: damaged .ost files loaded in worker subprocesses.

    .venv/bin/python bench/reliability.py --files 10000 --out docs/reliability/program_faults.json

Each case is a good program file damaged by one mutation of ``bench/ost_mutations.py`` (bit flips,
truncation, splices, FlatBuffer lengths/offsets and header offsets/sizes set to edge values; half of
them re-sealed so the damage passes the checksums), loaded with each ``verify`` mode (True,
"checksums", False). Loads run in long-lived worker processes (one per core) that take one path at a
time over a pipe; a worker that dies is counted as a crash (with its signal), one that does not answer
within ``--timeout`` seconds as a hang, and either is replaced by a fresh one. Every outcome is one of:
loaded, ProgramFormatError (the clean refusal), another exception (named), crash, hang. At the end a
fresh worker loads each good file with verify="checksums" and checks it gets the good program back
(no damaged load left anything behind in the cache it shares with them).
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import platform
import queue
import random
import select
import shutil
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
for p in (ROOT, os.path.join(ROOT, "src"), os.path.join(ROOT, "tests")):
    if p not in sys.path:
        sys.path.insert(0, p)

MODES = (True, "checksums", False)
OUTCOMES = ("loaded", "format_error", "other_error", "crash", "hang")
RUN_OUTCOMES = ("ran", "ostinato_error", "other_error", "crash", "hang")


# -- the worker: one load per request line ----------------------------------------------------------
def worker_main() -> None:
    import logging
    logging.disable(logging.WARNING)     # damaged files make the loader's cache warn; not measured here
    import ostinato
    from ostinato.errors import OstinatoError, ProgramFormatError
    if os.environ.get("OST_FAULTS_MEMORY_LIMIT"):
        # A damaged program run unverified may ask for absurd buffers: a MemoryError, not the OOM killer.
        import resource
        limit = int(os.environ["OST_FAULTS_MEMORY_LIMIT"])
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    out = sys.stdout
    out.write(json.dumps({"ready": os.getpid()}) + "\n")
    out.flush()
    for line in sys.stdin:
        req = json.loads(line)
        t0 = time.perf_counter()
        try:
            prog = ostinato.load(req["path"], verify=req["verify"])
            res = {"outcome": "loaded"}
            if req.get("graph_text"):
                res["graph"] = str(prog.graph)
            if req.get("run"):
                res["run"] = _run_program(prog, OstinatoError)
        except ProgramFormatError as e:
            res = {"outcome": "format_error", "error": type(e).__name__}
        except BaseException as e:  # noqa: BLE001 - what is measured: anything but the clean refusal
            msg = str(e).strip().splitlines()
            res = {"outcome": "other_error", "error": type(e).__name__, "message": (msg[0] if msg else "")[:300]}
        res["seconds"] = time.perf_counter() - t0
        out.write(json.dumps(res) + "\n")
        out.flush()


def _run_program(prog, clean_error) -> dict:
    """Compile a loaded program for the CPU and call it once on random inputs shaped as at export."""
    from torch.utils import _pytree as pytree

    import ostinato
    from ostinato.cli.run import random_leaves
    try:
        exe = ostinato.compile(prog, device="cpu")
        args, kwargs = pytree.tree_unflatten(random_leaves(prog, exe.device, 0), prog.in_spec)
        exe(*args, **kwargs)
        return {"outcome": "ran"}
    except clean_error as e:
        return {"outcome": "ostinato_error", "error": type(e).__name__}
    except BaseException as e:  # noqa: BLE001 - measured
        msg = str(e).strip().splitlines()
        return {"outcome": "other_error", "error": type(e).__name__, "message": (msg[0] if msg else "")[:300]}


class Worker:
    """A worker subprocess; ``load`` returns its answer, or a crash or hang (then starts a new one)."""

    def __init__(self, env: dict, timeout: float, argv: list[str] | None = None):
        self.env, self.timeout = env, timeout
        self.argv = argv or [sys.executable, os.path.abspath(__file__), "--worker"]
        self.proc = None
        self.starts = 0

    def _start(self) -> None:
        self.proc = subprocess.Popen(self.argv, env=self.env,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                     text=True, bufsize=1)
        self.starts += 1
        line = self._readline(120.0)
        if not line or "ready" not in line:
            raise RuntimeError("a worker did not start")

    def _readline(self, timeout: float) -> str | None:
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        if not ready:
            return None
        return self.proc.stdout.readline()

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None

    def load(self, path: str, verify, graph_text: bool = False, run: bool = False) -> dict:
        if self.proc is None:
            self._start()
        t0 = time.perf_counter()
        try:
            self.proc.stdin.write(json.dumps({"path": path, "verify": verify, "graph_text": graph_text, "run": run}) + "\n")
            self.proc.stdin.flush()
        except BrokenPipeError:
            pass
        line = self._readline(self.timeout)
        if line is None:
            self.stop()
            return {"outcome": "hang", "seconds": time.perf_counter() - t0}
        if not line:
            rc = self.proc.wait()
            self.proc = None
            return {"outcome": "crash", "returncode": rc, "seconds": time.perf_counter() - t0}
        return json.loads(line)


def _versions() -> dict:
    import torch

    import ostinato
    return {"ostinato": getattr(ostinato, "__version__", "?"), "torch": torch.__version__,
            "python": platform.python_version(), "machine": f"{platform.machine()}, {os.cpu_count()} cores, "
                                                            f"{platform.system()} {platform.release()}"}


def run(files: int, seed: int, timeout: float, workers: int, out_path: str | None, run_loaded: bool = False) -> dict:
    from bench import ost_mutations as mut
    import ostinato

    work = tempfile.mkdtemp(prefix="ost-faults-")
    env = dict(os.environ, OSTINATO_CACHE_DIR=os.path.join(work, "cache"),
               PYTHONPATH=os.pathsep.join([ROOT, os.path.join(ROOT, "src"), os.path.join(ROOT, "tests")]))
    env.pop("OSTINATO_REDIS_URL", None)
    if run_loaded:
        env["OST_FAULTS_MEMORY_LIMIT"] = str(4 << 30)
    os.environ["OSTINATO_CACHE_DIR"] = env["OSTINATO_CACHE_DIR"]
    paths, bases = mut.base_files(work)
    good_text = [str(ostinato.load(p, verify=True).graph) for p in paths]
    rng = random.Random(seed)
    cases = [mut.random_case(rng, len(bases)) for _ in range(files)]

    counts = {str(m): collections.Counter() for m in MODES}
    ran = {str(m): collections.Counter() for m in MODES}
    by_kind = {k: {str(m): collections.Counter() for m in MODES} for k in mut.KINDS}
    examples = collections.defaultdict(list)
    errors = collections.Counter()
    slowest = [0.0]
    lock = threading.Lock()
    todo: queue.Queue = queue.Queue()
    for i, case in enumerate(cases):
        todo.put(i)
    pool = [Worker(env, timeout) for _ in range(workers)]

    def serve(w: Worker) -> None:
        while True:
            try:
                i = todo.get_nowait()
            except queue.Empty:
                return
            case = cases[i]
            path = os.path.join(work, f"case{i}.ost")
            with open(path, "wb") as f:
                f.write(mut.apply(case, bases))
            for mode in MODES:
                res = w.load(path, mode, run=run_loaded)
                o = res["outcome"]
                if o in ("crash", "hang") and run_loaded:
                    # Was it the load or the run? Load alone in the fresh worker.
                    again = w.load(path, mode)
                    if again["outcome"] not in ("crash", "hang"):
                        res = {**again, "run": {"outcome": o, "seconds": res["seconds"]}}
                        o = again["outcome"]
                with lock:
                    if "run" in res:
                        r = res["run"]["outcome"]
                        ran[str(mode)][r] += 1
                        kind = f"run {r}, verify={mode}"
                        if r in ("other_error", "crash", "hang") and len(examples[kind]) < 10:
                            examples[kind].append({"case": case, **res["run"]})
                    counts[str(mode)][o] += 1
                    by_kind[case["kind"]][str(mode)][o] += 1
                    slowest[0] = max(slowest[0], res.get("seconds", 0.0))
                    if o == "format_error":
                        errors[res["error"]] += 1
                    kind = f"load {o}, verify={mode}"
                    if o in ("other_error", "crash", "hang") and len(examples[kind]) < 10:
                        examples[kind].append({"case": case, **{k: v for k, v in res.items() if k != "run"}})
            os.unlink(path)

    t0 = time.perf_counter()
    threads = [threading.Thread(target=serve, args=(w,)) for w in pool]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    seconds = time.perf_counter() - t0
    starts = sum(w.starts for w in pool)
    for w in pool:
        w.stop()

    # The good files, loaded after every damaged one by a fresh worker sharing their cache.
    fresh = Worker(env, timeout)
    after = [fresh.load(p, "checksums", graph_text=True) for p in paths]
    fresh.stop()
    good_after = sum(1 for r, text in zip(after, good_text) if r.get("graph") == text)
    shutil.rmtree(work, ignore_errors=True)

    result = {
        "command": f"bench/reliability.py --files {files} --seed {seed} --timeout {timeout} --workers {workers}"
                   + (" --run" if run_loaded else ""),
        "files": files, "loads": files * len(MODES), "seconds": round(seconds, 1),
        "worker_starts": starts, "slowest_load_s": round(slowest[0], 3),
        "by_verify": {m: {o: c[o] for o in OUTCOMES} for m, c in counts.items()},
        "by_mutation": {k: {m: {o: c[o] for o in OUTCOMES} for m, c in v.items()} for k, v in by_kind.items()},
        "format_errors_by_type": dict(errors.most_common()),
        "run_after_load": {m: {o: c[o] for o in RUN_OUTCOMES} for m, c in ran.items()} if run_loaded else None,
        "good_files_intact_after": f"{good_after}/{len(paths)}",
        "examples": dict(examples), **_versions(),
    }
    if out_path:
        os.makedirs(os.path.dirname(os.path.abspath(out_path)), exist_ok=True)
        with open(out_path, "w") as f:
            json.dump(result, f, indent=1, default=str)
            f.write("\n")
    return result


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--files", type=int, default=10000, help="damaged files (each loaded in every verify mode)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--timeout", type=float, default=10.0, help="seconds a load may take before it is a hang")
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--out", help="write the figures as JSON here")
    ap.add_argument("--run", action="store_true", help="also compile each loaded program for the CPU and call "
                                                       "it once on random inputs (outcomes counted apart)")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    import warnings
    warnings.filterwarnings("ignore", category=FutureWarning)
    if args.worker:
        worker_main()
        return 0
    res = run(args.files, args.seed, args.timeout, args.workers, args.out, args.run)
    print(json.dumps({k: res[k] for k in ("files", "loads", "seconds", "worker_starts", "slowest_load_s",
                                          "by_verify", "run_after_load", "good_files_intact_after")}, indent=1, default=str))
    bad = sum(res["by_verify"][m][o] for m in res["by_verify"] for o in ("crash", "hang")) + \
        sum(res["by_verify"][m]["other_error"] for m in ("True", "checksums"))
    return 1 if bad or res["good_files_intact_after"].split("/")[0] != res["good_files_intact_after"].split("/")[1] \
        else 0


if __name__ == "__main__":
    sys.exit(main())
