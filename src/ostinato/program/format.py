"""The .ost file's fixed header and layout constants.

    offset 0    header (HEADER_SIZE bytes, little-endian):
                  magic        8s   b"OSTINATO"
                  schema       u32  schema version that wrote the file
                  header_size  u32  HEADER_SIZE
                  fb_offset    u64  start of the FlatBuffer (schema.fbs)
                  fb_size      u64
                  data_offset  u64  start of the data segment, a multiple of ALIGN
                  data_size    u64
                  fb_sha256    32s
                  data_sha256  32s
                  (zero padding to HEADER_SIZE)
    fb_offset   FlatBuffer
    data_offset tensor bytes, each extent ALIGN-aligned, mmapped on load
"""
from __future__ import annotations

import struct
from dataclasses import dataclass

from ..errors import ProgramFormatError

MAGIC = b"OSTINATO"
SCHEMA_VERSION = 1
HEADER_SIZE = 128
ALIGN = 64
_STRUCT = struct.Struct("<8sIIQQQQ32s32s")


class NotAProgramError(ProgramFormatError):
    """The file does not start with ostinato's magic bytes."""


class SchemaVersionError(ProgramFormatError):
    """The file was written by a newer schema than this ostinato reads."""


class TruncatedError(ProgramFormatError):
    """The file is shorter than its header says."""


class ChecksumError(ProgramFormatError):
    """A segment's sha256 does not match the header (``segment`` names which)."""

    def __init__(self, segment: str, path: str):
        self.segment = segment
        super().__init__(f"{path}: checksum mismatch in the {segment} segment; the file is damaged "
                         "(re-copy or re-export it)")


class LayoutError(ProgramFormatError):
    """Offsets, sizes or tensor extents point outside the file or its data segment."""


class InconsistentGraphError(ProgramFormatError):
    """The decoded graph is malformed or fails the IR verifier."""


@dataclass(frozen=True)
class Header:
    schema: int
    fb_offset: int
    fb_size: int
    data_offset: int
    data_size: int
    fb_sha256: bytes
    data_sha256: bytes

    def pack(self) -> bytes:
        raw = _STRUCT.pack(MAGIC, self.schema, HEADER_SIZE, self.fb_offset, self.fb_size, self.data_offset,
                           self.data_size, self.fb_sha256, self.data_sha256)
        return raw + b"\0" * (HEADER_SIZE - len(raw))


def align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


def parse_header(raw: bytes, file_size: int, path: str) -> Header:
    """Check the header against the file's size; raise the ProgramFormatError that says what is wrong."""
    if len(raw) < len(MAGIC) or raw[:len(MAGIC)] != MAGIC:
        raise NotAProgramError(f"{path}: not an ostinato program (no {MAGIC.decode()} magic at offset 0)")
    if len(raw) < HEADER_SIZE:
        raise TruncatedError(f"{path}: truncated: {file_size} bytes, shorter than the {HEADER_SIZE}-byte header")
    magic, schema, hsize, fbo, fbs, do, ds, fbh, dh = _STRUCT.unpack_from(raw)
    if schema > SCHEMA_VERSION:
        raise SchemaVersionError(f"{path}: written by schema v{schema}; this ostinato reads up to "
                                 f"v{SCHEMA_VERSION}; upgrade ostinato to load it")
    if schema < 1 or hsize != HEADER_SIZE:
        raise LayoutError(f"{path}: header declares schema v{schema} with a {hsize}-byte header; "
                          f"expected v1..v{SCHEMA_VERSION} with {HEADER_SIZE} bytes")
    end = max(fbo + fbs, do + ds)
    if end > file_size:
        raise TruncatedError(f"{path}: truncated: the header places segments up to byte {end}, "
                             f"the file has {file_size}")
    if fbo < HEADER_SIZE or fbs < 8 or do % ALIGN or do < fbo + fbs:
        raise LayoutError(f"{path}: segment offsets out of range (FlatBuffer {fbo}+{fbs}, data {do}+{ds})")
    return Header(schema, fbo, fbs, do, ds, fbh, dh)
