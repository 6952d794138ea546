"""Fuzzing the loader: mutated, truncated and spliced program files, and files with a length or offset
set to an edge value, either load (and verify, in each verify mode) or raise
ProgramFormatError; none crashes, hangs or allocates more than the file's size plus a small constant.

Half the cases re-seal the header's checksums after damaging the bytes, so the damage reaches the
FlatBuffer decoder, the tensor layout checks and the IR verifier instead of stopping at the hash.
"""
import os
import tempfile
import time
import tracemalloc

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import ostinato
from bench import ost_mutations as mut
from ostinato.errors import ProgramFormatError

CASES_PER_TEST = 2040          # x5 tests: over 10,000 cases per CI run
TIME_BOUND_S = 5.0             # per case
MEMORY_SLACK = 16 * 2**20      # bytes allowed beyond the file's size

FOLDER = tempfile.mkdtemp(prefix="ost-fuzz-")
BASE_PATHS, BASES = mut.base_files(FOLDER)
STATS = {"loaded": 0, "rejected": 0}
VERIFY = st.sampled_from([True, "checksums", False])


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


BASE = st.integers(0, len(BASES) - 1)
U31 = st.integers(0, 2**31)


@FUZZ
@given(base=BASE, flips=st.lists(st.tuples(U31, st.integers(1, 255)), min_size=1, max_size=12),
       reseal=st.booleans(), verify=VERIFY, in_fb=st.booleans())
def test_fuzz_mutate(base, flips, reseal, verify, in_fb):
    _check(mut.apply({"kind": "flip", "base": base, "reseal": reseal, "flips": flips, "in_fb": in_fb}, BASES),
           verify, "mutate")


@FUZZ
@given(base=BASE, cut=U31, reseal=st.booleans(), verify=VERIFY)
def test_fuzz_truncate(base, cut, reseal, verify):
    _check(mut.apply({"kind": "truncate", "base": base, "reseal": reseal, "cut": cut}, BASES), verify, "truncate")


@FUZZ
@given(dst=BASE, src=BASE, at=U31, start=U31, length=st.integers(1, 4096), insert=st.booleans(),
       reseal=st.booleans(), verify=VERIFY)
def test_fuzz_splice(dst, src, at, start, length, insert, reseal, verify):
    case = {"kind": "splice", "base": dst, "reseal": reseal, "donor": src, "at": at, "start": start,
            "length": length, "insert": insert}
    _check(mut.apply(case, BASES), verify, "splice")


@FUZZ
@given(base=BASE, pos=U31, choice=st.integers(0, 63), n=st.integers(0, 2**32 - 1), reseal=st.booleans(),
       verify=VERIFY)
def test_fuzz_lengths(base, pos, choice, n, reseal, verify):
    """A u32 of the FlatBuffer (a vector length, a vtable size or an offset) set to 0, 1, ~0, 2**31,
    the buffer's end, or a random value."""
    case = {"kind": "length", "base": base, "reseal": reseal, "pos": pos, "choice": choice, "n": n}
    _check(mut.apply(case, BASES), verify, "length")


@FUZZ
@given(base=BASE, field=st.integers(0, 63), choice=st.integers(0, 63), n=st.integers(0, 2**32 - 1),
       reseal=st.booleans(), verify=VERIFY)
def test_fuzz_header_offsets(base, field, choice, n, reseal, verify):
    case = {"kind": "offset", "base": base, "reseal": reseal, "field": field, "choice": choice, "n": n}
    _check(mut.apply(case, BASES), verify, "offset")


def test_unverified_load_of_a_damaged_file_does_not_poison_the_decoded_cache():
    """verify=False skips the FlatBuffer's sha256, so the bytes it decodes need not be the ones the
    header's hash names: they must not be cached under that hash, or a later verify="checksums" load of
    the good file (whose checksums pass) would be served the damaged program."""
    from ostinato.program.ir_cache import cached_decode
    good = BASES[1]
    fbo, fbs = mut.fb_range(good)
    header_sha = good[48:80]
    good_text = str(ostinato.load(BASE_PATHS[1], verify=True).graph)
    loaded = 0
    for attempt in range(200):
        damaged = mut.flip(good, [(attempt * 7919, 0x01)], in_fb=True)   # header (and its hash) intact
        path = os.path.join(FOLDER, f"poison-{os.getpid()}.ost")
        with open(path, "wb") as f:
            f.write(damaged)
        ostinato.cache.clear()   # as on a machine that never loaded the good file
        try:
            ostinato.load(path, verify=False)
        except ProgramFormatError:
            continue
        cached = cached_decode(header_sha)
        if cached is not None:
            assert str(cached[0]) == good_text, f"flip {attempt}: damaged bytes cached under the good hash"
        loaded += 1
        reloaded = ostinato.load(BASE_PATHS[1], verify="checksums")
        assert str(reloaded.graph) == good_text, f"flip {attempt}: the good file loads the damaged program"
    assert loaded >= 20, "too few damaged files loaded with verify=False to test anything"


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
