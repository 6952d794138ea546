"""Program → .ost bytes (header, FlatBuffer, aligned data segment), written atomically."""
from __future__ import annotations

import hashlib
import io
import json
import os
import tempfile
from typing import Any

import flatbuffers
import torch
from torch.utils import _pytree as pytree

from ..errors import OstinatoError
from ..ir import Value, dtype_name
from ..ir.types import ScalarMeta, SymDim, TensorMeta
from .fb import Arg as A, Dim as D, InputSlot as IS, Method as MT, Mutation as M, Node as N, Program as P
from .fb import Symbol as S, TensorData as TD, Value as V
from .fb.ArgKind import ArgKind
from .fb.InputKind import InputKind
from .fb.Role import Role
from .fb.ScalarKind import ScalarKind
from .fb.TensorRole import TensorRole
from .format import HEADER_SIZE, SCHEMA_VERSION, DataHasher, Header, align
from .program import Program

ROLE = {"constant": Role.Constant, "input": Role.Input, "state": Role.State, "temp": Role.Temp}
SCALAR = {int: ScalarKind.Int, float: ScalarKind.Float, bool: ScalarKind.Bool}
SLOT_KIND = {"tensor": InputKind.Tensor, "scalar": InputKind.Scalar, "constant": InputKind.Constant}


class _Writer:
    def __init__(self, where: str):
        self.b = flatbuffers.Builder(4096)
        self.where = where

    def strings(self, s: str | None):
        return None if s is None else self.b.CreateString(s)

    def vector(self, start, offsets: list[int]) -> int:
        start(self.b, len(offsets))
        for o in reversed(offsets):
            self.b.PrependUOffsetTRelative(o)
        return self.b.EndVector()

    def scalars(self, start, values: list[int], prepend) -> int:
        start(self.b, len(values))
        for v in reversed(values):
            prepend(v)
        return self.b.EndVector()

    # -- arguments ------------------------------------------------------------------------------
    def arg(self, a: Any, key: str | None = None) -> int:
        b = self.b
        kind, i, f, s, items = ArgKind.None_, 0, 0.0, None, None
        if a is None:
            pass
        elif isinstance(a, Value):
            kind, i = ArgKind.Value, a.id
        elif isinstance(a, bool):
            kind, i = ArgKind.Bool, int(a)
        elif isinstance(a, int):
            if not -2**63 <= a < 2**63:
                raise OstinatoError(f"{self.where}: integer {a} does not fit in 64 bits")
            kind, i = ArgKind.Int, a
        elif isinstance(a, float):
            kind, f = ArgKind.Float, a
        elif isinstance(a, str):
            kind, s = ArgKind.Str, a
        elif isinstance(a, torch.dtype):
            kind, s = ArgKind.DType, dtype_name(a)
        elif isinstance(a, torch.device):
            kind, s = ArgKind.Device, str(a)
        elif isinstance(a, torch.layout):
            kind, s = ArgKind.Layout, str(a).replace("torch.", "")
        elif isinstance(a, torch.memory_format):
            kind, s = ArgKind.MemoryFormat, str(a).replace("torch.", "")
        elif isinstance(a, (list, tuple)):
            kind = ArgKind.List if isinstance(a, list) else ArgKind.Tuple
            items = [self.arg(x) for x in a]
        elif isinstance(a, dict):
            kind = ArgKind.Dict
            for k in a:
                if not isinstance(k, str):
                    raise OstinatoError(f"{self.where}: dict constant with non-string key {k!r} cannot be saved")
            items = [self.arg(x, key=k) for k, x in a.items()]
        else:
            raise OstinatoError(f"{self.where}: a constant of type {type(a).__name__} ({a!r}) cannot be saved "
                                "in a program file")
        s_off = self.strings(s)
        k_off = self.strings(key)
        items_off = self.vector(A.ArgStartItemsVector, items) if items is not None else None
        A.ArgStart(b)
        A.ArgAddKind(b, kind)
        if i:
            A.ArgAddI(b, i)
        if f:
            A.ArgAddF(b, f)
        if s_off is not None:
            A.ArgAddS(b, s_off)
        if items_off is not None:
            A.ArgAddItems(b, items_off)
        if k_off is not None:
            A.ArgAddKey(b, k_off)
        return A.ArgEnd(b)

    # -- tables ---------------------------------------------------------------------------------
    def dim(self, d) -> int:
        expr = self.strings(str(d)) if isinstance(d, SymDim) else None
        D.DimStart(self.b)
        if isinstance(d, int):
            D.DimAddValue(self.b, d)
        else:
            D.DimAddExpr(self.b, expr)
        return D.DimEnd(self.b)

    def value(self, v: Value) -> int:
        b = self.b
        name = self.strings(v.name)
        dtype = shape = expr = None
        if isinstance(v.meta, TensorMeta):
            dtype = self.strings(dtype_name(v.meta.dtype))
            shape = self.vector(V.ValueStartShapeVector, [self.dim(d) for d in v.meta.shape])
        elif isinstance(v.meta, ScalarMeta) and v.meta.expr is not None:
            expr = self.strings(str(v.meta.expr))
        V.ValueStart(b)
        V.ValueAddId(b, v.id)
        V.ValueAddName(b, name)
        V.ValueAddRole(b, ROLE[v.role])
        V.ValueAddKind(b, ScalarKind.Tensor if isinstance(v.meta, TensorMeta) else SCALAR[v.meta.kind])
        if dtype is not None:
            V.ValueAddDtype(b, dtype)
            V.ValueAddShape(b, shape)
        if expr is not None:
            V.ValueAddExpr(b, expr)
        return V.ValueEnd(b)

    def node(self, n) -> int:
        b = self.b
        self.where = f"node {n.name} ({n.op})"
        name, op, source = self.strings(n.name), self.strings(n.op), self.strings(n.source)
        args = self.vector(N.NodeStartArgsVector, [self.arg(a) for a in n.args])
        kwargs = self.vector(N.NodeStartKwargsVector, [self.arg(a, key=k) for k, a in n.kwargs.items()])
        outs = self.scalars(N.NodeStartOutputsVector, [-1 if o is None else o.id for o in n.outputs],
                            b.PrependInt32)
        N.NodeStart(b)
        N.NodeAddName(b, name)
        N.NodeAddOp(b, op)
        N.NodeAddArgs(b, args)
        N.NodeAddKwargs(b, kwargs)
        N.NodeAddOutputs(b, outs)
        N.NodeAddSource(b, source)
        return N.NodeEnd(b)


def _as_bytes(t: torch.Tensor) -> memoryview:
    """The tensor's bytes, C-contiguous, without a copy when it already is on the CPU and contiguous."""
    flat = t.detach().cpu().contiguous().reshape(-1).view(torch.uint8)
    return memoryview(flat.numpy())


def _sibling_groups(program: Program) -> list[list[str]]:
    """The names of each ``ost.multi_linear``'s constant weights, and biases (root and methods)."""
    out = []
    for g in (program.graph, *(m.graph for m in program.methods.values())):
        for node in g.nodes:
            if node.op == "ost.multi_linear":
                out += [[v.name for v in vals] for vals in (node.args[1], node.args[2])
                        if vals and all(isinstance(v, Value) and v.role == "constant" for v in vals)]
    return out


def _layout_tensors(program: Program) -> tuple[list[tuple[str, int, torch.Tensor, int]], int]:
    """[(name, role, tensor, offset)] in the program's order, and the data segment's size. Each extent
    starts ALIGN-aligned; tied tensors (same storage and view) share one extent. The extents follow the
    program's order, except that the weights (or biases) of one ``ost.multi_linear`` are laid out one after
    another where the first of them would be: the reader's tensors are views of one mapping, so such a
    group is packed already when loaded (no padding between them: when each one's size is a multiple of
    ALIGN) and the runtime copies nothing to pack it (runtime/packing.py)."""
    named = [(n, TensorRole.Weight, t) for n, t in program.weights.items()]
    named += [(n, TensorRole.StateInit, t) for n, t in program.state_init.items()]

    def key(t):
        return (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), tuple(t.stride()), t.dtype) \
            if t.numel() else None

    # Layout order: a group moves next to its first member when its members are distinct weights
    # (a tensor tied to another one keeps its place).
    index = {n: i for i, (n, role, _) in enumerate(named) if role == TensorRole.Weight}
    keys = [key(t) for _, _, t in named]
    counts: dict = {}
    for k in keys:
        counts[k] = counts.get(k, 0) + 1
    follow: dict[int, list[int]] = {}
    moved: set[int] = set()
    for names in _sibling_groups(program):
        members = [index.get(n) for n in names]
        if None in members or len(set(members)) != len(members) or moved & set(members) \
                or any(keys[i] is None or counts[keys[i]] != 1 for i in members):
            continue
        follow[min(members)] = members
        moved.update(members)
    order = []
    for i in range(len(named)):
        if i in follow:
            order += follow[i]
        elif i not in moved:
            order.append(i)
    offsets, seen, size = [0] * len(named), {}, 0
    for i in order:
        t, k = named[i][2], keys[i]
        if k is not None and k in seen:
            offsets[i] = seen[k]
            continue
        offsets[i] = size
        size = align(size + t.numel() * t.element_size())
        if k is not None:
            seen[k] = offsets[i]
    return [(n, role, t, offsets[i]) for i, (n, role, t) in enumerate(named)], size


# Large extents go to the file and to sha256 in pieces of this size, each hashed on a second thread while
# the next is written: both release the GIL, so the hash (about 3 s for a 5 GB segment here) overlaps
# the write (bounded by the disk) instead of following it.
_PIECE = 32 << 20


class _HashingWriter:
    """``write(chunk)`` sends each chunk to ``f`` and to the data hash (format.DataHasher) that runs on a
    worker thread, in order.
    Chunks are views of the tensors' own memory (no copy): the caller keeps them alive until ``digest``."""

    def __init__(self, f):
        import queue
        import threading
        self.f, self.h = f, DataHasher(SCHEMA_VERSION)
        self.q: queue.Queue = queue.Queue(maxsize=4)
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._hash, name="ostinato-save-sha256", daemon=True)
        self.thread.start()

    def _hash(self) -> None:
        while (chunk := self.q.get()) is not None:
            if self.error is None:
                try:
                    self.h.update(chunk)
                except BaseException as e:  # noqa: BLE001 - re-raised by digest() on the caller's thread
                    self.error = e

    def write(self, chunk) -> None:
        for i in range(0, len(chunk), _PIECE):
            piece = chunk[i:i + _PIECE]
            self.q.put(piece)
            self.f.write(piece)

    def digest(self) -> bytes:
        self.q.put(None)
        self.thread.join()
        if self.error is not None:
            raise self.error
        return self.h.digest()

    def abandon(self) -> None:
        """Stop the worker after a failed write (the queue is drained, nothing more is hashed)."""
        self.error = self.error or OstinatoError("write abandoned")
        self.q.put(None)
        self.thread.join()


def _write_data(f, entries, data_size: int) -> bytes:
    """Stream every distinct extent to ``f`` (zero padding between), returning the segment's hash (the
    header's data_sha256, format.data_digest). Each
    tensor's bytes are written from its own memory (no copy when it is a contiguous CPU tensor)."""
    out = _HashingWriter(f)
    try:
        pos = 0
        for _, _, t, offset in sorted(entries, key=lambda e: e[3]):   # stable: a tie's first owner first
            if offset < pos:
                continue  # a tied tensor: its extent is already written
            raw = _as_bytes(t)
            if offset > pos:
                out.write(b"\0" * (offset - pos))
            out.write(raw)
            pos = offset + len(raw)
        if data_size > pos:
            out.write(b"\0" * (data_size - pos))
    except BaseException:
        out.abandon()
        raise
    return out.digest()


def _flatbuffer(program: Program, entries) -> bytes:
    w = _Writer("program")
    b = w.b
    tensors = []
    for name, role, t, offset in entries:
        n_off, d_off = w.strings(name), w.strings(dtype_name(t.dtype))
        shape = w.scalars(TD.TensorDataStartShapeVector, list(t.shape), b.PrependInt64)
        TD.TensorDataStart(b)
        TD.TensorDataAddName(b, n_off)
        TD.TensorDataAddRole(b, role)
        TD.TensorDataAddDtype(b, d_off)
        TD.TensorDataAddShape(b, shape)
        TD.TensorDataAddOffset(b, offset)
        TD.TensorDataAddNbytes(b, t.numel() * t.element_size())
        tensors.append(TD.TensorDataEnd(b))
    tensors_vec = w.vector(P.ProgramStartTensorsVector, tensors)
    methods = []
    for name, method in program.methods.items():
        if method.methods:
            raise OstinatoError(f"method {name!r} has methods of its own; only the root program may")
        missing = sorted({v.name for v in method.graph.constants} - set(program.weights)
                         | {v.name for v in method.graph.state} - set(program.state_init))
        if missing:
            raise OstinatoError(f"method {name!r} reads tensors the root program does not hold: {missing[:5]}")
        m_prog = _program_table(w, method, None, None)
        n_off = w.strings(name)
        MT.MethodStart(b)
        MT.MethodAddName(b, n_off)
        MT.MethodAddProgram(b, m_prog)
        methods.append(MT.MethodEnd(b))
    methods_vec = w.vector(P.ProgramStartMethodsVector, methods) if methods else None
    b.Finish(_program_table(w, program, tensors_vec, methods_vec), file_identifier=b"OSTP")
    return bytes(b.Output())


def _program_table(w: _Writer, program: Program, tensors_vec: int | None, methods_vec: int | None) -> int:
    """A Program table for ``program``'s graph and calling convention (a method's has no tensors)."""
    g = program.graph
    b = w.b
    values = [*g.constants, *g.inputs, *g.state, *g.temps()]
    values_vec = w.vector(P.ProgramStartValuesVector, [w.value(v) for v in values])
    nodes_vec = w.vector(P.ProgramStartNodesVector, [w.node(n) for n in g.nodes])
    w.where = "graph outputs"
    outputs_vec = w.vector(P.ProgramStartOutputsVector, [w.arg(o) for o in g.outputs])
    ids = lambda vs: [v.id for v in vs]  # noqa: E731
    consts_vec = w.scalars(P.ProgramStartConstantsVector, ids(g.constants), b.PrependInt32)
    inputs_vec = w.scalars(P.ProgramStartInputsVector, ids(g.inputs), b.PrependInt32)
    state_vec = w.scalars(P.ProgramStartStateVector, ids(g.state), b.PrependInt32)
    muts = []
    for target, new in g.mutations:
        M.MutationStart(b)
        M.MutationAddTarget(b, target.id)
        M.MutationAddValue(b, new.id)
        muts.append(M.MutationEnd(b))
    muts_vec = w.vector(P.ProgramStartMutationsVector, muts)
    syms = []
    for sym in g.symbols.values():
        n_off, l_off = w.strings(sym.name), w.strings(sym.label)
        S.SymbolStart(b)
        S.SymbolAddName(b, n_off)
        S.SymbolAddMin(b, sym.min)
        S.SymbolAddMax(b, -1 if sym.max is None else sym.max)
        S.SymbolAddLabel(b, l_off)
        S.SymbolAddHint(b, program.hints.get(sym.name, -1))
        syms.append(S.SymbolEnd(b))
    syms_vec = w.vector(P.ProgramStartSymbolsVector, syms)
    slots = []
    for slot in program.inputs:
        w.where = f"input {slot.name}"
        const = w.arg(slot.value) if slot.kind == "constant" else None
        n_off = w.strings(slot.name)
        IS.InputSlotStart(b)
        IS.InputSlotAddName(b, n_off)
        IS.InputSlotAddKind(b, SLOT_KIND[slot.kind])
        IS.InputSlotAddIndex(b, slot.index)
        if const is not None:
            IS.InputSlotAddConstant(b, const)
        slots.append(IS.InputSlotEnd(b))
    slots_vec = w.vector(P.ProgramStartInputSlotsVector, slots)
    in_spec = w.strings(pytree.treespec_dumps(program.in_spec))
    out_spec = w.strings(pytree.treespec_dumps(program.out_spec))
    info = w.strings(json.dumps(program.info, sort_keys=True, default=str))
    P.ProgramStart(b)
    P.ProgramAddSchemaVersion(b, SCHEMA_VERSION)
    P.ProgramAddValues(b, values_vec)
    P.ProgramAddNodes(b, nodes_vec)
    P.ProgramAddConstants(b, consts_vec)
    P.ProgramAddInputs(b, inputs_vec)
    P.ProgramAddState(b, state_vec)
    P.ProgramAddOutputs(b, outputs_vec)
    P.ProgramAddMutations(b, muts_vec)
    P.ProgramAddSymbols(b, syms_vec)
    P.ProgramAddInputSlots(b, slots_vec)
    P.ProgramAddInSpec(b, in_spec)
    P.ProgramAddOutSpec(b, out_spec)
    P.ProgramAddInfo(b, info)
    if tensors_vec is not None:
        P.ProgramAddTensors(b, tensors_vec)
    if methods_vec is not None:
        P.ProgramAddMethods(b, methods_vec)
    return P.ProgramEnd(b)


def flatbuffer_bytes(program: Program) -> bytes:
    """The FlatBuffer segment the file would hold: everything but the weight bytes."""
    return _flatbuffer(program, _layout_tensors(program)[0])


def write(program: Program, f) -> None:
    """Write the whole file to the binary, seekable stream ``f``; weights are streamed, not gathered."""
    entries, data_size = _layout_tensors(program)
    fb = _flatbuffer(program, entries)
    fb_offset = HEADER_SIZE
    data_offset = align(fb_offset + len(fb))
    start = f.tell()
    f.write(b"\0" * HEADER_SIZE)
    f.write(fb)
    f.write(b"\0" * (data_offset - fb_offset - len(fb)))
    data_sha = _write_data(f, entries, data_size)
    end = f.tell()
    fb_sha = hashlib.sha256(fb).digest()
    header = Header(SCHEMA_VERSION, fb_offset, len(fb), data_offset, data_size, fb_sha, data_sha)
    # the plan cache's key of this program (runtime/plan_cache.program_hash), so a compile after a save
    # does not build the FlatBuffer again (~1 s for a 64-layer decoder on the lent GPU machine's CPU)
    program._graph_hash = fb_sha.hex()
    f.seek(start)
    f.write(header.pack())
    f.seek(end)


def to_bytes(program: Program) -> bytes:
    buf = io.BytesIO()
    write(program, buf)
    return buf.getvalue()


def save(program: Program, path: str | os.PathLike) -> None:
    """Write ``program`` to ``path`` atomically: a temporary file in the same folder, then a rename."""
    path = os.fspath(path)
    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".ost-", suffix=".tmp", dir=folder)
    try:
        with os.fdopen(fd, "wb") as f:
            write(program, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise
    from .reader import cache_decoded, note_saved
    # The first load of this file skips the FlatBuffer walk, and verify=True's shape re-derivation once
    # it passed here (program/ir_cache.py); the weights' hash too, once this process checked the file at
    # its exit (reader.check_saved).
    cache_decoded(path)
    note_saved(path)


__all__ = ["save", "to_bytes", "write"]
