""".ost file → Program. Every read is bounded: a damaged or hostile file raises ProgramFormatError.

The FlatBuffer is read into memory (it is small); the data segment is mmapped copy-on-write and the
weight tensors are views into the mapping, so no weight byte is copied. The generated FlatBuffers
accessors do no bounds checking, so every vector length is checked against the buffer and a budget
bounds the total number of decoded objects (shared sub-tables cannot blow up decoding).
"""
from __future__ import annotations

import atexit
import hashlib
import json
import logging
import mmap
import os
import time
from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch.utils import _pytree as pytree

from ..errors import OstinatoError, ProgramFormatError
from ..ir import Graph, Node, ScalarMeta, SymbolRange, SymDim, TensorMeta, Value, verify
from ..ir.fallback import require_fallback_ops
from ..ir.types import DTYPES_BY_NAME
from .fb.ArgKind import ArgKind
from .fb.InputKind import InputKind
from .fb.Role import Role
from .fb.ScalarKind import ScalarKind
from .fb.TensorRole import TensorRole
from .ir_cache import (cached_decode, data_verified, mark_data_verified, mark_shapes_verified, racy_wait_ns,
                       racy_window_ns, shapes_verified, store_decoded)
from .format import (ALIGN, HEADER_SIZE, ChecksumError, Header, InconsistentGraphError, LayoutError, data_digest,
                     file_digest, parse_header)
from .program import InputSlot, Program

log = logging.getLogger("ostinato")

ROLES = {Role.Constant: "constant", Role.Input: "input", Role.State: "state", Role.Temp: "temp"}
SCALARS = {ScalarKind.Int: int, ScalarKind.Float: float, ScalarKind.Bool: bool}
SLOT_KINDS = {InputKind.Tensor: "tensor", InputKind.Scalar: "scalar", InputKind.Constant: "constant"}
MAX_ARG_DEPTH = 32


class _Decoder:
    def __init__(self, buf: bytes, path: str):
        self.buf = buf
        self.path = path
        self.budget = max(64, len(buf) // 2)  # objects decoded; each needs >= 2 bytes unless shared

    def bad(self, what: str) -> InconsistentGraphError:
        return InconsistentGraphError(f"{self.path}: malformed program: {what}")

    def spend(self, n: int) -> None:
        self.budget -= n
        if self.budget < 0:
            raise self.bad("more objects than the file can hold (shared or cyclic tables)")

    def vec(self, length: Callable[[], int], get: Callable[[int], Any], what: str) -> list:
        n = length()
        if n < 0 or n * 4 > len(self.buf):
            raise self.bad(f"{what}: vector of {n} elements in a {len(self.buf)}-byte FlatBuffer")
        self.spend(n)
        return [get(j) for j in range(n)]

    def text(self, raw: bytes | None, what: str = "string", limit: int = 1 << 20) -> str:
        if raw is None:
            return ""
        if len(raw) > limit:
            raise self.bad(f"{what} of {len(raw)} bytes")
        return raw.decode("utf-8")

    # -- arguments ------------------------------------------------------------------------------
    def arg(self, a, values: dict[int, Value], depth: int = 0) -> Any:
        if a is None:
            raise self.bad("missing argument table")
        if depth > MAX_ARG_DEPTH:
            raise self.bad(f"arguments nested deeper than {MAX_ARG_DEPTH}")
        self.spend(1)
        k = a.Kind()
        if k == ArgKind.None_:
            return None
        if k == ArgKind.Int:
            return int(a.I())
        if k == ArgKind.Float:
            return float(a.F())
        if k == ArgKind.Bool:
            return bool(a.I())
        if k == ArgKind.Str:
            return self.text(a.S())
        if k == ArgKind.Value:
            v = values.get(a.I())
            if v is None:
                raise self.bad(f"argument refers to unknown value id {a.I()}")
            return v
        if k in (ArgKind.List, ArgKind.Tuple):
            items = self.vec(a.ItemsLength, lambda j: self.arg(a.Items(j), values, depth + 1), "list argument")
            return items if k == ArgKind.List else tuple(items)
        if k == ArgKind.Dict:
            items = self.vec(a.ItemsLength, a.Items, "dict argument")
            return {self.text(it.Key(), "key", 256): self.arg(it, values, depth + 1) for it in items}
        if k == ArgKind.DType:
            name = self.text(a.S())
            if name not in DTYPES_BY_NAME:
                raise self.bad(f"unknown dtype {name!r}")
            return DTYPES_BY_NAME[name]
        if k == ArgKind.Device:
            return torch.device(self.text(a.S(), limit=64))
        if k in (ArgKind.Layout, ArgKind.MemoryFormat):
            name = self.text(a.S(), limit=64)
            obj = getattr(torch, name, None) if name.isidentifier() else None
            want = torch.layout if k == ArgKind.Layout else torch.memory_format
            if not isinstance(obj, want):
                raise self.bad(f"unknown {want.__name__} {name!r}")
            return obj
        raise self.bad(f"unknown argument kind {k}")

    def dim(self, d) -> int | SymDim:
        self.spend(1)
        expr = self.text(d.Expr(), "dim", limit=1024)
        if expr:
            return SymDim(expr)
        v = d.Value()
        if v < 0:
            raise self.bad(f"negative dimension {v}")
        return int(v)

    # -- the program ----------------------------------------------------------------------------
    def program(self, fp=None) -> tuple[Graph, dict, list[tuple[str, int, str, list[int], int, int]]]:
        if fp is None:
            # Imported here: a load served by the decoded-program cache never needs the FlatBuffers runtime.
            from .fb.Program import Program as FBProgram
            if not FBProgram.ProgramBufferHasIdentifier(self.buf, 0):
                raise self.bad("the FlatBuffer lacks the OSTP identifier")
            fp = FBProgram.GetRootAs(self.buf, 0)
        g = Graph()
        for s in self.vec(fp.SymbolsLength, fp.Symbols, "symbols"):
            name = self.text(s.Name(), "symbol", 64)
            if not name.isidentifier() or name in g.symbols:
                raise self.bad(f"invalid or repeated symbol name {name!r}")
            hi = s.Max()
            g.symbols[name] = SymbolRange(name, int(s.Min()), None if hi < 0 else int(hi),
                                          self.text(s.Label(), "label", 256))
        hints = {}
        for s in self.vec(fp.SymbolsLength, fp.Symbols, "symbols"):
            if s.Hint() >= 0:
                hints[self.text(s.Name())] = int(s.Hint())
        values: dict[int, Value] = {}
        for fv in self.vec(fp.ValuesLength, fp.Values, "values"):
            vid = fv.Id()
            if vid in values or vid < 0:
                raise self.bad(f"value id {vid} repeated or negative")
            kind = fv.Kind()
            if kind == ScalarKind.Tensor:
                dtype = self.text(fv.Dtype(), "dtype", 16)
                if dtype not in DTYPES_BY_NAME:
                    raise self.bad(f"value {vid} has unknown dtype {dtype!r}")
                shape = tuple(self.vec(fv.ShapeLength, lambda j: self.dim(fv.Shape(j)), "shape"))
                meta = TensorMeta(DTYPES_BY_NAME[dtype], shape)
            elif kind in SCALARS:
                expr = self.text(fv.Expr(), "expr", 1024)
                meta = ScalarMeta(SCALARS[kind], SymDim(expr) if expr else None)
            else:
                raise self.bad(f"value {vid} has unknown kind {kind}")
            role = ROLES.get(fv.Role())
            if role is None:
                raise self.bad(f"value {vid} has unknown role {fv.Role()}")
            values[vid] = Value(vid, self.text(fv.Name(), "name", 4096), meta, role)
        g._next_id = max(values, default=-1) + 1

        def by_ids(length, get, role, what):
            out = []
            for vid in self.vec(length, get, what):
                v = values.get(vid)
                if v is None or v.role != role:
                    raise self.bad(f"{what} entry {vid} is not a {role} value")
                out.append(v)
            return out

        g.constants = by_ids(fp.ConstantsLength, fp.Constants, "constant", "constants")
        g.inputs = by_ids(fp.InputsLength, fp.Inputs, "input", "inputs")
        g.state = by_ids(fp.StateLength, fp.State, "state", "state")
        for fn in self.vec(fp.NodesLength, fp.Nodes, "nodes"):
            node = Node(self.text(fn.Op(), "op", 256), (), {}, self.text(fn.Name(), "name", 4096),
                        self.text(fn.Source(), "source", 1 << 16))
            node.args = tuple(self.vec(fn.ArgsLength, lambda j: self.arg(fn.Args(j), values), "args"))
            kw = self.vec(fn.KwargsLength, fn.Kwargs, "kwargs")
            node.kwargs = {self.text(a.Key(), "key", 256): self.arg(a, values) for a in kw}
            for vid in self.vec(fn.OutputsLength, fn.Outputs, "outputs"):
                if vid == -1:
                    node.outputs.append(None)
                    continue
                v = values.get(vid)
                if v is None or v.role != "temp" or v.producer is not None:
                    raise self.bad(f"node {node.name} outputs value {vid}, which is unknown, not a temp, "
                                   "or produced twice")
                v.producer = node
                node.outputs.append(v)
            g.nodes.append(node)
        orphans = [v.name for v in values.values() if v.role == "temp" and v.producer is None]
        if orphans:
            raise self.bad(f"temporaries no node produces: {orphans[:5]}")
        g.outputs = self.vec(fp.OutputsLength, lambda j: self.arg(fp.Outputs(j), values), "outputs")
        for m in self.vec(fp.MutationsLength, fp.Mutations, "mutations"):
            t, n = values.get(m.Target()), values.get(m.Value())
            if t is None or n is None:
                raise self.bad("mutation refers to an unknown value")
            g.mutations.append((t, n))
        slots = []
        for s in self.vec(fp.InputSlotsLength, fp.InputSlots, "input slots"):
            kind = SLOT_KINDS.get(s.Kind())
            if kind is None:
                raise self.bad(f"input slot has unknown kind {s.Kind()}")
            if kind == "constant":
                const = s.Constant()
                slots.append(InputSlot(self.text(s.Name()), kind, -1,
                                       None if const is None else self.arg(const, {})))
            else:
                idx = s.Index()
                if not 0 <= idx < len(g.inputs):
                    raise self.bad(f"input slot {self.text(s.Name())!r} points at input {idx} of {len(g.inputs)}")
                want = "tensor" if isinstance(g.inputs[idx].meta, TensorMeta) else "scalar"
                if want != kind:
                    raise self.bad(f"input slot {self.text(s.Name())!r} is a {kind} but input {idx} is a {want}")
                slots.append(InputSlot(self.text(s.Name()), kind, idx))
        tensors = []
        for t in self.vec(fp.TensorsLength, fp.Tensors, "tensors"):
            shape = self.vec(t.ShapeLength, t.Shape, "tensor shape")
            tensors.append((self.text(t.Name(), "name", 4096), t.Role(), self.text(t.Dtype(), "dtype", 16),
                            [int(d) for d in shape], int(t.Offset()), int(t.Nbytes())))
        extra = {
            "hints": hints, "slots": slots,
            "in_spec": self.text(fp.InSpec(), "in_spec", 1 << 20),
            "out_spec": self.text(fp.OutSpec(), "out_spec", 1 << 20),
            "info": json.loads(self.text(fp.Info(), "info", 1 << 20) or "{}"),
            "schema_version": fp.SchemaVersion(),
        }
        methods = {}
        for m in self.vec(fp.MethodsLength, fp.Methods, "methods"):
            name = self.text(m.Name(), "method name", 256)
            sub = m.Program()
            if not name.isidentifier() or name in methods or sub is None:
                raise self.bad(f"method {name!r}: invalid or repeated name, or no program")
            # Methods are one level deep and own no tensors (a table pointing back at the root is refused here).
            if sub.MethodsLength() or sub.TensorsLength():
                raise self.bad(f"method {name!r} holds tensors or methods of its own")
            methods[name] = self.program(sub)[:2]
        if methods:
            extra["methods"] = methods
        return g, extra, tensors


def _tensors_from(mapped: mmap.mmap, data_offset: int, data_size: int, entries, graph: Graph, path: str,
                  method_graphs: tuple[Graph, ...] = ()):
    weights: dict[str, torch.Tensor] = {}
    state: dict[str, torch.Tensor] = {}
    # One storage over the whole data segment, every tensor a view of it: tensors laid out one after
    # another are then adjacent in one storage, which is what packed weights are (ir.fused_ops._packed_rows),
    # so the runtime's packing of sibling projections copies nothing for a loaded program.
    segment = torch.frombuffer(mapped, dtype=torch.uint8, count=data_size, offset=data_offset) \
        if mapped is not None and data_size else None
    for name, role, dtype_name, shape, offset, nbytes in entries:
        dtype = DTYPES_BY_NAME.get(dtype_name)
        if dtype is None or role not in (TensorRole.Weight, TensorRole.StateInit):
            raise LayoutError(f"{path}: tensor {name!r} has unknown dtype {dtype_name!r} or role {role}")
        if any(d < 0 for d in shape) or len(shape) > 16:
            raise LayoutError(f"{path}: tensor {name!r} has invalid shape {shape}")
        numel = 1
        for d in shape:
            numel *= d
        itemsize = torch.empty((), dtype=dtype).element_size()
        if numel * itemsize != nbytes or offset % ALIGN or offset + nbytes > data_size:
            raise LayoutError(f"{path}: tensor {name!r} ({dtype_name}{shape}, {nbytes} bytes at {offset}) lies "
                              f"outside the {data_size}-byte data segment or disagrees with its shape")
        if numel == 0:
            t = torch.empty(shape, dtype=dtype)
        else:
            t = segment[offset:offset + nbytes].view(dtype).view(shape)
        (weights if role == TensorRole.Weight else state)[name] = t
    want_w = {v.name for g in (graph, *method_graphs) for v in g.constants}
    want_s = {v.name for g in (graph, *method_graphs) for v in g.state}
    if set(weights) != want_w or set(state) != want_s:
        raise InconsistentGraphError(f"{path}: tensors in the data segment do not match the graph's constants "
                                     f"and state (missing {sorted((want_w - set(weights)) | (want_s - set(state)))[:5]})")
    for v in [v for g in (graph, *method_graphs) for v in g.constants + g.state]:
        t = (weights if v.role == "constant" else state)[v.name]
        meta = v.meta
        if not isinstance(meta, TensorMeta) or not meta.is_static or tuple(t.shape) != meta.shape \
                or t.dtype != meta.dtype:
            raise InconsistentGraphError(f"{path}: tensor {v.name!r} is {t.dtype}{list(t.shape)} but the graph "
                                         f"declares {meta}")
    return weights, state


# Called with each loaded program's graph once its FlatBuffer is decoded (its sha256 checked), before the
# weights are hashed and before the graph is verified: a hook may only read it, and must not trust it
# (runtime/executable.py registers the start of CUDA's library warm-up). A hook that raises is logged.
DECODED_HOOKS: list = []


def load(path: str | os.PathLike, verify_checksums: bool = True, check_shapes: bool | None = None) -> Program:
    """Load a program file.

    Always: header, layout and tensor extents checked, the FlatBuffer decoded with bounds, the IR's
    structural rules verified. With ``verify_checksums`` (the default) also: sha256 of both segments.
    With ``check_shapes`` (default: as ``verify_checksums``): every op's output shape and dtype
    re-derived on fake tensors.
    """
    if check_shapes is None:
        check_shapes = verify_checksums
    path = os.fspath(path)
    with open(path, "rb") as f:
        st = os.fstat(f.fileno())
        size = st.st_size
        header = parse_header(f.read(HEADER_SIZE), size, path)
        f.seek(header.fb_offset)
        fb = f.read(header.fb_size)
        if len(fb) != header.fb_size:
            raise LayoutError(f"{path}: could not read the {header.fb_size}-byte FlatBuffer")
        if verify_checksums and hashlib.sha256(fb).digest() != header.fb_sha256:
            raise ChecksumError("FlatBuffer", path)
        mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY) if size else None
    decoded = cached_decode(header.fb_sha256)
    try:
        graph, extra, entries = decoded if decoded is not None else _Decoder(fb, path).program()
        in_spec = pytree.treespec_loads(extra["in_spec"])
        out_spec = pytree.treespec_loads(extra["out_spec"])
    except ProgramFormatError:
        raise
    except Exception as e:  # noqa: BLE001 - any failure to decode untrusted bytes means a malformed file
        raise InconsistentGraphError(f"{path}: malformed program: {type(e).__name__}: {e}") from None
    if out_spec.num_leaves != len(graph.outputs) or in_spec.num_leaves != len(extra["slots"]):
        raise InconsistentGraphError(f"{path}: the pytree specs do not match the graph's inputs and outputs")
    for hook in DECODED_HOOKS:      # (the CUDA libraries' warm-up starts here: it overlaps the hash below)
        try:
            hook(graph)
        except Exception as e:  # noqa: BLE001 - a hook is an optimization; the load goes on
            log.debug("ostinato: a load hook failed: %s: %s", type(e).__name__, e)
    # The weights' sha256 once per unchanged file on this machine (ir_cache.data_verified): the FlatBuffer's
    # is checked on every load, the data segment's again only when the file's identity changed.
    hash_s = 0.0
    if verify_checksums and not data_verified(st, header.data_sha256):
        t0 = time.perf_counter()
        checked_at = time.time_ns()     # before the hash reads a byte (ir_cache.mark_data_verified)
        data_view = memoryview(mapped)[header.data_offset:header.data_offset + header.data_size]
        ok = data_digest(data_view, header.schema) == header.data_sha256   # schema 2: on every core
        data_view.release()
        if not ok:
            raise ChecksumError("data", path)
        mark_data_verified(st, header.data_sha256, checked_at)
        hash_s = time.perf_counter() - t0
    methods = extra.get("methods", {})
    weights, state = _tensors_from(mapped, header.data_offset, header.data_size, entries, graph, path,
                                   tuple(g for g, _ in methods.values()))
    hints = extra["hints"]
    require_fallback_ops(graph, path)   # ops run through eager torch must be registered in this process
    for m_graph, _ in methods.values():
        require_fallback_ops(m_graph, path)
    # The structural rules always; re-deriving every shape (fake tensors: ~1 s of torch imports in a
    # fresh process) when the caller asks for verification, once per FlatBuffer: bytes whose sha256
    # was just checked and whose program passed before (ir_cache.shapes_verified) are not re-derived.
    derive = check_shapes and not (verify_checksums and shapes_verified(header.fb_sha256))
    try:
        verify(graph, check_shapes=derive, hints=hints)
        for name, (m_graph, m_extra) in methods.items():
            verify(m_graph, check_shapes=derive, hints=m_extra["hints"])
    except Exception as e:  # noqa: BLE001 - GraphError, or a decoder error on a hostile expression
        raise InconsistentGraphError(f"{path}: the graph fails verification: {e}") from None
    if derive and verify_checksums:
        mark_shapes_verified(header.fb_sha256)
    # The decoded-program cache is keyed by the header's hash: only bytes proven to have that hash may
    # be cached under it (verify=False skipped the check; damaged bytes cached there would be served to
    # every later load of the good file, on this machine and through a shared tier on others).
    if decoded is None and not methods and (verify_checksums or hashlib.sha256(fb).digest() == header.fb_sha256):
        store_decoded(header.fb_sha256, graph, extra, entries)
    graph.assign_slots()
    info = extra["info"] if isinstance(extra["info"], dict) else {}
    prog = Program(graph, weights, state, in_spec, out_spec, extra["slots"], hints, info)
    prog.source = FileInfo(path, size, header)
    prog.timings["load_data_hash"] = hash_s      # 0.0: recorded as checked already, or not asked for
    for name, (m_graph, m_extra) in methods.items():
        m_graph.assign_slots()
        try:
            m_in, m_out = pytree.treespec_loads(m_extra["in_spec"]), pytree.treespec_loads(m_extra["out_spec"])
        except Exception as e:  # noqa: BLE001 - untrusted bytes
            raise InconsistentGraphError(f"{path}: method {name!r}: malformed pytree spec: {e}") from None
        if m_out.num_leaves != len(m_graph.outputs) or m_in.num_leaves != len(m_extra["slots"]):
            raise InconsistentGraphError(f"{path}: method {name!r}: the pytree specs do not match its graph")
        m_info = m_extra["info"] if isinstance(m_extra["info"], dict) else {}
        prog.methods[name] = Program(m_graph, weights, state, m_in, m_out, m_extra["slots"], m_extra["hints"],
                                     m_info)
    return prog


# Files this process saved, checked at its exit as a load checks them (program/ir_cache: a file is recorded
# only once it changed longer ago than the file clock's tick), so that the first load of a saved file in
# another process does not hash its weights (0.14-0.27 s for a 2.5-4 GB program on the lent GPU machines'
# 16 cores). A file that would need a wait longer than MAX_EXIT_WAIT_S (the whole-second clocks of some
# network file systems) is left to its first load, and so are the files past MAX_EXIT_CHECK_BYTES of data
# segments in all (an exit must not hash for minutes). OSTINATO_CHECK_SAVED=0 turns the check off.
# The file is read with pread, not mapped: a file cut short meanwhile is a mismatch, not a SIGBUS.
MAX_EXIT_WAIT_S = 0.5
MAX_EXIT_CHECK_BYTES = 32 << 30
_saved: dict[str, tuple[tuple, int]] = {}   # path -> (its identity after the save, time.monotonic_ns() then)
_exit_hook = False


def check_saved_enabled() -> bool:
    return os.environ.get("OSTINATO_CHECK_SAVED", "1") != "0"


def _identity(st: os.stat_result) -> tuple:
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns


def note_saved(path: str) -> None:
    """Check ``path`` (a program file just written) at this process's exit: see ``check_saved``."""
    global _exit_hook
    if not check_saved_enabled():
        return
    path = os.path.abspath(path)
    st = os.stat(path)
    if not _exit_hook:
        atexit.register(check_saved)
        _exit_hook = True
    _saved[path] = (_identity(st), time.monotonic_ns())


# A forked child that exits normally would check its parent's files again (multiprocessing's fork children
# end with os._exit and never run the hook; spawned ones start empty).
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_saved.clear)


def check_saved() -> int:
    """Hash the data segments of the files this process saved (once their racy window passed) and record
    those that match their header, as a ``load`` does; returns how many were recorded. Never raises: a
    file that is gone, changed or damaged is left to its next load; an interrupt (Ctrl-C) ends the check."""
    recorded, budget, t0 = 0, MAX_EXIT_CHECK_BYTES, time.perf_counter()
    while True:
        try:
            path, noted = _saved.popitem()
        except KeyError:
            break
        try:
            done, hashed = _record_checked(path, noted, budget)
            recorded += done
            budget -= hashed
        except KeyboardInterrupt:
            _saved.clear()
            break
        except Exception as e:  # noqa: BLE001 - an optimization of later loads only
            log.debug("ostinato: %s not recorded as checked: %s: %s", path, type(e).__name__, e)
    if recorded:
        log.debug("ostinato: %d saved file(s) recorded as checked in %.2f s", recorded, time.perf_counter() - t0)
    return recorded


def _record_checked(path: str, noted: tuple[tuple, int], budget: int) -> tuple[bool, int]:
    """(recorded, bytes hashed) for one saved file, hashing at most ``budget`` bytes. ``noted``: the file's
    identity after its save, and the monotonic clock then."""
    identity, saved_at = noted
    with open(path, "rb") as f:
        st = os.fstat(f.fileno())
        if _identity(st) != identity:
            return False, 0     # changed (or replaced) since this process saved it: the next load checks it
        header = parse_header(f.read(HEADER_SIZE), st.st_size, path)
        if not header.data_size or header.data_size > budget or data_verified(st, header.data_sha256):
            return False, 0
        # the window counted on the file's times and, in case the file system's clock differs from this
        # machine's (a network file system), on this process's own clock since the save
        wait = max(racy_wait_ns(st), saved_at + racy_window_ns(st) - time.monotonic_ns())
        if wait > MAX_EXIT_WAIT_S * 1e9:
            return False, 0
        time.sleep(wait * 1e-9)
        checked_at = time.time_ns()
        digest = file_digest(f.fileno(), header.data_offset, header.data_size, header.schema)
    recorded = digest == header.data_sha256 and mark_data_verified(st, header.data_sha256, checked_at)
    return recorded, header.data_size


@dataclass(frozen=True)
class FileInfo:
    """Where a loaded Program came from: the file, its size and its header."""

    path: str
    size: int
    header: "Header"


def read_header(path: str | os.PathLike) -> tuple["Header", int]:
    """The checked header of a program file and the file's size, without reading the rest."""
    path = os.fspath(path)
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        return parse_header(f.read(HEADER_SIZE), size, path), size


def cache_decoded(path: str | os.PathLike, check_shapes: bool = True) -> None:
    """Decode a file's FlatBuffer and keep it in the decoded-program cache (``save`` calls this, so the
    first load of a file just written is already warm). With ``check_shapes``, also re-derive every
    shape of the decoded program, as ``load(verify=True)`` would on these bytes, and record that it
    passed (``shapes-verified``), so the first ``verify=True`` load skips it; a program that fails is
    reported in a warning (such a load would refuse it). Never raises: the file is saved either way."""
    try:
        header, _ = read_header(path)
        with open(path, "rb") as f:
            f.seek(header.fb_offset)
            fb = f.read(header.fb_size)
        graph, extra, entries = _Decoder(fb, os.fspath(path)).program()
        if extra.get("methods"):
            return   # the decoded-program cache's JSON holds one graph
        store_decoded(header.fb_sha256, graph, extra, entries)
    except OstinatoError as e:   # what load would raise too: say so now, not on the machine that loads it
        log.warning("ostinato: %s: the saved program cannot be loaded back: %s: %s", path, type(e).__name__, e)
        return
    except Exception as e:  # noqa: BLE001 - a cache warm-up failing costs the first load some time only
        log.debug("ostinato: %s: decoded program not cached at save: %s: %s", path, type(e).__name__, e)
        return
    if not check_shapes:
        return
    try:
        verify(graph, check_shapes=True, hints=extra["hints"])
    except Exception as e:  # noqa: BLE001 - reported: load(verify=True) of this file will refuse it
        log.warning("ostinato: %s: the saved program fails shape verification, so load(verify=True) will "
                    "refuse it: %s", path, e)
        return
    mark_shapes_verified(header.fb_sha256)
