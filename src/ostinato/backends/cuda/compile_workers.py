"""Cold kernel compiles in parallel worker processes.

A missing binary is a request to a pool of worker processes (``triton_compile.py`` run as a script:
Triton only, no torch), answered with its cubin; several compile at once, one per worker, while the
process goes on (binaries.py puts each result in the cache tiers as it arrives; runtime.py runs the op's
torch reference until then). Workers start on the first request (up to ``OSTINATO_COMPILE_WORKERS``,
default: the cores less one, at most 8; ``0`` compiles in-process, one kernel at a time, as before) and
leave after 30 s without work. At exit the process waits for the compiles in flight (at most 10
minutes), so their cubins reach the cache for the next process.
"""
from __future__ import annotations

import atexit
import json
import logging
import os
import queue
import subprocess
import sys
import threading
from concurrent import futures
from concurrent.futures import Future
from typing import Any

log = logging.getLogger("ostinato")

_SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "triton_compile.py")
_IDLE_S = 30.0
EXIT_WAIT_S = 600.0     # at exit, wait at most this long for compiles in flight (a hung worker never blocks exit)


class WorkerDied(Exception):
    """A worker process ended without answering (killed, out of memory): the compile runs in-process."""


def worker_count() -> int:
    """How many compile workers may run (0: compile in-process)."""
    raw = os.environ.get("OSTINATO_COMPILE_WORKERS", "").strip()
    if raw:
        try:
            return max(0, int(raw))
        except ValueError:
            log.warning("ostinato: OSTINATO_COMPILE_WORKERS=%r is not a number; using the default", raw)
    return max(1, min(8, (os.cpu_count() or 2) - 1))


class _Worker:
    """One worker process, driven by one thread of the pool."""

    def __init__(self):
        flags = ["-P"] if sys.version_info >= (3, 11) else []   # no script folder on sys.path (ops.py, …)
        try:
            self.proc = subprocess.Popen([sys.executable, *flags, _SCRIPT], stdin=subprocess.PIPE,
                                         stdout=subprocess.PIPE, stderr=None, close_fds=True)
        except OSError as e:    # no interpreter to start (an embedded Python): compile in-process
            raise WorkerDied(f"no compile worker could start ({sys.executable}): {e}") from e

    def ask(self, request: dict[str, Any]) -> tuple[dict[str, Any], bytes]:
        try:
            self.proc.stdin.write(json.dumps(request).encode() + b"\n")
            self.proc.stdin.flush()
            line = self.proc.stdout.readline()
            if not line:
                raise WorkerDied(f"compile worker {self.proc.pid} ended (exit {self.proc.poll()})")
            head = json.loads(line)
            cubin = self.proc.stdout.read(head["nbytes"]) if head["nbytes"] else b""
            if len(cubin) != head["nbytes"]:
                raise WorkerDied(f"compile worker {self.proc.pid} ended mid-answer")
            return head, cubin
        except (OSError, ValueError) as e:
            raise WorkerDied(f"compile worker {self.proc.pid}: {type(e).__name__}: {e}") from e

    def close(self) -> None:
        try:
            self.proc.stdin.close()
            self.proc.wait(timeout=5)
        except Exception:  # noqa: BLE001 - a worker that does not leave is killed
            self.proc.kill()


class Pool:
    """Requests in a queue, served by up to ``size`` threads, each owning one worker process."""

    def __init__(self, size: int):
        self.size = size
        self._queue: queue.Queue = queue.Queue()
        self._threads: list[threading.Thread] = []
        self._idle = 0      # threads free to take a request
        self._lock = threading.Lock()
        self._in_flight: set[Future] = set()

    def submit(self, request: dict[str, Any]) -> Future:
        """A Future of (answer's head, cubin); the head holds ``ok`` and ``meta`` or ``error``."""
        fut: Future = Future()
        fut.add_done_callback(self._done)
        with self._lock:
            self._in_flight.add(fut)
            if len(self._threads) < self.size and self._queue.qsize() + 1 > self._idle:   # nobody free
                t = threading.Thread(target=self._serve, name=f"ostinato-compile-{len(self._threads)}",
                                     daemon=True)
                self._threads.append(t)
                self._idle += 1
                t.start()
            self._queue.put((request, fut))
        return fut

    def _done(self, fut: Future) -> None:
        with self._lock:
            self._in_flight.discard(fut)

    def _serve(self) -> None:
        me, worker = threading.current_thread(), None
        try:
            while True:
                try:
                    request, fut = self._queue.get(timeout=_IDLE_S)
                except queue.Empty:
                    with self._lock:
                        if self._queue.qsize() == 0:    # decided under the lock submit holds: no request lost
                            self._idle -= 1
                            self._threads.remove(me)
                            return
                    continue
                with self._lock:
                    self._idle -= 1
                if fut.set_running_or_notify_cancel():
                    try:
                        if worker is None:
                            worker = _Worker()
                        fut.set_result(worker.ask(request))
                    except BaseException as e:  # noqa: BLE001 - the Future carries it to whoever waits
                        if worker is not None:
                            worker.close()
                            worker = None
                        fut.set_exception(e)
                with self._lock:
                    self._idle += 1
        finally:
            if worker is not None:
                worker.close()

    def wait(self, timeout: float | None = None) -> int:
        """Wait for every request in flight (at most ``timeout`` seconds in all); how many were."""
        with self._lock:
            pending = list(self._in_flight)
        futures.wait(pending, timeout=timeout)
        return len(pending)


_POOL: Pool | None = None
_POOL_LOCK = threading.Lock()


def pool() -> Pool | None:
    """The process's worker pool, or None where compiles run in-process."""
    global _POOL
    size = worker_count()
    if size == 0:
        return None
    with _POOL_LOCK:
        if _POOL is None or _POOL.size != size:
            _POOL = Pool(size)
            atexit.register(_POOL.wait, EXIT_WAIT_S)
        return _POOL


def wait_for_compiles(timeout: float | None = None) -> int:
    """Block until the kernels compiling in workers are done (and cached); how many were in flight."""
    return _POOL.wait(timeout) if _POOL is not None else 0


def in_flight() -> int:
    """Compiles requested and not yet answered."""
    if _POOL is None:
        return 0
    with _POOL._lock:
        return len(_POOL._in_flight)
