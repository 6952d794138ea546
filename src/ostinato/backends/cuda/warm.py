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

``start(graph, device)`` starts the thread when ``compile`` begins (once per process, device, dtype and
kind of library op) and returns it; ``compile`` joins it before it returns (in a ``finally``), so the
set-up overlaps the plan's decoding and building and nothing of it outlives ``compile``: no capture, ours
or a user's ``torch.cuda.graph`` right after ``compile``, can meet it. The thread works on the device's
default stream (cuBLAS keeps one workspace per stream: a stream of its own would leave a second one
allocated for good). ``OSTINATO_WARM_LIBRARIES=0`` turns it off.

The thread warms the GEMMs first, then attention, then convolutions, each in the dtypes the program's
nodes of that kind use. Constant folding runs some library ops during ``compile`` (RoPE's fp32 ``bmm``
of a decoder). It waits for that kind's warm-up first (``Warming.ready``) rather than racing it. On an
H200 (torch 2.11, a 64-layer hidden-128 Llama), the main thread's racing ``bmm`` took 0.21 s of a 0.29 s
warm compile. The thread's own first linear takes about 0.1 s.
"""
from __future__ import annotations

import logging
import os
import threading

import torch

log = logging.getLogger("ostinato")

GEMM_OPS = frozenset({"aten.linear", "aten.mm", "aten.addmm", "aten.bmm", "aten.baddbmm", "aten.matmul",
                      "ost.multi_linear", "ost.linear"})
ATTENTION_OPS = frozenset({"ost.sdpa", "aten.scaled_dot_product_attention", "ost.softcap_attention"})
CONV_OPS = frozenset({"aten.convolution", "aten.conv1d", "aten.conv2d", "aten.conv3d", "ost.conv_act"})
_KINDS = (("gemm", GEMM_OPS), ("attention", ATTENTION_OPS), ("conv", CONV_OPS))
_DTYPES = (torch.float16, torch.bfloat16, torch.float32)

_started: set[tuple] = set()
_lock = threading.Lock()


def enabled() -> bool:
    return os.environ.get("OSTINATO_WARM_LIBRARIES", "1") != "0"


def _torch_attention(node) -> bool:
    """Whether an attention node runs torch's SDPA (cuDNN, flash): not one query row, which the decode
    kernels (Triton) take."""
    q = node.args[0] if node.args else None
    shape = getattr(getattr(q, "meta", None), "shape", None)
    return node.op != "ost.sdpa" or shape is None or len(shape) < 2 or shape[-2] != 1


def _dtype(node):
    """The dtype a library node computes in: its first tensor input's."""
    for v in node.inputs:
        dt = getattr(getattr(v, "meta", None), "dtype", None)
        if dt in _DTYPES:
            return dt
    return None


def jobs_for(graph, device_index: int) -> list[tuple[str, torch.dtype]]:
    """(kind, dtype) of each library call a program makes that this process has not warmed yet on that
    device: GEMMs first, then attention, then convolutions; within a kind, dtypes in the order the
    program's nodes first use them."""
    jobs: list[tuple[str, torch.dtype]] = []
    for kind, members in _KINDS:
        for n in graph.nodes:
            if n.op in members and (kind != "attention" or _torch_attention(n)):
                job = (kind, _dtype(n))
                if job[1] is not None and job not in jobs and (device_index, *job) not in _started:
                    jobs.append(job)
    return jobs


def _warm(kind: str, dt: torch.dtype, device: torch.device) -> None:
    if kind == "gemm":
        torch.nn.functional.linear(torch.zeros(8, 64, device=device, dtype=dt),
                                   torch.zeros(64, 64, device=device, dtype=dt))
    elif kind == "attention":
        q = torch.zeros(1, 2, 8, 64, device=device, dtype=dt)
        torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True)
    else:
        torch.nn.functional.conv2d(torch.zeros(1, 8, 8, 8, device=device, dtype=dt),
                                   torch.zeros(8, 8, 3, 3, device=device, dtype=dt), padding=1)


class Warming(threading.Thread):
    """The warm-up thread of one ``compile``: ``ready(op)`` returns once the library kind ``op`` calls is
    warmed (or failed to warm, or at once for an op of no kind or a kind not in ``jobs``)."""

    WAIT_S = 10.0       # a warm-up that hangs delays a folded library op this long at most

    def __init__(self, jobs: list[tuple[str, torch.dtype]], device: torch.device):
        super().__init__(name="ostinato-warm-libraries", daemon=True)
        self.jobs, self.device = jobs, device
        self._done = {kind: threading.Event() for kind, _ in jobs}

    def run(self) -> None:
        try:
            with torch.cuda.device(self.device), torch.no_grad():
                for i, (kind, dt) in enumerate(self.jobs):
                    _warm(kind, dt, self.device)
                    if all(k != kind for k, _ in self.jobs[i + 1:]):
                        torch.cuda.current_stream(self.device).synchronize()
                        self._done[kind].set()
        except Exception as e:  # noqa: BLE001 - warming is an optimization: the first call pays instead
            log.debug("ostinato: warming CUDA libraries failed: %s: %s", type(e).__name__, e)
        finally:
            for event in self._done.values():
                event.set()

    def ready(self, op: str) -> None:
        for kind, members in _KINDS:
            if op in members and kind in self._done:
                self._done[kind].wait(self.WAIT_S)


def start(graph, device: torch.device) -> Warming | None:
    """The thread warming the libraries ``graph`` will call on ``device`` (see the module), started; None
    when there is nothing left to warm. The caller joins it."""
    if not enabled():
        return None
    index = device.index if device.index is not None else torch.cuda.current_device()
    with _lock:
        jobs = jobs_for(graph, index)
        if not jobs:
            return None
        _started.update((index, kind, dt) for kind, dt in jobs)
        thread = Warming(jobs, torch.device("cuda", index))
        thread.start()
    return thread
