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
                  data_sha256  32s  schema 1: sha256 of the data segment; schema 2: sha256 of the sha256s
                                    of its DATA_CHUNK_BYTES chunks, concatenated (``data_digest``)
                  (zero padding to HEADER_SIZE)
    fb_offset   FlatBuffer
    data_offset tensor bytes, each extent ALIGN-aligned, mmapped on load

Schema 2 changed only the data segment's hash, so that a reader checks it on all its cores: one core
hashes about 1.8 GB/s, 1.4 s for a 1B-parameter model's bf16 weights (docs/startup.md). The FlatBuffer is
the same; this ostinato reads schema 1 files as before, and older ones refuse schema 2 files by name.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import errno
import hashlib
import mmap
import os
import struct
import sys
import threading
from dataclasses import dataclass

from ..errors import ProgramFormatError

MAGIC = b"OSTINATO"
SCHEMA_VERSION = 2
HEADER_SIZE = 128
ALIGN = 64
# Schema 2's data hash: the segment in chunks of this many bytes (the last one shorter), each hashed on
# its own. Part of the format: changing it is a new schema version.
DATA_CHUNK_BYTES = 16 << 20
# Threads a reader hashes chunks on (hashlib releases the GIL while it hashes).
MAX_HASH_THREADS = 16
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


class DataHasher:
    """The header's ``data_sha256`` of bytes given in order (``update``), as ``data_digest`` computes it
    for ``schema``: the writer streams the segment through one."""

    def __init__(self, schema: int) -> None:
        self.schema = schema
        self.whole = hashlib.sha256()      # schema 1: the bytes; schema 2: the full chunks' digests
        self.chunk = hashlib.sha256()      # schema 2: the chunk being filled, ``room`` bytes short of full
        self.room = DATA_CHUNK_BYTES

    def update(self, data) -> None:
        if self.schema < 2:
            self.whole.update(data)
            return
        view = memoryview(data).cast("B")
        while len(view):
            part = view[:self.room]
            self.chunk.update(part)
            self.room -= len(part)
            view = view[len(part):]
            if self.room == 0:
                self.whole.update(self.chunk.digest())
                self.chunk, self.room = hashlib.sha256(), DATA_CHUNK_BYTES

    def digest(self) -> bytes:
        whole = self.whole.copy()
        if self.schema >= 2 and self.room < DATA_CHUNK_BYTES:     # the last, shorter chunk
            whole.update(self.chunk.digest())
        return whole.digest()


def data_digest(data, schema: int, threads: int | None = None) -> bytes:
    """The header's ``data_sha256`` of a whole data segment (a buffer) for ``schema``. Schema 2's chunks
    are hashed on up to ``threads`` threads (default: the cores, at most MAX_HASH_THREADS)."""
    view = memoryview(data).cast("B")
    base = _address(view)

    def update(h, start: int, n: int) -> None:
        with view[start:start + n] as part:
            if base is not None:
                populate(base + start, n)
            h.update(part)

    return _segment_digest(len(view), schema, update, threads)


class _ShortRead(Exception):
    pass


def file_digest(fd: int, offset: int, size: int, schema: int, threads: int | None = None) -> bytes | None:
    """``data_digest`` of the ``size`` bytes at ``offset`` of the open file ``fd``, read with ``os.pread``;
    None when the file ends before them (cut short while it was read: a mapping would fault, SIGBUS)."""
    def update(h, start: int, n: int) -> None:
        part = os.pread(fd, n, offset + start)
        if len(part) != n:
            raise _ShortRead
        h.update(part)

    try:
        return _segment_digest(size, schema, update, threads)
    except _ShortRead:
        return None


def _segment_digest(size: int, schema: int, update, threads: int | None) -> bytes:
    """The format's data hash of a ``size``-byte segment whose bytes ``update(h, start, n)`` feeds to the
    hashlib object ``h``: schema 1 the sha256 of the bytes; schema 2 the sha256 of the DATA_CHUNK_BYTES
    chunks' sha256s, the chunks hashed on threads."""
    starts = range(0, size, DATA_CHUNK_BYTES)
    if schema < 2:
        h = hashlib.sha256()
        for start in starts:
            update(h, start, min(DATA_CHUNK_BYTES, size - start))
        return h.digest()

    def one(start: int) -> bytes:
        h = hashlib.sha256()
        update(h, start, min(DATA_CHUNK_BYTES, size - start))
        return h.digest()

    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    n = max(1, min(len(starts), threads or min(cores, MAX_HASH_THREADS)))
    return hashlib.sha256(b"".join(_map_on_threads(one, starts, n))).digest()


def _map_on_threads(fn, items, n: int) -> list:
    """``[fn(x) for x in items]`` on ``n`` threads, the caller's among them. Plain threads, not
    concurrent.futures: an executor refuses work once the interpreter began shutting down, and
    reader.check_saved hashes at exit (where Python 3.12.0-3.12.2 refuse new threads too: the caller then
    works alone). The first exception (a KeyboardInterrupt in the caller's share included) stops every
    thread after its current item and is raised here."""
    if n <= 1:
        return [fn(x) for x in items]
    results: list = [None] * len(items)
    errors: list[BaseException] = []
    todo = iter(range(len(items)))
    lock = threading.Lock()
    halt = threading.Event()

    def work() -> None:
        while not errors and not halt.is_set():
            with lock:
                i = next(todo, None)
            if i is None:
                return
            try:
                results[i] = fn(items[i])
            except BaseException as e:  # noqa: BLE001 - re-raised in the caller's thread
                errors.append(e)

    threads = []
    for _ in range(n - 1):
        t = threading.Thread(target=work, name="ostinato-sha256", daemon=True)
        try:
            t.start()
        except RuntimeError:    # the interpreter is finalizing: the caller hashes alone
            break
        threads.append(t)
    try:
        work()
    finally:
        halt.set()
        for t in threads:
            t.join()
    if errors:
        raise errors[0]
    return results


# Page tables of a mapping filled in one call per chunk before it is read (the data hash here, the CUDA
# upload's copies), rather than one fault per page: False turns it off (bench/program_load.py compares).
POPULATE = True
MADV_POPULATE_READ = 22
_madvise = None


def populate(address: int, nbytes: int) -> bool:
    """Ask the kernel to map the pages of ``[address, address + nbytes)`` now, read-only, in one call
    (a file mapping's pages come from the page cache, read from disk where missing). Whether it did: only
    Linux 5.14 and later can; anything else (another OS, an older kernel, memory it refuses) leaves the
    pages to fault in one by one as the copies touch them, as before."""
    global _madvise
    if not POPULATE or not sys.platform.startswith("linux") or nbytes <= 0:
        return False
    if _madvise is None:
        try:
            libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
            _madvise = libc.madvise
            _madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
            _madvise.restype = ctypes.c_int
        except (OSError, AttributeError):
            _madvise = False
    if not _madvise:
        return False
    page = mmap.PAGESIZE
    start = address - address % page
    if _madvise(start, nbytes + (address - start), MADV_POPULATE_READ) == 0:
        return True
    if ctypes.get_errno() == errno.EINVAL:      # a kernel without MADV_POPULATE_READ: not asked again
        _madvise = False
    return False


def _address(view: memoryview) -> int | None:
    """The address of a writable buffer's first byte (a copy-on-write mapping's, as load makes); None for
    read-only buffers (bytes; a read-only mapping, whose pages then fault in as they are read)."""
    if view.readonly or not len(view):
        return None
    return ctypes.addressof(ctypes.c_char.from_buffer(view))
