"""Launching generated fusion kernels (ostinato.codegen): ``run_fused(spec, *inputs)`` is what an
``ost.fused`` Launch calls on CUDA.

Per input shapes and strides (memoized) the launcher works out the iteration space, collapses the dims
every operand walks contiguously, picks the kernel variant (ranks, a row held whole or walked in
chunks, 32- or 64-bit indices) and its block sizes, and keeps the integer arguments; a call then only
allocates the outputs and launches. Variants are rendered on first use and compiled through the same
KernelLibrary and cache tiers as the hand-written kernels: a warm process launches cached cubins
without importing Triton.
"""
from __future__ import annotations

import math
import os
import threading

import torch

from ....codegen.prims import DTYPES
from ....codegen.reference import base_shape, evaluate, iteration_shape, parse, split_dims
from ....codegen.spec import GroupSpec
from ....codegen.triton_source import render
from ...cuda.binaries import register_source
from ..runtime import KernelLibrary
from .common import cdiv

MAX_PERSISTENT_ROW = 4096   # rows up to this many elements are held in registers
_LOOP_RBLOCK = 4096        # long rows: few, wide iterations (each pass over a row is a chain of dependent loads)
_TARGET_PROGRAMS = 512      # a looped row kernel splits its output pass until about this many programs run


def _pow2(n: int) -> int:
    return 1 << (max(int(n), 1) - 1).bit_length()


def _collapse(sizes: list[int], strides: list[list[int]]) -> tuple[list[int], list[list[int]]]:
    """Drop size-1 dims and merge neighbours every operand walks contiguously (row-major order)."""
    keep = [d for d, s in enumerate(sizes) if s != 1]
    sizes = [sizes[d] for d in keep]
    strides = [[st[d] for d in keep] for st in strides]
    out_sizes: list[int] = []
    out_strides: list[list[int]] = [[] for _ in strides]
    for d, size in enumerate(sizes):
        if out_sizes and all(st[d - 1] == st[d] * size for st in strides):
            out_sizes[-1] *= size
            for o, st in zip(out_strides, strides):
                o[-1] = st[d]
        else:
            out_sizes.append(size)
            for o, st in zip(out_strides, strides):
                o.append(st[d])
    if not out_sizes:
        return [1], [[0] for _ in strides]
    return out_sizes, out_strides


def _contiguous_strides(shape: tuple[int, ...]) -> list[int]:
    out, acc = [], 1
    for d in reversed(shape):
        out.append(acc if d != 1 else 0)
        acc *= d
    return out[::-1]


def _layout_of(tensors, shape: tuple) -> torch.memory_format:
    """The memory format x-level outputs take: channels-last when an input of the full 4-D shape is in it
    (as torch's pointwise ops keep their input's layout), else contiguous."""
    if len(shape) == 4:
        for t in tensors:
            if tuple(t.shape) == shape and not t.is_contiguous() and t.is_contiguous(memory_format=torch.channels_last):
                return torch.channels_last
    return torch.contiguous_format


def _strides_in(shape: tuple, fmt: torch.memory_format) -> list[int]:
    if fmt is torch.channels_last:
        n, c, h, w = shape
        st = [h * w * c, 1, w * c, c]
        return [0 if d == 1 else s for d, s in zip(shape, st)]
    return _contiguous_strides(shape)


class _LaunchPlan:
    __slots__ = ("kernel", "ints", "grid", "out_shapes", "empty", "formats")

    def __init__(self, kernel, ints, grid, out_shapes, empty, formats):
        self.kernel, self.ints, self.grid, self.out_shapes, self.empty = kernel, ints, grid, out_shapes, empty
        self.formats = formats


class FusedLauncher:
    """One fusion group's kernel variants and launch plans."""

    def __init__(self, spec_json: str):
        self.spec: GroupSpec = parse(spec_json)
        self.n_in = len(self.spec.inputs)
        self.out_dtypes = [DTYPES[o[1]] for o in self.spec.outputs]
        self._plans: dict[tuple, _LaunchPlan] = {}
        self._libraries: dict[tuple, KernelLibrary] = {}
        self._lock = threading.Lock()

    def library(self, xr: int, rr: int, loop: bool, i64: bool) -> tuple[KernelLibrary, str]:
        interpreted = os.environ.get("TRITON_INTERPRET") == "1"
        key = (xr, rr, loop, i64, interpreted)
        lib = self._libraries.get(key)
        if lib is None:
            source, name = render(self.spec, xr, rr, loop, i64, interpreted)
            module = f"gen_{name}"
            register_source(module, source)
            lib = self._libraries[key] = KernelLibrary(module, {"k": name})
        return lib, "k"

    def plan(self, tensors) -> _LaunchPlan:
        spec = self.spec
        shape = iteration_shape(spec, tensors)
        rank, red = spec.rank, spec.red
        row = tuple(1 if i in red else d for i, d in enumerate(shape))
        base = base_shape(spec, tensors) if spec.split else shape
        brank = len(base)
        strides: list[list[int]] = []
        for k, t in enumerate(tensors):
            unsq = spec.inputs[k][2]
            tshape = tuple(t.shape) + (1,) * unsq
            tstride = tuple(t.stride()) + (0,) * unsq
            pad = brank - len(tshape)
            st = [0 if d < pad or tshape[d - pad] == 1 else tstride[d - pad] for d in range(brank)]
            strides.append(list(split_dims(spec, base, tuple(st))[1]) if spec.split else st)
        out_shapes, formats = [], []
        fmt = _layout_of(tensors, base)
        for _, _, level, keepdim, *out_rank in spec.outputs:
            formats.append(fmt if level == "x" and not out_rank else torch.contiguous_format)
            if level == "x":
                # a lower-rank output (leading 1-dims dropped) holds the same elements in the same order
                out_shapes.append(base[len(base) - out_rank[0]:] if out_rank else base)
                st = _strides_in(base, formats[-1])
                strides.append(list(split_dims(spec, base, tuple(st))[1]) if spec.split else st)
            else:
                strides.append(_contiguous_strides(row))
                out_shapes.append(row if keepdim else tuple(d for i, d in enumerate(shape) if i not in red))
        outer = [d for d in range(rank) if d not in red]
        xs, xst = _collapse([shape[d] for d in outer], [[st[d] for d in outer] for st in strides])
        numel = math.prod(shape)
        if numel == 0:      # empty tensors: the torch reference gives what eager gives (sums of nothing)
            return _LaunchPlan(None, (), (0,), out_shapes, True, formats)
        if not red:
            rs, rst = [], [[] for _ in strides]
        else:
            rs, rst = _collapse([shape[d] for d in red], [[st[d] for d in red] for st in strides])
        xnumel, rnumel = math.prod(xs), math.prod(rs)
        biggest = max([numel] + [sum((sz - 1) * abs(s) for sz, s in zip(xs + rs, a + b)) + 1
                                 for a, b in zip(xst, rst)])
        i64 = biggest >= 2**31 - 2**20
        ints = [xnumel] + ([rnumel] if red else []) + xs[1:] + rs[1:]
        for a, b in zip(xst, rst):
            ints += a + b
        chunks = 1
        if red:
            loop = _pow2(rnumel) > MAX_PERSISTENT_ROW
            rblock = _LOOP_RBLOCK if loop else _pow2(rnumel)
            xblock = 1 if loop else min(_pow2(xnumel), max(1, 2048 // rblock))
            warps = 8 if rblock * xblock >= 2048 else 4
            lib, name = self.library(len(xs), len(rs), loop, i64)
            kernel = lib.kernel(name, XBLOCK=xblock, RBLOCK=rblock, num_warps=warps)
            if loop:
                # split the output pass only where there is one (a reduction-only group's chunks would
                # each read the whole row and store nothing)
                has_x_out = any(o[2] == "x" for o in spec.outputs)
                chunks = max(1, min(cdiv(rnumel, rblock), cdiv(_TARGET_PROGRAMS, xnumel))) if has_x_out else 1
                rchunk = cdiv(cdiv(rnumel, chunks), rblock) * rblock
                chunks = cdiv(rnumel, rchunk)
                ints.append(rchunk)
        else:
            xblock = min(1024, max(128, _pow2(xnumel)))
            lib, name = self.library(len(xs), 0, False, i64)
            kernel = lib.kernel(name, XBLOCK=xblock, num_warps=4)
        grid = (cdiv(xnumel, xblock),) if chunks == 1 else (cdiv(xnumel, xblock), chunks)
        return _LaunchPlan(kernel, tuple(ints), grid, out_shapes, False, formats)

    def __call__(self, *args) -> tuple[torch.Tensor, ...]:
        tensors = args[:self.n_in]
        key = tuple((t.shape, t.stride()) for t in tensors)
        plan = self._plans.get(key)
        if plan is None:
            with self._lock:
                plan = self._plans[key] = self.plan(tensors)
        if plan.empty:
            return tuple(evaluate(self.spec, tensors, args[self.n_in:]))
        device = tensors[0].device
        outs = tuple(torch.empty(s, dtype=dt, device=device, memory_format=f)
                     for s, dt, f in zip(plan.out_shapes, self.out_dtypes, plan.formats))
        plan.kernel(*tensors, *outs, *args[self.n_in:], *plan.ints, grid=plan.grid)
        return outs


_LAUNCHERS: dict[str, FusedLauncher] = {}


def launcher(spec_json: str) -> FusedLauncher:
    f = _LAUNCHERS.get(spec_json)
    if f is None:
        f = _LAUNCHERS.setdefault(spec_json, FusedLauncher(spec_json))
    return f


def run_fused(spec_json: str, *args) -> tuple[torch.Tensor, ...]:
    """ost.fused on CUDA: the group's generated kernel."""
    return launcher(spec_json)(*args)


run_fused.multi_output = True
