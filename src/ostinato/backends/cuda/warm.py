"""Warming torch's CUDA libraries (cuBLAS, cuDNN) in a background thread while a warm start loads and
compiles.

A fresh process pays for its first cuBLAS call (handles, the matmul kernels' lazy load) and its first
attention and convolution (cuDNN's handle and graphs) inside the first call of the model. Measured with
``bench/library_init_probe.py`` on an H100 (torch 2.11): the first bf16 linear took 70-148 ms and the
first causal SDPA 62-850 ms; with a thread that ran a tiny linear and SDPA while the main thread spent
0.2-0.3 s on Python work, 2.5-7 ms and 44-102 ms (an SDPA of another shape still builds its own cuDNN
graph). torch's bindings release the GIL inside those calls, so the compile's Python work goes on
meanwhile, and a handle made by a thread returns to torch's pool when the thread ends, where the main
thread finds it.

``start(graph, device)`` starts the thread when ``compile`` begins, before it imports the backend's
modules (once per process, device, dtype and kind of library op), and returns it; ``load`` starts it
earlier still (``start_early``), once the graph is decoded and before the weights are hashed, where the
process has CUDA set up already. ``compile`` joins every such thread of its device before it returns
(in a ``finally``), so the set-up overlaps the load's hash and the plan's decoding and building and
nothing of it outlives ``compile`` (a load's thread with no compile after it: ``start_early``): no
capture, ours or a user's ``torch.cuda.graph`` right after ``compile``, can meet it. The thread works
on the device's
default stream (cuBLAS keeps one workspace per stream: a stream of its own would leave a second one
allocated for good).

**Off by default since 2026-11-27** (``OSTINATO_WARM_LIBRARIES=1`` turns it on). Measured on lent H200s
with ``bench/warm_profile.py --variant`` (the suite's nine start-up representatives, warm processes
interleaved, two or three of each variant, in three calls: docs/benchmarks/warm_start_gpu_1127b/): with
the warm-up off, the warm first output (load + compile + first call) was shorter on average for eight of
the nine. Llama-3.2-1B took 0.26-0.30 s against 0.47-0.59 s: its decode step calls no cuBLAS (generated
GEMVs) yet waited for the thread's cuBLAS set-up. BERT, DiT, Mamba, Whisper and the two small decoders
gained 0.05-0.12 s on average. The thread slowed the weights' upload (Mamba's ``place_constants`` took
0.20-0.21 s with it, 0.03-0.04 s without), and its tiny calls did not spare the first call the set-up of
the shapes it runs. ResNet-50 alone lost without it (its convolutions' cuDNN set-up: 0.55 s on average
against 0.50). ``OSTINATO_WARM_KINDS`` limits the kinds warmed. Neither warming only some kinds nor
starting the thread once the weights were placed (a switch measured then and removed since) beat no
warm-up in those runs.
"""
from __future__ import annotations

import atexit
import logging
import os
import threading

import torch

from .kernels.common import SHORT_QUERIES

log = logging.getLogger("ostinato")

GEMM_OPS = frozenset({"aten.linear", "aten.mm", "aten.addmm", "aten.bmm", "aten.baddbmm", "aten.matmul",
                      "ost.multi_linear", "ost.linear"})
ATTENTION_OPS = frozenset({"ost.sdpa", "aten.scaled_dot_product_attention", "ost.softcap_attention"})
CONV_OPS = frozenset({"aten.convolution", "aten.conv1d", "aten.conv2d", "aten.conv3d", "ost.conv_act"})
_KINDS = (("gemm", GEMM_OPS), ("attention", ATTENTION_OPS), ("conv", CONV_OPS))
_DTYPES = (torch.float16, torch.bfloat16, torch.float32)

_started: set[tuple] = set()
_lock = threading.Lock()

# The kinds of library warmed (OSTINATO_WARM_KINDS, comma-separated, of gemm, attention, conv).
KINDS = tuple(os.environ.get("OSTINATO_WARM_KINDS", "gemm,attention,conv").split(","))


def enabled() -> bool:
    """Off unless OSTINATO_WARM_LIBRARIES=1 (the module's note says why)."""
    return os.environ.get("OSTINATO_WARM_LIBRARIES", "0") == "1"


def _torch_attention(node) -> bool:
    """Whether an attention node runs torch's SDPA (cuDNN, flash): not up to SHORT_QUERIES query rows (a
    decode step, a short prompt), which the Triton attention kernel takes."""
    q = node.args[0] if node.args else None
    shape = getattr(getattr(q, "meta", None), "shape", None)
    rows = shape[-2] if shape is not None and len(shape) >= 2 else None
    return node.op != "ost.sdpa" or not isinstance(rows, int) or rows > SHORT_QUERIES


def jobs_for(graph, device_index: int) -> list[tuple[str, torch.dtype]]:
    """(kind, dtype) of each library a program will call first that this process has not warmed yet on
    that device: the kinds of library op among its nodes, for each float dtype of its constants."""
    ops = {n.op for n in graph.nodes if n.op not in ATTENTION_OPS or _torch_attention(n)}
    dtypes = sorted({v.meta.dtype for v in graph.constants if getattr(v.meta, "dtype", None) in _DTYPES},
                    key=str)
    return [(kind, dt) for dt in dtypes for kind, members in _KINDS
            if kind in KINDS and ops & members and (device_index, kind, dt) not in _started]


def _run(jobs: list[tuple[str, torch.dtype]], device: torch.device) -> None:
    try:
        with torch.cuda.device(device), torch.no_grad():
            for kind, dt in jobs:
                if kind == "gemm":
                    torch.nn.functional.linear(torch.zeros(8, 64, device=device, dtype=dt),
                                               torch.zeros(64, 64, device=device, dtype=dt))
                elif kind == "attention":
                    q = torch.zeros(1, 2, 8, 64, device=device, dtype=dt)
                    torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True)
                else:
                    torch.nn.functional.conv2d(torch.zeros(1, 8, 8, 8, device=device, dtype=dt),
                                               torch.zeros(8, 8, 3, 3, device=device, dtype=dt), padding=1)
            torch.cuda.current_stream(device).synchronize()
    except Exception as e:  # noqa: BLE001 - warming is an optimization: the first call pays instead
        log.debug("ostinato: warming CUDA libraries failed: %s: %s", type(e).__name__, e)


class _InFlight:
    """The warm-up threads started for one device and not yet joined, joined together."""

    def __init__(self, threads: list[threading.Thread]):
        self.threads = threads

    def join(self) -> None:
        for t in self.threads:
            t.join()


_in_flight: dict[int, list[threading.Thread]] = {}


def start(graph, device: torch.device) -> _InFlight | None:
    """The warm-up of the libraries ``graph`` will call on ``device`` (see the module), started, with any
    started earlier for that device still running (``start_early``: a load's); None when nothing runs.
    The caller joins it."""
    if not enabled():
        return None
    index = device.index if device.index is not None else torch.cuda.current_device()
    with _lock:
        running = [t for t in _in_flight.get(index, []) if t.is_alive()]
        jobs = jobs_for(graph, index)
        if jobs:
            _started.update((index, kind, dt) for kind, dt in jobs)
            thread = threading.Thread(target=_run, args=(jobs, torch.device("cuda", index)),
                                      name="ostinato-warm-libraries", daemon=True)
            thread.start()
            running.append(thread)
        _in_flight[index] = running
    return _InFlight(running) if running else None


def start_early(graph) -> None:
    """``start`` from ``load`` (reader.DECODED_HOOKS), for the current device, when this process has
    set CUDA up already (a process that has not may never use it: no context is made for it here), so the
    warm-up overlaps the load's own work (the weights' hash) as well as the compile's; ``compile`` on that
    device joins it. When no such compile follows (a program loaded and not compiled, or compiled for
    another device, or a load that failed after the hook), the thread ends by itself within a few tenths
    of a second; ostinato's own captures join it first (``join_all``), and so does the interpreter's
    exit. A CUDA graph a user captures right after a load, with no compile between, could meet it: compile
    first, or leave the warm-up off (the default)."""
    if enabled() and torch.cuda.is_initialized():
        start(graph, torch.device("cuda", torch.cuda.current_device()))


def join_all() -> None:
    """Wait for every warm-up thread still running, on any device (before a capture; at exit)."""
    with _lock:
        threads = [t for ts in _in_flight.values() for t in ts]
    for t in threads:
        t.join()


atexit.register(join_all)
