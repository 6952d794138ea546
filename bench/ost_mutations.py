"""Damaged .ost files, made from good ones: the mutations the loader's fuzz test
(tests/program/test_fuzz.py, in-process through hypothesis) and the fault measurement
(bench/reliability.py, in worker subprocesses) both apply. Each mutation is a pure function of the bytes
and its parameters, so a case is reproduced from its parameters alone.

``reseal`` recomputes both checksums from the header's own offsets, so the damage reaches the
FlatBuffer decoder, the tensor layout checks and the IR verifier instead of stopping at the hash.
"""
from __future__ import annotations

import hashlib
import os
import random
import struct

# Header fields (ostinato.program.format): u64 fb_offset, fb_size, data_offset, data_size at 16..48,
# then the two sha256 at 48..80 and 80..112; u32 schema and header_size at 8..16.
HEADER_U64_FIELDS = {"fb_offset": 16, "fb_size": 24, "data_offset": 32, "data_size": 40}
HEADER_U32_FIELDS = {"schema": 8, "header_size": 12}
KINDS = ("flip", "truncate", "splice", "length", "offset")


def reseal(data: bytearray) -> None:
    """Recompute both checksums from the header's own offsets (if they are in range)."""
    if len(data) < 128:
        return
    from ostinato.program.format import data_digest   # the data hash of the header's schema (1 or 2)
    fbo, fbs, do, ds = struct.unpack_from("<QQQQ", data, 16)
    schema = struct.unpack_from("<I", data, 8)[0]
    if fbo + fbs <= len(data):
        data[48:80] = hashlib.sha256(bytes(data[fbo:fbo + fbs])).digest()
    if do + ds <= len(data):
        data[80:112] = data_digest(bytes(data[do:do + ds]), max(schema, 1), threads=1)


def fb_range(data: bytes) -> tuple[int, int]:
    """The FlatBuffer's (offset, size) as a good file's header gives them."""
    return struct.unpack_from("<QQ", data, 16)


def flip(data: bytes, flips: list[tuple[int, int]], in_fb: bool) -> bytearray:
    """XOR byte ``pos % size`` with ``x`` for each (pos, x): anywhere, or within the FlatBuffer."""
    out = bytearray(data)
    fbo, fbs = fb_range(data)
    for pos, x in flips:
        i = (fbo + pos % fbs) if in_fb else pos % len(out)
        out[i] ^= x
    return out


def truncate(data: bytes, cut: int) -> bytearray:
    return bytearray(data[:cut % (len(data) + 1)])


def splice(data: bytes, donor: bytes, at: int, start: int, length: int, insert: bool) -> bytearray:
    """Insert (or overwrite with) ``length`` bytes of ``donor`` from ``start`` at ``at``."""
    out = bytearray(data)
    start %= len(donor)
    piece = donor[start:start + length]
    at %= len(out)
    if insert:
        out[at:at] = piece
    else:
        out[at:at + len(piece)] = piece
    return out


def interesting(n: int, choice: int, near: int) -> int:
    """A value that breaks length and offset arithmetic: 0, 1, all ones, the sign bit, just past
    ``near`` (the buffer's end), or ``n`` itself (a random one)."""
    values = (0, 1, 0xFFFFFFFF, 0x7FFFFFFF, 0x80000000, near, near + 1, near - 1, near * 2 + 64, n & 0xFFFFFFFF)
    return values[choice % len(values)] & 0xFFFFFFFF


def set_length(data: bytes, pos: int, choice: int, n: int) -> bytearray:
    """Overwrite one aligned u32 of the FlatBuffer (vector and string lengths, vtable sizes and
    uoffsets are all u32) with an interesting value."""
    out = bytearray(data)
    fbo, fbs = fb_range(data)
    i = fbo + (pos % max(1, fbs // 4)) * 4
    if i + 4 <= len(out):
        struct.pack_into("<I", out, i, interesting(n, choice, fbs))
    return out


def set_offset(data: bytes, field: int, choice: int, n: int) -> bytearray:
    """Overwrite one of the header's offsets, sizes, schema or header size with an interesting value."""
    out = bytearray(data)
    names = list(HEADER_U64_FIELDS) + list(HEADER_U32_FIELDS)
    name = names[field % len(names)]
    value = interesting(n, choice, len(data))
    if name in HEADER_U64_FIELDS:
        if choice % 7 == 2:
            value = 0xFFFFFFFFFFFFFFFF
        struct.pack_into("<Q", out, HEADER_U64_FIELDS[name], value)
    else:
        struct.pack_into("<I", out, HEADER_U32_FIELDS[name], value)
    return out


def random_case(rng: random.Random, n_bases: int) -> dict:
    """Parameters of one damaged file, drawn from ``rng`` (JSON-able; ``apply`` makes the bytes)."""
    kind = rng.choice(KINDS)
    case = {"kind": kind, "base": rng.randrange(n_bases), "reseal": rng.random() < 0.5}
    if kind == "flip":
        case.update(flips=[(rng.randrange(2**31), rng.randint(1, 255)) for _ in range(rng.randint(1, 12))],
                    in_fb=rng.random() < 0.5)
    elif kind == "truncate":
        case.update(cut=rng.randrange(2**31))
    elif kind == "splice":
        case.update(donor=rng.randrange(n_bases), at=rng.randrange(2**31), start=rng.randrange(2**31),
                    length=rng.randint(1, 4096), insert=rng.random() < 0.5)
    elif kind == "length":
        case.update(pos=rng.randrange(2**31), choice=rng.randrange(64), n=rng.randrange(2**32))
    else:
        case.update(field=rng.randrange(64), choice=rng.randrange(64), n=rng.randrange(2**32))
    return case


def apply(case: dict, bases: list[bytes]) -> bytes:
    data = bases[case["base"]]
    kind = case["kind"]
    if kind == "flip":
        out = flip(data, case["flips"], case["in_fb"])
    elif kind == "truncate":
        out = truncate(data, case["cut"])
    elif kind == "splice":
        out = splice(data, bases[case["donor"]], case["at"], case["start"], case["length"], case["insert"])
    elif kind == "length":
        out = set_length(data, case["pos"], case["choice"], case["n"])
    else:
        out = set_offset(data, case["field"], case["choice"], case["n"])
    if case["reseal"]:
        reseal(out)
    return bytes(out)


def base_programs() -> list:
    """The good programs every case starts from: an MLP, a tiny decoder with dynamic sizes and state,
    one constant per dtype, and non-tensor inputs and outputs (needs tests/ on sys.path, as under pytest)."""
    import torch

    import ostinato
    from program.models import AllDtypes, WithConstants, tiny_decoder_program
    torch.manual_seed(0)
    return [
        ostinato.export(torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.GELU(), torch.nn.Linear(5, 3)),
                        (torch.randn(2, 6),)),
        tiny_decoder_program(seed=1)[1],
        ostinato.export(AllDtypes(), (torch.randn(3, 4),)),
        ostinato.export(WithConstants(), (torch.randn(2, 3), 3, "fast")),
    ]


def base_files(folder: str) -> tuple[list[str], list[bytes]]:
    """Save the base programs under ``folder``: their paths and bytes."""
    paths, blobs = [], []
    for i, p in enumerate(base_programs()):
        path = os.path.join(folder, f"base{i}.ost")
        p.save(path)
        paths.append(path)
        with open(path, "rb") as f:
            blobs.append(f.read())
    return paths, blobs
