"""The static memory planner (``runtime.memory.plan_memory``) and the memory reports of captures.

plan_memory's contract: lifetimes are launch-index intervals with both ends included; buffers whose
lifetimes overlap never share bytes; offsets are 64-byte aligned; the arena holds every buffer.
"""
from __future__ import annotations

import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import ostinato
from ostinato.runtime.memory import ALIGNMENT, BufferLife, MemoryReport, plan_memory
from replay.replay_models import TINY_BATCH, decode_inputs, tiny, tiny_decoder, whisper, whisper_encoder


def aligned(n: int) -> int:
    return (max(n, 1) + ALIGNMENT - 1) // ALIGNMENT * ALIGNMENT


def check_plan(buffers: list[BufferLife]) -> tuple[list[int], int]:
    offsets, arena = plan_memory(buffers)
    assert len(offsets) == len(buffers)
    for i, (b, off) in enumerate(zip(buffers, offsets)):
        assert off % ALIGNMENT == 0, f"buffer {i} at offset {off} is not {ALIGNMENT}-aligned"
        assert 0 <= off and off + b.nbytes <= arena, f"buffer {i} [{off}, {off + b.nbytes}) outside arena {arena}"
    for i, (a, oa) in enumerate(zip(buffers, offsets)):
        for j in range(i + 1, len(buffers)):
            b, ob = buffers[j], offsets[j]
            lifetimes_meet = a.first <= b.last and b.first <= a.last
            bytes_meet = oa < ob + b.nbytes and ob < oa + a.nbytes
            if lifetimes_meet and a.nbytes and b.nbytes:
                assert not bytes_meet, (f"buffers {i} {a} at {oa} and {j} {b} at {ob} are alive together and "
                                        "share bytes")
    if buffers:
        # The bytes alive at once peak when some buffer starts.
        peak = max(sum(b.nbytes for b in buffers if b.first <= t <= b.last) for t in {b.first for b in buffers})
        assert arena >= peak, f"arena {arena} < {peak} bytes alive at once"
    assert arena <= sum(aligned(b.nbytes) for b in buffers)
    return offsets, arena


lives = st.builds(lambda n, first, length: BufferLife(n, first, first + length),
                  st.integers(0, 5000), st.integers(0, 40), st.integers(0, 15))


@settings(max_examples=300, deadline=None)
@given(st.lists(lives, max_size=40))
def test_plan_memory_properties(buffers):
    check_plan(buffers)


@pytest.mark.parametrize("seed", range(5))
def test_plan_memory_transformer_like_lifetimes(seed):
    """Hundreds of short-lived temporaries with a few long-lived ones (as in a decoder's plan)."""
    rng = random.Random(seed)
    buffers = []
    for i in range(400):
        length = rng.choice([0, 1, 1, 2, 3, 5]) if rng.random() > 0.05 else rng.randint(50, 400)
        buffers.append(BufferLife(rng.choice([4, 256, 1000, 4096, 16384]) * rng.randint(1, 4), i, i + length))
    buffers.append(BufferLife(2048, 0, 1 << 60))   # an output: alive after the tape returns
    _, arena = check_plan(buffers)
    assert arena < sum(b.nbytes for b in buffers) / 4, "short lifetimes should share most bytes"


def test_plan_memory_small_cases():
    assert plan_memory([]) == ([], 0)
    # Disjoint lifetimes share: the arena is the largest buffer.
    offsets, arena = plan_memory([BufferLife(100, 0, 1), BufferLife(300, 2, 3), BufferLife(200, 4, 4)])
    assert offsets == [0, 0, 0] and arena == aligned(300)
    # Both ends are included: a buffer last used by launch 2 and one first written by launch 2 are alive
    # together (the launch reads one while writing the other).
    offsets, arena = plan_memory([BufferLife(64, 0, 2), BufferLife(64, 2, 3)])
    assert offsets[0] != offsets[1] and arena == 128
    # A zero-byte buffer still gets an aligned offset, and sizes are rounded up to the alignment.
    offsets, arena = plan_memory([BufferLife(0, 0, 5), BufferLife(65, 0, 5), BufferLife(1, 0, 5)])
    assert all(o % ALIGNMENT == 0 for o in offsets) and arena == 64 + 128 + 64
    # Bytes freed by a buffer are reused by later ones: never more than two of these are alive at once.
    offsets, arena = plan_memory([BufferLife(640, 0, 9), BufferLife(640, 0, 1), BufferLife(640, 3, 9),
                                  BufferLife(128, 2, 2)])
    assert offsets == [0, 640, 640, 640] and arena == 1280


def test_memory_report_of_the_tiny_decoder():
    _, prog = tiny_decoder()
    exe = ostinato.compile(prog, device="cpu", replay=True)
    gen = torch.Generator().manual_seed(2)
    for s in range(3):
        exe(*decode_inputs(s, TINY_BATCH, tiny.VOCAB, gen))
    (report,) = exe.memory_report()
    assert isinstance(report, MemoryReport)
    assert report.signature == ""  # a static program
    assert report.temporaries > tiny.LAYERS * 10
    assert 0 < report.arena_bytes < report.naive_bytes
    # Layers run one after another: the arena is a small fraction of all temporaries together.
    assert report.arena_bytes * 3 < report.naive_bytes
    assert 0 <= report.fallback_launches < report.temporaries
    assert "static: arena" in str(report) and "x less" in str(report)


def test_memory_report_per_signature():
    encoder, prog = whisper_encoder()
    exe = ostinato.compile(prog, device="cpu", replay=True)
    torch.manual_seed(3)
    for b in (1, 2, 1):
        exe(whisper.features(b))
    reports = exe.memory_report()
    assert len(reports) == 2
    (symbol,) = prog.graph.symbols
    assert [r.signature for r in reports] == [f"{symbol}=1", f"{symbol}=2"]
    one, two = reports
    assert one.temporaries == two.temporaries
    # Every temporary scales with the batch (the position table, weights only, is folded into a
    # constant at compile), so batch 2 needs more bytes, about twice as many (up to each buffer's
    # 64-byte alignment).
    slack = 64 * one.temporaries
    assert one.naive_bytes < two.naive_bytes <= 2 * one.naive_bytes + slack
    assert one.arena_bytes < two.arena_bytes <= 2 * one.arena_bytes + slack
    assert all(r.arena_bytes < r.naive_bytes for r in reports)
