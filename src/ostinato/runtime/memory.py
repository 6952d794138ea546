"""Static memory planning: every temporary of a Plan gets an offset in one arena.

Buffers whose lifetimes (launch-index intervals, both ends included) overlap never share bytes;
buffers whose lifetimes are disjoint may. Greedy, largest first: each buffer takes the lowest offset
that clears every already-placed buffer alive at the same time. The classic size-ordered planner
(as in TFLite's and ExecuTorch's); within a few percent of optimal on transformer plans.
"""
from __future__ import annotations

import bisect
from dataclasses import dataclass

ALIGNMENT = 64  # bytes: a cache line, and a multiple of every dtype's size


@dataclass(frozen=True)
class BufferLife:
    """A temporary: its size in bytes and the first and last launch that touch it."""

    nbytes: int
    first: int
    last: int


def _align(n: int) -> int:
    return (n + ALIGNMENT - 1) // ALIGNMENT * ALIGNMENT


def plan_memory(buffers: list[BufferLife]) -> tuple[list[int], int]:
    """Offsets (one per buffer, in input order) and the arena's size in bytes."""
    order = sorted(range(len(buffers)), key=lambda i: (-buffers[i].nbytes, buffers[i].first, i))
    offsets = [0] * len(buffers)
    # Placed buffers sorted by their first launch, with a running view of who is alive when; a
    # buffer only has to clear those whose interval meets its own.
    placed_first: list[int] = []
    placed: list[tuple[int, int, int, int]] = []   # (first, last, offset, end) in placed_first order
    longest = 0                                     # the longest lifetime placed so far
    arena = 0
    for i in order:
        b = buffers[i]
        size = _align(max(b.nbytes, 1))
        # Candidates started at most `longest` launches before b.first (else they ended before it).
        lo = bisect.bisect_left(placed_first, b.first - longest)
        hi = bisect.bisect_right(placed_first, b.last)
        busy = sorted((off, end) for first, last, off, end in placed[lo:hi] if last >= b.first)
        offset = 0
        for off, end in busy:
            if offset + size <= off:
                break
            offset = max(offset, end)
        offsets[i] = offset
        at = bisect.bisect_right(placed_first, b.first)
        placed_first.insert(at, b.first)
        placed.insert(at, (b.first, b.last, offset, offset + size))
        longest = max(longest, b.last - b.first)
        arena = max(arena, offset + size)
    return offsets, arena


@dataclass(frozen=True)
class MemoryReport:
    """One captured plan's memory: the arena against what its temporaries would take one by one."""

    signature: str
    arena_bytes: int
    naive_bytes: int      # the sum of every temporary's size (no reuse)
    temporaries: int
    fallback_launches: int = 0   # launches with no out= form: they allocate and copy into the arena

    def __str__(self) -> str:
        ratio = self.naive_bytes / self.arena_bytes if self.arena_bytes else float("inf")
        return (f"{self.signature or 'static'}: arena {self.arena_bytes / 1024:.1f} KiB for "
                f"{self.temporaries} temporaries of {self.naive_bytes / 1024:.1f} KiB ({ratio:.1f}x less)")
