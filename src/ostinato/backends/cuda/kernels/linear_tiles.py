"""Tile choices of matmul groups (``LinearLauncher`` in fused.py): the GEMV-like kernel's blocks, the
tl.dot kernel's (rows, columns, K step, warps, and the sweep knobs: pipeline depth, split-K, pipelined
statistics) and the tiled kernel's past MAX_DOT_ROWS rows with its shared-memory budget. One-row split-K
tiles are split_k.py's."""
from __future__ import annotations

import os

from ....codegen.linear import MAX_DOT_ROWS
from .common import cdiv, pow2 as _pow2


def linear_blocks(m: int, n: int, k: int, slices: int, transposed: bool = False) -> tuple[int, int, int]:
    """(NBLOCK, RBLOCK, num_warps) of a matmul group: ``m`` rows, ``n`` columns walked, ``k`` the
    reduction, ``slices`` weight tiles per step. From bench/gemv.py's sweep on an H100 (bf16, one row):
    8 columns per program up to 4096 columns, 16 past that; K in steps of 512, at most 16384 weights
    per step (8192 products of every row when there are several: registers). Several slices (gate and
    up) walk K in at least 8 steps: at K=2048 a 256-wide step beats 512 by 14% on the H100 and 11% on
    the H200 (docs/benchmarks/matmul_groups_gpu/gemv_sweep*.json), at K=4096 512 stays best. A weight
    stored [K, N] (``transposed``) is read along N: 16 columns per program, one 32-byte sector of a
    16-bit row (not swept)."""
    nblock = 16 if transposed or n > 4096 else 8
    budget = 16384 if m == 1 else 8192 // _pow2(m)
    if m > 1:
        nblock = min(nblock, max(2, budget // 128))
    fit = budget // (nblock * slices)
    rblock = max(16, min(512, _pow2(k), 1 << (fit.bit_length() - 1) if fit else 1))
    if slices > 1:
        rblock = max(16, min(rblock, max(128, _pow2(k) // 8)))
    return nblock, rblock, 4


_DOT_PROGRAMS = 128         # a tl.dot matmul group narrows its column tile until about this many programs run


def dot_blocks(m: int, n: int, k: int, slices: int, transposed: bool = False) -> tuple[int, int, int]:
    """(NBLOCK, RBLOCK, num_warps) of a matmul group of more than MAX_ROWS rows in fp16/bf16 (the tl.dot
    kernel; XBLOCK is the rows' power of two, 32 or 64). 64 columns per program where that still gives
    _DOT_PROGRAMS programs (Llama-8B's gate/up, 14336 columns: 224), else 32 where that does (its q/k/v,
    6144: 192; o and down, 4096: 128), else 16 (tl.dot's smallest tile); K in steps of 64 (less for a
    shorter K, 16 at least), 4 warps, Triton's default three stages (the backend passes num_warps only).
    Every program recomputes A (and the prologue's statistics) for all rows from L2: wider column tiles
    read it fewer times. On an H100 these tiles read llama-4096's weights at about 1.2 TB/s, cuBLAS at 2.7
    (codegen/linear.py: why the kernel is opt-in); OSTINATO_DOT_NBLOCK,
    OSTINATO_DOT_RBLOCK (powers of 2 from 16) and OSTINATO_DOT_WARPS (4 or 8) override it for sweeps.
    ``m``, ``slices`` and ``transposed`` are not read (the arguments are linear_blocks')."""
    nblock = 64 if cdiv(n, 64) >= _DOT_PROGRAMS else 32 if cdiv(n, 32) >= _DOT_PROGRAMS else 16
    rblock, warps = max(16, min(64, _pow2(k))), 4
    nblock = int(os.environ.get("OSTINATO_DOT_NBLOCK", nblock))
    rblock = int(os.environ.get("OSTINATO_DOT_RBLOCK", rblock))
    warps = int(os.environ.get("OSTINATO_DOT_WARPS", warps))
    if nblock < 16 or nblock & (nblock - 1) or rblock < 16 or rblock & (rblock - 1) or warps not in (4, 8):
        raise ValueError(f"OSTINATO_DOT_NBLOCK={nblock} / OSTINATO_DOT_RBLOCK={rblock} / OSTINATO_DOT_WARPS={warps}: "
                         "powers of 2 from 16, and 4 or 8 warps")
    return nblock, rblock, warps


def dot_rows_block(m: int) -> int:
    """XBLOCK of a tl.dot matmul group of ``m`` rows (at most MAX_DOT_ROWS): their power of two, 16 at
    least (tl.dot's smallest tile; Hopper's wgmma takes 64 rows a warp group, mma.sync fewer).
    OSTINATO_DOT_XBLOCK (a power of two, at least the rows') overrides it for sweeps."""
    xblock = max(16, _pow2(m))
    raw = os.environ.get("OSTINATO_DOT_XBLOCK")
    if raw is not None:
        want = int(raw)
        if want < xblock or want & (want - 1) or want > MAX_DOT_ROWS:
            raise ValueError(f"OSTINATO_DOT_XBLOCK={raw}: a power of two from {xblock} (the rows' own) to "
                             f"{MAX_DOT_ROWS}")
        xblock = want
    return xblock


def dot_stages() -> int | None:
    """Triton's software-pipeline depth for a tl.dot matmul group of at most MAX_DOT_ROWS rows: None
    leaves Triton's default (three stages); OSTINATO_DOT_STAGES (2 to 8) sets it for sweeps."""
    raw = os.environ.get("OSTINATO_DOT_STAGES")
    if raw is None:
        return None
    if not raw.isdigit() or not 2 <= int(raw) <= 8:
        raise ValueError(f"OSTINATO_DOT_STAGES={raw}: an integer from 2 to 8")
    return int(raw)


def dot_split() -> int:
    """How many ways a tl.dot matmul group (at most MAX_DOT_ROWS rows) splits K (render_linear's ``split``
    with ``dot``): 1 unless OSTINATO_DOT_SPLIT (1, 2, 4 or 8) asks for more (sweeps)."""
    raw = os.environ.get("OSTINATO_DOT_SPLIT", "1")
    if raw not in ("1", "2", "4", "8"):
        raise ValueError(f"OSTINATO_DOT_SPLIT={raw}: 1, 2, 4 or 8")
    return int(raw)


def dot_stats_stages() -> int:
    """How deep a tl.dot matmul group (at most MAX_DOT_ROWS rows) pipelines its prologue's statistics
    loops (render_linear's ``stats_stages``): 0, a plain loop, unless OSTINATO_DOT_STATS_STAGES (2 to 8)
    asks for it (sweeps)."""
    raw = os.environ.get("OSTINATO_DOT_STATS_STAGES", "0")
    if not raw.isdigit() or int(raw) not in (0, *range(2, 9)):
        raise ValueError(f"OSTINATO_DOT_STATS_STAGES={raw}: 0, or an integer from 2 to 8")
    return int(raw)


def dot_pipeline(xblock: int, nblock: int, rblock: int, slices: int) -> tuple[int | None, int]:
    """(num_stages, statistics stages) of a K-loop tl.dot matmul group: the asked pipeline depth (or
    Triton's three) lowered until its buffers fit the SM's shared memory, None where that is Triton's
    default (the binaries' keys stay); and dot_stats_stages(). Per stage the weights' tiles and twice A's
    (its staging for the dot; 64-row tiles took more), plus the pipelined statistics loop's: above what
    Triton 3.6 asked on an H200 for every tile the 2026-11-27 sweep tried (5 stages of 32 x 128 x 64 over
    two slices asked 237568 bytes)."""
    want, stats = dot_stages(), dot_stats_stages()
    stages = want or 3
    stats_bytes = 2 * xblock * rblock * stats
    while stages > 2 and stages * 2 * rblock * (2 * xblock + slices * nblock) + stats_bytes > TILE_SHARED_BYTES:
        stages -= 1
    return (stages if want is not None or stages != 3 else None), stats


STATIONARY_K = 256      # a tiled matmul group of a K up to this holds all of K in one tile (row-stationary)


def stationary(k: int) -> bool:
    """Whether a tiled matmul group over ``k`` runs the row-stationary kernel (one program per row block,
    A made once; codegen.triton_linear.render_linear): a K of at most STATIONARY_K, unless
    OSTINATO_TILED_KLOOP=1 asks for the K-loop form (one program per row and column block)."""
    return _pow2(k) <= STATIONARY_K and os.environ.get("OSTINATO_TILED_KLOOP") != "1"


def tile_blocks(m: int, n: int, k: int, slices: int) -> tuple[int, int, int, int]:
    """(XBLOCK, NBLOCK, RBLOCK, num_warps) of a tl.dot matmul group of more than MAX_DOT_ROWS rows (a
    memory-bound projection with neighbours: codegen.linear.tiled): 128 rows by 128 columns a program,
    64 columns with two weight slices (two fp32 accumulators), 8 warps; K in steps of 64 (less for a
    shorter K), or all of it in one tile where ``stationary``. Column blocks vary fastest in the grid, so
    the programs running together share their rows' A tiles (and the prologue's reads) in L2.
    OSTINATO_DOT_NBLOCK, OSTINATO_DOT_RBLOCK and OSTINATO_DOT_WARPS override it as for dot_blocks;
    OSTINATO_DOT_XBLOCK the rows. Not measured faster than cuBLAS yet (codegen/linear.py)."""
    xblock = int(os.environ.get("OSTINATO_DOT_XBLOCK", 128))
    nblock = min(128 if slices == 1 else 64, max(16, _pow2(n)))
    rblock, warps = max(16, _pow2(k) if stationary(k) else min(64, _pow2(k))), 8
    rblock = int(os.environ.get("OSTINATO_DOT_RBLOCK", rblock))
    held = stationary(k) and rblock >= k
    if "OSTINATO_DOT_NBLOCK" in os.environ:
        nblock = int(os.environ["OSTINATO_DOT_NBLOCK"])
    else:   # fewer columns a program until its tiles fit the SM's shared memory
        while nblock > 32 and tile_shared_bytes(xblock, nblock, rblock, held) > TILE_SHARED_BYTES:
            nblock //= 2
    warps = int(os.environ.get("OSTINATO_DOT_WARPS", warps))
    if min(xblock, nblock, rblock) < 16 or any(b & (b - 1) for b in (xblock, nblock, rblock)) or warps not in (4, 8):
        raise ValueError(f"OSTINATO_DOT_XBLOCK={xblock} / OSTINATO_DOT_NBLOCK={nblock} / OSTINATO_DOT_RBLOCK={rblock} / "
                         f"OSTINATO_DOT_WARPS={warps}: powers of 2 from 16, and 4 or 8 warps")
    return xblock, nblock, rblock, warps


TILE_SHARED_BYTES = 200 * 1024   # what a tiled matmul program may plan on (an sm_90 block may have 227 KiB)


def tile_shared_bytes(xblock: int, nblock: int, rblock: int, held: bool) -> int:
    """The shared memory (bytes) a tiled matmul program of 16-bit operands asks for with Triton's three
    pipeline stages: the weight tile in each stage, the row tile held (row-stationary) or in each stage
    too (K loop), and the result tile for the epilogue's layout change. For 128 x 128 tiles over a K of 256,
    row-stationary, this is the 294912 bytes Triton 3.6 asked for on an H200 (more than the SM has)."""
    a = xblock * rblock * (1 if held else 3)
    return 2 * (a + 3 * rblock * nblock + xblock * nblock)
