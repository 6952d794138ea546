"""Split-K for lone one-row projections (``LinearLauncher`` in fused.py): the tiles ``lone_tiles`` picks, and
the partials and arrival counters each split launch takes (``split_scratch``), made per stream outside a
capture and reserved before ostinato's CUDA graph capture (``recording_scratch``, ``reserve_scratch``,
``owned_scratch``: replay/cuda_graph.py)."""
from __future__ import annotations

import collections
import contextlib
import os
import threading

import torch

from ....codegen.prims import REDUCTIONS
from ....codegen.spec import LinearSpec
from ....codegen.triton_linear import can_split_k
from .common import cdiv, pow2 as _pow2


def split_k_enabled() -> bool:
    """OSTINATO_SPLIT_K=0 keeps every one-row matmul group one program per column block walking all of K,
    and its tiles as linear_blocks gives them (the A/B switch of ``lone_tiles``)."""
    return os.environ.get("OSTINATO_SPLIT_K", "1") != "0"


_SPLIT_K_PROGRAMS = 1024    # split K until about this many programs run (several per SM)
_SPLIT_K_MIN = 2048         # elements of K each split walks, at least
_SPLIT_K_RBLOCK = 256
# where the probe measured each choice (the smallest weight split, the columns of the narrow tiles); other
# shapes keep linear_blocks' tiles (Qwen2.5-0.5B's decode, [896 -> 896] and [4864 -> 896], was 2% slower
# with both, not measured apart)
_SPLIT_K_MIN_WEIGHTS = 16 << 20
_NARROW_COLUMNS = (2048, 4096)


def lone_tiles(spec: LinearSpec, m: int, n: int, k: int) -> tuple[int, int, int] | None:
    """(NBLOCK, RBLOCK, NSPLIT) of a one-row matmul group whose prologue reduces nothing and that has no
    epilogue (a lone projection: a Llama layer's o and down projections), else None (linear_blocks').
    From bench/splitk_probe.py on an H200 (bf16, 16 launches over 16 weights in one CUDA graph): a
    one-row [8192 -> 2048] GEMV took 20.5 us walking all of K in 256 programs of 8 columns, 14.2 us in
    512 programs of 4, and 12.2 us split four ways (1024 programs of 8 columns, K in steps of 256); at
    K=2048 no split won, and 4 columns per program beat 8 (5.2 against 6.7 us at [2048 -> 2048])."""
    if m != 1 or spec.wt or not can_split_k(spec) or not split_k_enabled() \
            or any(op[0] in REDUCTIONS for op in spec.pro.ops):
        return None
    blocks, nsplit = cdiv(n, 8), 1
    while (nsplit < 8 and blocks * nsplit < _SPLIT_K_PROGRAMS and k // (2 * nsplit) >= _SPLIT_K_MIN
           and n * k >= _SPLIT_K_MIN_WEIGHTS):
        nsplit *= 2
    if nsplit > 1:
        return 8, _SPLIT_K_RBLOCK, nsplit
    if _NARROW_COLUMNS[0] <= n <= _NARROW_COLUMNS[1]:
        return 4, max(16, min(512, _pow2(k))), 1
    return None


_CAPTURE = threading.local()


@contextlib.contextmanager
def recording_scratch():
    """Around the warm-up before ostinato's capture: the split-K scratch each launch takes, in launch
    order (a list of (partials shape, counter count)), so the capture can be handed pairs made before it
    began (``reserve_scratch``)."""
    outer = getattr(_CAPTURE, "recording", None)
    shapes: list = []
    _CAPTURE.recording = shapes
    try:
        yield shapes
    finally:
        _CAPTURE.recording = outer


def reserve_scratch(shapes: list, device: torch.device) -> collections.deque:
    """Split-K pairs for a capture, made outside it (so not from the graph's pool): fp32 partials and
    zeroed counters, one per launch the warm-up recorded, in that order."""
    return collections.deque((torch.empty(ws, dtype=torch.float32, device=device),
                              torch.zeros(blocks, dtype=torch.int32, device=device)) for ws, blocks in shapes)


@contextlib.contextmanager
def owned_scratch(reserve: collections.deque | None = None):
    """Around a CUDA graph's capture: the split-K scratch its launches take (a list of (partials,
    counters) pairs, filled during the capture from ``reserve``, in order). The caller keeps the list as
    long as the graph and zeroes the counters after the capture, before the graph's first replay
    (``zero_counters``)."""
    outer = getattr(_CAPTURE, "held", None), getattr(_CAPTURE, "reserve", None)
    held: list = []
    _CAPTURE.held, _CAPTURE.reserve = held, reserve if reserve is not None else collections.deque()
    try:
        yield held
    finally:
        _CAPTURE.held, _CAPTURE.reserve = outer


def zero_counters(held: list) -> None:
    """Zero the counters of a capture's split-K scratch (outside the capture: once, not per replay)."""
    for _, cnt in held:
        cnt.zero_()


def split_scratch(plan, device: torch.device, capturing: bool) -> list:
    """A split-K launch's partials ([plan.nsplit, plan.ws_cols]) and arrival counters (one a column block),
    then its K slice: the launch's tail of arguments (``scratch_pair``)."""
    return [*scratch_pair((plan.nsplit, plan.ws_cols), plan.grid[0], plan.scratch, device, capturing), plan.kslice]


def scratch_pair(ws_shape: tuple, blocks: int, cache: dict, device: torch.device,
                 capturing: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """A split launch's fp32 partials (``ws_shape``) and ``blocks`` arrival counters (zero before a launch;
    the last program of each column block sets its own back to zero). Outside a capture: one pair per
    (device, stream), kept in ``cache`` and shared by every launch given that cache there (each layer's),
    which run one after another. Inside ostinato's CUDA graph capture a pair of the launch's own, kept by the graph
    (``owned_scratch``), so a graph never shares counters with another graph or stream (two graphs
    replayed at once on two streams would interleave their counts); in a capture not made by
    ostinato, a pair from the capture's pool whose counters a captured memset zeroes.

    A held pair is never taken from the graph's pool: a block of the pool may have held a temporary
    that an earlier node of the same graph writes on every replay (blocks freed inside a capture are
    reused by later allocations there), which would overwrite the counters' zeros between replays.
    Nor can it be allocated elsewhere during the capture (a new segment's cudaMalloc is refused while
    a stream captures). So the warm-up before the capture records each launch's pair shapes
    (``recording_scratch``), the pairs are made before the capture begins (``reserve_scratch``), and
    each launch in the capture takes the next; a launch the warm-up did not foresee falls back to a
    pair zeroed by a captured memset."""

    def new_pair(zeroed: bool) -> tuple[torch.Tensor, torch.Tensor]:
        counters = torch.zeros if zeroed else torch.empty
        return (torch.empty(ws_shape, dtype=torch.float32, device=device),
                counters(blocks, dtype=torch.int32, device=device))
    if capturing:
        held, reserve = getattr(_CAPTURE, "held", None), getattr(_CAPTURE, "reserve", None)
        if held is not None and reserve and tuple(reserve[0][0].shape) == tuple(ws_shape) \
                and reserve[0][1].numel() == blocks:
            pair = reserve.popleft()
            held.append(pair)
            return pair
        return new_pair(zeroed=True)
    recording = getattr(_CAPTURE, "recording", None)
    if recording is not None:
        recording.append((ws_shape, blocks))
    key = (device, torch.cuda.current_stream(device).cuda_stream if device.type == "cuda" else 0)
    pair = cache.get(key)
    if pair is None:
        pair = cache[key] = new_pair(zeroed=True)
    return pair
