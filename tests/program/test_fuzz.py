"""Fuzzing the loader: mutated, truncated and spliced program files either load (and verify) or raise
ProgramFormatError; none crashes, hangs or allocates more than the file's size plus a small constant.

Half the cases re-seal the header's checksums after damaging the bytes, so the damage reaches the
FlatBuffer decoder, the tensor layout checks and the IR verifier instead of stopping at the hash.
"""
import hashlib
import os
import struct
import tempfile
import time
import tracemalloc

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import ostinato
from ostinato.errors import ProgramFormatError
from program.models import AllDtypes, WithConstants, tiny_decoder_program

CASES_PER_TEST = 3400          # x3 tests: over 10,000 cases per CI run
TIME_BOUND_S = 5.0             # per case
MEMORY_SLACK = 16 * 2**20      # bytes allowed beyond the file's size


def _make_bases():
    folder = tempfile.mkdtemp(prefix="ost-fuzz-")
    progs = [
        ostinato.export(torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.GELU(), torch.nn.Linear(5, 3)),
                        (torch.randn(2, 6),)),
        tiny_decoder_program(seed=1)[1],
        ostinato.export(AllDtypes(), (torch.randn(3, 4),)),
        ostinato.export(WithConstants(), (torch.randn(2, 3), 3, "fast")),
    ]
    blobs = []
    for i, p in enumerate(progs):
        path = os.path.join(folder, f"{i}.ost")
        p.save(path)
        blobs.append(open(path, "rb").read())
    return folder, blobs


FOLDER, BASES = _make_bases()
STATS = {"loaded": 0, "rejected": 0}


def _reseal(data: bytearray) -> None:
    """Recompute both checksums from the header's own offsets (if they are in range)."""
    if len(data) < 128:
        return
    fbo, fbs, do, ds = struct.unpack_from("<QQQQ", data, 16)
    if fbo + fbs <= len(data):
        data[48:80] = hashlib.sha256(bytes(data[fbo:fbo + fbs])).digest()
    if do + ds <= len(data):
        data[80:112] = hashlib.sha256(bytes(data[do:do + ds])).digest()


def _check(data: bytes, verify: bool, name: str) -> None:
    path = os.path.join(FOLDER, f"case-{os.getpid()}-{name}.ost")
    with open(path, "wb") as f:
        f.write(data)
    tracemalloc.start()
    t0 = time.perf_counter()
    try:
        prog = ostinato.load(path, verify=verify)
        STATS["loaded"] += 1
        assert prog.graph is not None
    except ProgramFormatError:
        STATS["rejected"] += 1
    finally:
        elapsed = time.perf_counter() - t0
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    assert elapsed < TIME_BOUND_S, f"load took {elapsed:.2f}s"
    assert peak <= len(data) + MEMORY_SLACK, f"load allocated {peak} bytes for a {len(data)}-byte file"


FUZZ = settings(max_examples=CASES_PER_TEST, deadline=None, derandomize=True, database=None,
                suppress_health_check=list(HealthCheck))


@FUZZ
@given(base=st.integers(0, len(BASES) - 1), flips=st.lists(st.tuples(st.integers(0, 2**31), st.integers(1, 255)),
                                                             min_size=1, max_size=12),
       reseal=st.booleans(), verify=st.booleans(), in_fb=st.booleans())
def test_fuzz_mutate(base, flips, reseal, verify, in_fb):
    data = bytearray(BASES[base])
    fbo, fbs = struct.unpack_from("<QQ", data, 16)
    for pos, x in flips:
        i = (fbo + pos % fbs) if in_fb else pos % len(data)
        data[i] ^= x
    if reseal:
        _reseal(data)
    _check(bytes(data), verify, "mutate")


@FUZZ
@given(base=st.integers(0, len(BASES) - 1), cut=st.integers(0, 2**31), reseal=st.booleans(),
       verify=st.booleans())
def test_fuzz_truncate(base, cut, reseal, verify):
    data = bytearray(BASES[base][:cut % (len(BASES[base]) + 1)])
    if reseal:
        _reseal(data)
    _check(bytes(data), verify, "truncate")


@FUZZ
@given(dst=st.integers(0, len(BASES) - 1), src=st.integers(0, len(BASES) - 1), at=st.integers(0, 2**31),
       start=st.integers(0, 2**31), length=st.integers(1, 4096), insert=st.booleans(), reseal=st.booleans(),
       verify=st.booleans())
def test_fuzz_splice(dst, src, at, start, length, insert, reseal, verify):
    data = bytearray(BASES[dst])
    donor = BASES[src]
    start %= len(donor)
    piece = donor[start:start + length]
    at %= len(data)
    if insert:
        data[at:at] = piece
    else:
        data[at:at + len(piece)] = piece
    if reseal:
        _reseal(data)
    _check(bytes(data), verify, "splice")


def test_fuzz_bases_load():
    for blob in BASES:
        _check(blob, True, "base")
    assert STATS["loaded"] >= len(BASES)


@pytest.fixture(scope="module", autouse=True)
def _report():
    yield
    total = STATS["loaded"] + STATS["rejected"]
    print(f"\nprogram fuzz: {total} cases in this process, {STATS['loaded']} loaded and verified, "
          f"{STATS['rejected']} rejected with ProgramFormatError")
