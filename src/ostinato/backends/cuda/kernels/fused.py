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

from ....codegen.linear import MAX_DOT_ROWS, MAX_ROWS
from ....codegen.prims import DTYPES, HALF, REDUCTIONS, compute_code
from ....codegen.reference import (base_shape, epilogue_inputs, evaluate, evaluate_linear, iteration_shape, parse,
                                   split_dims, split_linear_args)
from ....codegen.spec import GroupSpec, LinearSpec, gathered_statistics
from ....codegen.triton_linear import render_linear
from ....codegen.triton_source import render, split_slots, split_stages
from ....ir.fused_ops import _packed_rows
from ...cuda.binaries import register_source
from ..runtime import KernelLibrary
from .common import cdiv, pow2 as _pow2
from .linear_tiles import (dot_blocks, dot_pipeline, dot_rows_block, dot_split, dot_stages,  # noqa: F401
                           linear_blocks, stationary, tile_blocks)
from .split_k import lone_tiles, split_scratch

MAX_PERSISTENT_ROW = 4096   # rows up to this many elements are held in registers
_LOOP_RBLOCK = 4096        # long rows: few, wide iterations (each pass over a row is a chain of dependent loads)
_TARGET_PROGRAMS = 512      # a looped row kernel splits its output pass until about this many programs run
_GATHERED_RBLOCK = 2048     # a looped row kernel whose statistics read a narrower gathered row (ost.row_scale)
_SPLIT_RBLOCK = 1024        # a split row's programs walk their part in chunks of this many elements


def column_rows_enabled() -> bool:
    """OSTINATO_COLUMN_ROWS=0 walks strided rows one program per row as any other (the A/B switch)."""
    return os.environ.get("OSTINATO_COLUMN_ROWS", "1") != "0"


_TARGET_COLUMN_PROGRAMS = 264   # two per SM of an H100
_COLUMN_XBLOCK_MIN, _COLUMN_XBLOCK_MAX = 8, 64


def _floor_pow2(n: int) -> int:
    return 1 << (max(int(n), 1).bit_length() - 1)


def _across_memory(xst: list[list[int]], rst: list[list[int]]) -> bool:
    """Whether the inputs' rows lie across memory: an input's innermost reduced dim strided and its
    innermost kept dim dense (NHWC pooled over H and W: one program per row would read one element
    per sector), and no more inputs with dense rows than such inputs."""
    if not column_rows_enabled():
        return False
    across = sum(bool(a and b) and b[-1] not in (0, 1) and a[-1] == 1 for a, b in zip(xst, rst))
    along = sum(bool(b) and b[-1] == 1 for b in rst)
    return across > 0 and across >= along


def split_enabled() -> bool:
    """OSTINATO_SPLIT_REDUCTION=0 keeps every long row in one program (the A/B switch of split rows)."""
    return os.environ.get("OSTINATO_SPLIT_REDUCTION", "1") != "0"


def split_tiles() -> tuple[int, int]:
    """(programs a split row kernel aims at, elements per chunk of a part's walk): _TARGET_PROGRAMS and
    _SPLIT_RBLOCK unless OSTINATO_SPLIT_PROGRAMS / OSTINATO_SPLIT_RBLOCK (a power of 2) say otherwise
    (for sweeps, bench/profile_kernels.py --variants)."""
    programs = int(os.environ.get("OSTINATO_SPLIT_PROGRAMS", _TARGET_PROGRAMS))
    rblock = int(os.environ.get("OSTINATO_SPLIT_RBLOCK", _SPLIT_RBLOCK))
    if programs < 1 or rblock < 16 or rblock & (rblock - 1):
        raise ValueError(f"OSTINATO_SPLIT_PROGRAMS={programs} / OSTINATO_SPLIT_RBLOCK={rblock}: "
                         "a positive count and a power of 2 from 16")
    return programs, rblock


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


def _loop_order(dims: list[int], shape: tuple, candidates: list[list[int]]) -> list[int]:
    """``dims`` ordered as the first candidate operand that spans them all lies in memory (its largest
    stride first), so the innermost walked dim is its densest: a channels-last tensor is walked channel
    by channel inside each pixel, coalesced. Ties and dims of size 1 keep their order; row-major
    operands keep the order as it is."""
    live = [d for d in dims if shape[d] != 1]
    for st in candidates:
        if all(st[d] != 0 for d in live):
            return sorted(dims, key=lambda d: -abs(st[d]) if shape[d] != 1 else 0) if live else dims
    return dims


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
    """``kernel`` (the last) with its integer arguments and grid; ``stages``: the kernels a split row
    runs first (each storing one reduction's partials in a workspace of ``ws_shape``)."""
    __slots__ = ("kernel", "ints", "grid", "out_shapes", "empty", "formats", "stages", "ws_shape", "columns")

    def __init__(self, kernel, ints, grid, out_shapes, empty, formats, stages=(), ws_shape=None, columns=False):
        self.kernel, self.ints, self.grid, self.out_shapes, self.empty = kernel, ints, grid, out_shapes, empty
        self.formats, self.stages, self.ws_shape = formats, stages, ws_shape
        self.columns = columns      # rows across memory, several side by side per tile


class FusedLauncher:
    """One fusion group's kernel variants and launch plans."""

    def __init__(self, spec_json: str):
        self.spec: GroupSpec = parse(spec_json)
        self.n_in = len(self.spec.inputs)
        self.out_dtypes = [DTYPES[o[1]] for o in self.spec.outputs]
        self._plans: dict[tuple, _LaunchPlan] = {}
        self._libraries: dict[tuple, KernelLibrary] = {}
        self._lock = threading.Lock()

    def library(self, xr: int, rr: int, loop: bool, i64: bool, stage: int | None = None) -> tuple[KernelLibrary, str]:
        interpreted = os.environ.get("TRITON_INTERPRET") == "1"
        key = (xr, rr, loop, i64, interpreted, stage)
        lib = self._libraries.get(key)
        if lib is None:
            source, name = render(self.spec, xr, rr, loop, i64, interpreted, stage)
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
        strides = [list(split_dims(spec, base, tuple(st))[1]) if spec.split else st
                   for st in _operand_strides(spec, tensors, base)]
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
        x_out = [self.n_in + k for k, o in enumerate(spec.outputs) if o[2] == "x"]
        outer = _loop_order([d for d in range(rank) if d not in red], shape,
                            [strides[i] for i in x_out] + strides[:self.n_in])
        xs, xst = _collapse([shape[d] for d in outer], [[st[d] for d in outer] for st in strides])
        numel = math.prod(shape)
        if numel == 0:      # empty tensors: the torch reference gives what eager gives (sums of nothing)
            return _LaunchPlan(None, (), (0,), out_shapes, True, formats)
        if not red:
            rs, rst = [], [[] for _ in strides]
        else:
            order = _loop_order(list(red), shape, strides[:self.n_in])
            rs, rst = _collapse([shape[d] for d in order], [[st[d] for d in order] for st in strides])
        xnumel, rnumel = math.prod(xs), math.prod(rs)
        # gathered inputs: (tensor, its gathered dim), addressed whole by the index
        gathered = [(t, t.dim() - rank + spec.inputs[k][3]) for k, t in enumerate(tensors) if spec.inputs[k][1] == "g"]
        biggest = max([numel] + [sum((sz - 1) * abs(s) for sz, s in zip(xs + rs, a + b)) + 1
                                 for a, b in zip(xst, rst)]
                      + [sum((sz - 1) * abs(st) for sz, st in zip(t.shape, t.stride())) + 1 for t, _ in gathered])
        i64 = biggest >= 2**31 - 2**20
        ints = [xnumel] + ([rnumel] if red else []) + xs[1:] + rs[1:]
        for a, b in zip(xst, rst):
            ints += a + b
        for t, d in gathered:
            ints += [t.stride(d), t.shape[d]]
        chunks, columns = 1, False
        if red:
            loop = _pow2(rnumel) > MAX_PERSISTENT_ROW
            columns = _across_memory(xst[:self.n_in], rst[:self.n_in])
            if columns:
                # rows strided, kept dims dense (a channels-last tensor pooled over its pixels): a tile
                # holds several rows side by side, so each of its loads reads neighbours in memory
                xblock = min(_pow2(xnumel), _COLUMN_XBLOCK_MAX,
                             max(_COLUMN_XBLOCK_MIN, _floor_pow2(xnumel // _TARGET_COLUMN_PROGRAMS)))
                rblock = min(_pow2(rnumel), max(16, 2048 // xblock))
                loop = rnumel > rblock
            else:
                nsplit = self._splits(xnumel, rnumel) if loop else 1
                if nsplit > 1:
                    return self._split_plan(xs, rs, i64, ints, nsplit, out_shapes, formats)
                # (statistics over a narrower gathered row: narrower chunks, so more programs share the outputs)
                rblock = (_GATHERED_RBLOCK if gathered_statistics(spec) is not None else _LOOP_RBLOCK) if loop \
                    else _pow2(rnumel)
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
        return _LaunchPlan(kernel, tuple(ints), grid, out_shapes, False, formats, columns=columns)

    def _splits(self, xnumel: int, rnumel: int) -> int:
        """Programs per row when rows are too few to fill the GPU with one program each (a group norm:
        batch x groups rows of thousands of elements): each reduction then runs as partial sums over
        parts of the row, combined by the next kernel. 1: no split (many rows, switched off, or a
        reduction that does not accumulate in fp32)."""
        programs, rblock = split_tiles()
        if xnumel >= programs or not split_enabled() or gathered_statistics(self.spec) is not None:
            return 1
        if any(op[0] in REDUCTIONS and compute_code(op[1]) != "f32" for op in self.spec.ops):
            return 1
        return max(1, min(cdiv(rnumel, rblock), cdiv(programs, xnumel)))

    def _split_plan(self, xs, rs, i64, ints, nsplit, out_shapes, formats) -> _LaunchPlan:
        """split_stages(spec) kernels over a (rows, nsplit) grid, each program walking ``rchunk``
        elements of its row: the reductions' partials one after the other, then the outputs."""
        xnumel, rnumel = math.prod(xs), math.prod(rs)
        rblock = split_tiles()[1]
        rchunk = cdiv(cdiv(rnumel, nsplit), rblock) * rblock
        nsplit = cdiv(rnumel, rchunk)
        n_stages = split_stages(self.spec)
        kernels = []
        for stage in range(n_stages):
            lib, name = self.library(len(xs), len(rs), True, i64, stage)
            kernels.append(lib.kernel(name, XBLOCK=1, RBLOCK=rblock, SBLOCK=_pow2(nsplit), num_warps=4))
        grid = (xnumel, nsplit)
        return _LaunchPlan(kernels[-1], tuple(ints) + (rchunk, nsplit), grid, out_shapes, False, formats,
                           stages=tuple(kernels[:-1]), ws_shape=(split_slots(self.spec), xnumel, nsplit))

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
        if plan.ws_shape is None:
            plan.kernel(*tensors, *outs, *args[self.n_in:], *plan.ints, grid=plan.grid)
            return outs
        ws = torch.empty(plan.ws_shape, dtype=torch.float32, device=device)
        for kernel in (*plan.stages, plan.kernel):
            kernel(*tensors, *outs, *args[self.n_in:], *plan.ints, ws, grid=plan.grid)
        return outs


def _operand_strides(spec: GroupSpec, tensors, shape: tuple) -> list[list[int]]:
    """Each input's strides over ``shape`` (right-aligned, ``unsq`` trailing 1-dims added; 0 where it
    broadcasts)."""
    out = []
    for k, t in enumerate(tensors):
        unsq = spec.inputs[k][2]
        tshape = tuple(t.shape) + (1,) * unsq
        tstride = tuple(t.stride()) + (0,) * unsq
        pad = len(shape) - len(tshape)
        st = [0 if d < pad or tshape[d - pad] == 1 else tstride[d - pad] for d in range(len(shape))]
        if spec.inputs[k][1] == "g":    # the gathered dim is addressed by the index (gst)
            st[spec.inputs[k][3]] = 0
        out.append(st)
    return out


class _LinearPlan:
    __slots__ = ("kernel", "grid", "pro_ints", "epi_ints", "tail", "pro_shapes", "epi_shape", "mm_shape", "views",
                 "nsplit", "kslice", "scratch", "ws_cols")

    def __init__(self, **kw):
        for k, v in kw.items():
            setattr(self, k, v)


class LinearLauncher:
    """A matmul group's kernel (codegen.spec.LinearSpec): its prologue and epilogue addressed like any
    group's (their row dims collapsed into one: the matmul's rows), the weights as one packed [N, K]
    matrix. Where the weights are not packed (one [N, K] block), the group runs its torch reference."""

    def __init__(self, spec: LinearSpec):
        self.spec = spec
        self.n_tensors = spec.n_tensors
        # the weights and biases when there are several slices: their places decide whether they are one
        # packed block (plans are shared by every executable holding this group)
        n_pro, g = len(spec.pro.inputs), spec.n_weights
        self._packed = slice(n_pro, n_pro + g * (2 if spec.bias else 1)) if g > 1 else slice(0, 0)
        self._plans: dict[tuple, _LinearPlan | None] = {}
        self._libraries: dict[tuple, KernelLibrary] = {}
        self._lock = threading.Lock()

    def key(self, tensors) -> tuple:
        """What a plan depends on: shapes, strides, and where the slices' weights lie from the first's."""
        packed = tensors[self._packed]
        return (tuple((t.shape, t.stride()) for t in tensors),
                tuple(t.data_ptr() - packed[0].data_ptr() for t in packed))

    def library(self, one_row: bool, xr_pro: int = 1, xr_epi: int = 1, split: bool = False,
                dot: bool = False, stationary: bool = False, stats_stages: int = 0) -> KernelLibrary:
        interpreted = os.environ.get("TRITON_INTERPRET") == "1"
        key = (one_row, xr_pro, xr_epi, interpreted, split, dot, stationary, stats_stages)
        lib = self._libraries.get(key)
        if lib is None:
            source, name = render_linear(self.spec, one_row, xr_pro, xr_epi, interpreted, split, dot, stationary,
                                         stats_stages)
            register_source(f"gen_{name}", source)
            lib = self._libraries[key] = KernelLibrary(f"gen_{name}", {"k": name})
        return lib

    @staticmethod
    def _rows_and_cols(sizes: list[int], strides: list[list[int]]) -> tuple[int, list[int]]:
        """(the row dims left once collapsed, the ints of a group walked as [rows, last dim]: the row
        count, the column count, the row dims' sizes after the first, then per operand its row strides
        and column stride)."""
        xs, xst = _collapse(sizes[:-1], [st[:-1] for st in strides])
        ints = [math.prod(xs), sizes[-1], *xs[1:]]
        for a, st in zip(xst, strides):
            ints += [*a, st[-1]]
        return len(xs), ints

    def plan(self, tensors) -> _LinearPlan | None:
        spec = self.spec
        pro_in, weights, biases, rest = split_linear_args(spec, tensors)
        w = _packed_rows(weights)
        b = _packed_rows(biases) if spec.bias else None
        if w is None or w.stride(1) != 1 or (spec.bias and b is None):
            return None
        pshape = base_shape(spec.pro, pro_in)
        rows, k = pshape[:-1], pshape[-1]
        if k != w.shape[0 if spec.wt else 1] or math.prod(rows) == 0:
            return None
        row = rows + (1,)
        pro_shapes = [pshape if level == "x" else row if keepdim else rows
                      for _, _, level, keepdim, *_ in spec.pro.outputs]
        strides = _operand_strides(spec.pro, pro_in, pshape)
        strides += [_contiguous_strides(pshape if o[2] == "x" else row) for o in spec.pro.outputs]
        xr_pro, pro_ints = self._rows_and_cols(list(pshape), strides)
        ntot = w.shape[1 if spec.wt else 0]
        n = spec.w[0] if spec.epi is not None else ntot
        epi_shape, epi_ints, xr_epi = rows + (n,), [], 1
        if spec.epi is not None:
            placeholder = torch.empty(epi_shape, device=w.device, dtype=w.dtype)
            inputs = epilogue_inputs(spec, rest, [placeholder] * len(spec.w))
            strides = _operand_strides(spec.epi, inputs, epi_shape)
            strides += [_contiguous_strides(epi_shape) for _ in spec.epi.outputs]
            xr_epi, epi_ints = self._rows_and_cols(list(epi_shape), strides)
        m = math.prod(rows)
        # more rows than the GEMV-like kernel takes (a batched decode step, fp16/bf16): tensor cores
        dot = m > MAX_ROWS and spec.dt in HALF
        slices = len(spec.w) if spec.epi else 1
        rows_stationary = False
        if dot and m > MAX_DOT_ROWS:
            if m * max(k, ntot) >= 2 ** 31:
                return None     # (codegen.linear.tiled does not make such a group: int32 offsets)
            xblock, nblock, rblock, warps = tile_blocks(m, n, k, slices)
            rows_stationary = stationary(k) and rblock >= k
        else:
            nblock, rblock, warps = (dot_blocks if dot else linear_blocks)(m, n, k, slices, spec.wt)
            xblock = dot_rows_block(m) if dot else _pow2(m)
        nsplit = 1
        tiles = lone_tiles(spec, m, n, k)
        if tiles is not None:
            nblock, rblock, nsplit = tiles
        const = dict(XBLOCK=xblock, RBLOCK=rblock, NBLOCK=nblock, num_warps=warps)
        stats = 0
        if dot and m <= MAX_DOT_ROWS:   # the K-loop tl.dot kernel of a batched decode step: the sweep's knobs
            nsplit = max(1, min(dot_split(), cdiv(k, rblock)))
            stages, stats = dot_pipeline(xblock, nblock, rblock, slices)
            if stages is not None:
                const["num_stages"] = stages
        if nsplit > 1:
            const["NSPLIT"] = nsplit
        kernel = self.library(m == 1, xr_pro, xr_epi, nsplit > 1, dot, rows_stationary, stats).kernel("k", **const)
        views = [(g * spec.w[0] if spec.epi else sum(spec.w[:g]), spec.w[g]) for g in range(len(spec.w))
                 if spec.mm_store[g]]
        return _LinearPlan(kernel=kernel, grid=(1 if rows_stationary else cdiv(n, nblock),
                                                cdiv(m, xblock) if dot and nsplit == 1 else nsplit),
                           ws_cols=slices * m * n if dot else n,
                           pro_ints=pro_ints, epi_ints=epi_ints,
                           tail=[n, w.stride(0), ntot], pro_shapes=pro_shapes, epi_shape=epi_shape,
                           mm_shape=rows + (ntot,), views=views, nsplit=nsplit,
                           kslice=cdiv(cdiv(k, nsplit), rblock) * rblock, scratch={})

    def __call__(self, *args) -> tuple[torch.Tensor, ...]:
        spec = self.spec
        tensors, scalars = args[:self.n_tensors], args[self.n_tensors:]
        key = self.key(tensors)
        if key not in self._plans:
            with self._lock:
                self._plans[key] = self.plan(tensors)
        plan = self._plans[key]
        if plan is None:
            return tuple(evaluate_linear(spec, tensors, scalars))
        kargs, outs = self.arguments(plan, tensors, scalars)
        plan.kernel(*kargs, grid=plan.grid)
        return outs

    def arguments(self, plan: _LinearPlan, tensors, scalars) -> tuple[list, tuple[torch.Tensor, ...]]:
        """(the kernel's arguments, the group's outputs) for one call: outputs allocated, an unstored
        output's and a slice result's pointer filled with the weights' (never read nor written)."""
        spec = self.spec
        pro_in, weights, biases, rest = split_linear_args(spec, tensors)
        device, n_sc = weights[0].device, len(spec.pro.scalars)
        pro_outs = [torch.empty(s, dtype=DTYPES[o[1]], device=device) if keep else weights[0]
                    for s, o, keep in zip(plan.pro_shapes, spec.pro.outputs, spec.pro_store)]
        mm = torch.empty(plan.mm_shape, dtype=weights[0].dtype, device=device) if plan.views else weights[0]
        kargs = [*pro_in, *pro_outs, *scalars[:n_sc], *plan.pro_ints, weights[0]]
        if spec.bias:
            kargs.append(biases[0])
        kargs.append(mm)
        epi_outs = []
        if spec.epi is not None:
            epi_outs = [torch.empty(plan.epi_shape, dtype=DTYPES[o[1]], device=device) for o in spec.epi.outputs]
            kargs += [*epilogue_inputs(spec, rest, [weights[0]] * len(spec.w)), *epi_outs, *scalars[n_sc:],
                      *plan.epi_ints]
        outs = [t for t, keep in zip(pro_outs, spec.pro_store) if keep]
        outs += [mm.narrow(-1, start, size) for start, size in plan.views]
        if plan.nsplit > 1:
            capturing = device.type == "cuda" and torch.cuda.is_current_stream_capturing()
            tail = plan.tail + split_scratch(plan, device, capturing)
        else:
            tail = plan.tail
        return kargs + tail, tuple(outs + epi_outs)


_LAUNCHERS: dict[str, "FusedLauncher | LinearLauncher"] = {}


def launcher(spec_json: str) -> "FusedLauncher | LinearLauncher":
    f = _LAUNCHERS.get(spec_json)
    if f is None:
        spec = parse(spec_json)
        made = LinearLauncher(spec) if isinstance(spec, LinearSpec) else FusedLauncher(spec_json)
        f = _LAUNCHERS.setdefault(spec_json, made)
    return f


def forget_plans() -> None:
    """Drop every launcher's memoized launch plans (the next call plans again, reading the switches
    such as OSTINATO_SPLIT_REDUCTION anew): for A/B runs in one process."""
    for f in list(_LAUNCHERS.values()):
        f._plans.clear()


def run_fused(spec_json: str, *args) -> tuple[torch.Tensor, ...]:
    """ost.fused on CUDA: the group's generated kernel."""
    return launcher(spec_json)(*args)


run_fused.multi_output = True
