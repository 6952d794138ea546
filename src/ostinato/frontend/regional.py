"""Regional export: trace each kind of repeated block once, not once per instance.

A decoder's 64 layers are 64 instances of one class with the same parameter names, shapes and dtypes.
``torch.export`` traces every one of them, so export time grows with depth. Here the model is traced
with each repeated block replaced by an opaque call (``ostinato_regional::call``, a custom op whose
fake implementation runs the block's forward on fake tensors once per kind and input signature,
memoized); each kind is then exported once on its own per call signature (its arguments' structure,
constants, dtypes and sizes), and ``convert`` instantiates that block's IR at every call site with the
instance's weights and state (``inline.py``).

Equivalence is checked, not assumed. A kind falls back to being traced inline (the whole model then
is one ``torch.export``, as without ``regional``), with the reason logged and kept in the report, when:
an instance has hooks; a parameter or buffer of an instance is shared with another module; the
block's forward reads a plain attribute (``self.layer_idx``, a flag) whose value differs between
instances; a call passes something other than tensors and plain constants (a cache object, a symbolic
int); the block mutates its inputs or parameters; or the block cannot be exported alone (data-dependent
control flow that only its caller's constants resolve, for example).
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import itertools
import logging
import threading
from typing import Any

import torch
from torch import nn
from torch.utils import _pytree as pytree

from .kinds import MIN_INSTANCES, TENSOR, CallRecord, Fallback, Kind, OutInfo, find_kinds
from .stubs import _PLAIN, _WriteWatch, _record_reads, _storage, _stub, same_value

log = logging.getLogger("ostinato")

OP_NAME = "ostinato_regional::call"
# -- the opaque call --------------------------------------------------------------------------------
_lock = threading.RLock()
_session: "Session | None" = None


@torch.library.custom_op(OP_NAME, mutates_args=())
def _region_call(inputs: list[torch.Tensor], call_id: int) -> list[torch.Tensor]:
    """Eager: run the block (only reached when a traced graph is run outside ostinato)."""
    if _session is None:
        raise RuntimeError("ostinato_regional::call runs only while ostinato.export traces a model")
    return _session.run_eager(call_id, inputs)


@_region_call.register_fake
def _region_call_fake(inputs, call_id):
    if _session is None:
        raise RuntimeError("ostinato_regional::call is traced only by ostinato.export")
    return _session.fake(call_id, inputs)


def _sizes(tensors: list[torch.Tensor]) -> tuple:
    """A call's input sizes as its block's export fixes them: static sizes as they are, symbolic ones by
    the order their symbols first appear (calls whose inputs share a symbol differently are traced
    apart). Part of a call's signature: a block traced on 4 tokens computes for 4 tokens (its views'
    sizes, a size read as a number), so a call on 2 tokens needs its own trace (LeViT's stages, T5's
    encoder and decoder feed-forward, Hubert's convolutions at each length)."""
    names: dict[str, str] = {}
    out = []
    for t in tensors:
        dims: list = []
        for d in t.shape:
            expr = d.node.expr if isinstance(d, torch.SymInt) else None
            if expr is None:
                dims.append(int(d))
            elif expr.is_number:
                dims.append(int(expr))
            elif expr.is_Symbol:
                dims.append(names.setdefault(str(expr), f"s{len(names)}"))
            else:
                dims.append(f"({expr})")
        out.append(tuple(dims))
    return tuple(out)


def _meta_key(t: torch.Tensor) -> tuple:
    return (tuple(str(d) for d in t.shape), tuple(str(s) for s in t.stride()), t.dtype, t.device.type)


class Session:
    """The state of one regional trace: kinds, wrapped instances and every call."""

    def __init__(self, model: nn.Module, kinds: list[Kind]):
        self.model = model
        self.kinds = kinds
        self.stubs: dict[str, nn.Module] = {}
        self.calls: dict[int, CallRecord] = {}
        self.memo: dict[tuple, OutInfo] = {}
        self.real: dict[int, dict[str, torch.Tensor]] = {}   # id(instance) -> its tensors before tracing
        self._saved: list[tuple[nn.Module, Any]] = []
        self._ids = itertools.count()

    # -- patching ----------------------------------------------------------------------------------
    @contextlib.contextmanager
    def bound(self):
        """The opaque op answers from this session (its fake implementation), the model unpatched."""
        global _session
        with _lock:
            _session = self
            try:
                yield self
            finally:
                _session = None

    def __enter__(self) -> "Session":
        global _session
        _lock.acquire()
        _session = self
        try:
            for kind in self.kinds:
                for path, inst in kind.instances:
                    self.real[id(inst)] = dict(itertools.chain(inst.named_parameters(remove_duplicate=False),
                                                               inst.named_buffers(remove_duplicate=False)))
                    parent_path, _, leaf = path.rpartition(".")
                    parent = self.model.get_submodule(parent_path)
                    stub = _stub(inst, functools.partial(self.call, kind, path, inst))
                    self.stubs[path] = stub
                    self._saved.append((parent, leaf, inst))
                    parent._modules[leaf] = stub
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc) -> None:
        global _session
        try:
            for parent, leaf, inst in reversed(self._saved):
                parent._modules[leaf] = inst
            self._saved.clear()
        finally:
            _session = None
            _lock.release()

    # -- tracing -----------------------------------------------------------------------------------
    def call(self, kind: Kind, path: str, inst: nn.Module, args: tuple, kwargs: dict):
        """The stub's forward: one opaque call, then the block's buffer mutations, on the stub's buffers."""
        leaves, spec = pytree.tree_flatten((args, kwargs))
        tensors, consts = [], []
        for x in leaves:
            if isinstance(x, torch.Tensor):
                tensors.append(x)
                consts.append(TENSOR)
            elif isinstance(x, (torch.SymInt, torch.SymFloat, torch.SymBool)):
                raise Fallback(kind, f"{path} is called with a symbolic {type(x).__name__} argument")
            elif isinstance(x, _PLAIN):
                consts.append(x)
            else:
                raise Fallback(kind, f"{path} is called with a {type(x).__name__} argument, which cannot "
                                     "cross an opaque call")
        sig = (kind.index, str(spec), tuple(repr(c) for c in consts),
               tuple((t.dtype, t.dim()) for t in tensors), _sizes(tensors))
        rec = CallRecord(next(self._ids), kind, path, inst, spec, consts, sig)
        self.calls[rec.call_id] = rec
        outs = torch.ops.ostinato_regional.call(tensors, rec.call_id)
        info = rec.out
        it = iter(outs[:info.n_tensors])
        user = [next(it) if leaf is TENSOR else leaf for leaf in info.leaves]
        for j, name in enumerate(info.mutated):
            self.stubs[path].get_buffer(name).copy_(outs[info.n_tensors + j])
        return pytree.tree_unflatten(user, info.out_spec)

    def fake(self, call_id: int, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
        rec = self.calls[call_id]
        from torch._guards import detect_fake_mode
        mode = detect_fake_mode(inputs) or detect_fake_mode()
        if rec.fake_inputs is None:
            rec.fake_inputs = list(inputs)
        key = (id(mode), rec.signature, tuple(_meta_key(t) for t in inputs))
        info = self.memo.get(key)
        if info is None:
            info = self.memo[key] = self._fake_run(rec, inputs, mode)
        rec.out = info
        return [torch.empty_strided(shape, stride, dtype=dtype, device=device)
                for shape, stride, dtype, device in info.metas]

    def _fake_run(self, rec: CallRecord, inputs: list[torch.Tensor], mode) -> OutInfo:
        """Run the block's own forward on fake tensors (not traced): its outputs and mutated buffers."""
        kind, inst = rec.kind, rec.module
        real = self.real[id(inst)]
        params = dict(inst.named_parameters(remove_duplicate=False))
        tensors = {n: mode.from_tensor(t, static_shapes=True) if n in params
                   else mode.from_tensor(t, static_shapes=True).clone()
                   for n, t in real.items()}
        ins = [t.clone() for t in inputs]
        it = iter(ins)
        args, kwargs = pytree.tree_unflatten([next(it) if c is TENSOR else c for c in rec.leaves], rec.in_spec)
        record = kind.reads is None
        reads: set = set()
        swapped = _record_reads(dict(inst.named_modules()), reads) if record else []
        watch = _WriteWatch()
        try:
            with torch.nn.utils.stateless._reparametrize_module(inst, tensors), watch:
                out = type(inst).forward(inst, *args, **kwargs)
        finally:
            for m, cls in swapped:
                m.__class__ = cls
        if record:
            kind.reads, kind.representative = reads, rec.path
        if any(_storage(t) in watch.written for t in ins):
            raise Fallback(kind, f"{rec.path} mutates its inputs in place")
        mutated = sorted(n for n, t in tensors.items() if _storage(t) in watch.written)
        if any(n in params for n in mutated):
            raise Fallback(kind, f"{rec.path} mutates its parameters")
        leaves, out_spec = pytree.tree_flatten(out)
        outs, consts = [], []
        for x in leaves:
            if isinstance(x, torch.Tensor):
                outs.append(x)
                consts.append(TENSOR)
            elif isinstance(x, _PLAIN):
                consts.append(x)
            else:
                raise Fallback(kind, f"{rec.path} returns a {type(x).__name__}, which cannot cross an opaque call")
        outs += [tensors[n] for n in mutated]
        metas = [(tuple(t.shape), tuple(t.stride()), t.dtype, t.device) for t in outs]
        return OutInfo(out_spec, consts, len(outs) - len(mutated), mutated, metas)

    def run_eager(self, call_id: int, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
        rec = self.calls[call_id]
        it = iter(inputs)
        args, kwargs = pytree.tree_unflatten([next(it) if c is TENSOR else c for c in rec.leaves], rec.in_spec)
        out = type(rec.module).forward(rec.module, *args, **kwargs)
        return [x.clone() for x in pytree.tree_leaves(out) if isinstance(x, torch.Tensor)]

    def keep_calls_in(self, ep) -> None:
        """Forget the calls ``ep``'s graph does not make: a trace straight to core ATen runs the model
        twice (once for AOT autograd's metadata, then the trace), and only the second one's calls are
        in the graph."""
        op = torch.ops.ostinato_regional.call.default
        used = {n.args[1] for n in ep.graph.nodes if n.op == "call_function" and n.target is op}
        self.calls = {i: rec for i, rec in self.calls.items() if i in used}

    # -- checks after the outer trace ----------------------------------------------------------------
    def differing_state(self, kind: Kind) -> str | None:
        """Why instances of ``kind`` are not interchangeable, from the attributes its forward read."""
        if kind.reads is None:
            return None
        rep = dict(kind.instances)[kind.representative]
        for rel, name in sorted(kind.reads):
            want = getattr(rep.get_submodule(rel), name)
            for path, inst in kind.instances:
                got = getattr(inst.get_submodule(rel), name)
                if not same_value(want, got):
                    where = f"{rel}.{name}" if rel else name
                    return (f"forward reads self.{where}, which differs between instances "
                            f"({kind.representative}: {want!r}, {path}: {got!r})")
        return None

    def partition(self, kind: Kind) -> list[list[tuple[str, nn.Module]]]:
        """``kind``'s instances grouped by the values of the attributes its forward read."""
        groups: list[tuple[list, list]] = []   # (values, instances)
        reads = sorted(kind.reads or ())
        for path, inst in kind.instances:
            values = [getattr(inst.get_submodule(rel), name) for rel, name in reads]
            for want, members in groups:
                if all(same_value(a, b) for a, b in zip(want, values)):
                    members.append((path, inst))
                    break
            else:
                groups.append((values, [(path, inst)]))
        return [members for _, members in groups]


def _split(session: Session, kinds: list[Kind], kind: Kind, reason: str, report: "Report") -> list[Kind] | None:
    """Kinds in place of ``kind`` whose instances agree on what the forward reads (a model alternating
    two kinds of attention, say), or None when that would not save traces (every instance its own)."""
    groups = session.partition(kind)
    multi = [g for g in groups if len(g) >= MIN_INSTANCES]
    if kind.depth >= 2 or not multi or len(groups) > max(2, len(kind.instances) // 4):
        return None
    start = max(k.index for k in kinds) + 1
    subs = [Kind(start + i, kind.cls, g, depth=kind.depth + 1) for i, g in enumerate(multi)]
    inline = sum(len(g) for g in groups if len(g) < MIN_INSTANCES)
    report.splits.append(f"{kind.cls}: split into {len(subs)} kinds ({reason})"
                         + (f"; {inline} instance(s) traced inline" if inline else ""))
    return [k for k in kinds if k is not kind] + subs


# -- exporting the blocks -----------------------------------------------------------------------------
class _Flat(nn.Module):
    """A block called with its tensors as positional arguments and its constants baked in; returns the
    tensor leaves of its output (what the opaque call returns, less the mutated buffers)."""

    def __init__(self, block: nn.Module, rec: CallRecord):
        super().__init__()
        self.block = block
        self._spec, self._leaves = rec.in_spec, rec.leaves

    def forward(self, *tensors):
        it = iter(tensors)
        args, kwargs = pytree.tree_unflatten([next(it) if c is TENSOR else c for c in self._leaves], self._spec)
        out = self.block(*args, **kwargs)
        return tuple(x for x in pytree.tree_leaves(out) if isinstance(x, torch.Tensor))


def _hint(x) -> int:
    if isinstance(x, int):
        return x
    node = x.node
    hint = node.hint if node.hint is not None else node.shape_env.size_hint(node.expr)
    return int(hint)


def example_inputs(rec: CallRecord) -> tuple[list[torch.Tensor], tuple, list[list[str | None]]]:
    """Real example tensors for a block from the fake ones its call saw, their torch.export dynamic
    shapes, and, per input, the outer trace's symbol at each dim (None where static)."""
    tensors, specs, syms = [], [], []
    dims: dict[str, Any] = {}
    for t in rec.fake_inputs:
        shape = [_hint(d) for d in t.shape]
        stride = [_hint(s) for s in t.stride()]
        x = torch.empty_strided(shape, stride, dtype=t.dtype, device=t.device)
        if x.dtype.is_floating_point or x.dtype.is_complex:
            x.normal_()
        else:
            x.zero_()   # indices: zero is valid for any size; the values are not traced
        tensors.append(x)
        spec, names = {}, []
        for i, d in enumerate(t.shape):
            if isinstance(d, int) or d.node.expr.is_number:
                names.append(None)
                continue
            expr = d.node.expr
            if not expr.is_Symbol:
                raise ValueError(f"input size {expr} is an expression of the model's dynamic sizes")
            name = str(expr)
            if name not in dims:
                vr = d.node.shape_env.var_to_range.get(expr)
                lo = int(vr.lower) if vr is not None and vr.lower.is_finite else 0
                hi = int(vr.upper) if vr is not None and vr.upper.is_finite and vr.upper < 2**62 else None
                dims[name] = torch.export.Dim(f"d_{name}", min=max(lo, 0), max=hi) if hi is not None \
                    else torch.export.Dim(f"d_{name}", min=max(lo, 0))
            spec[i] = dims[name]
            names.append(name)
        specs.append(spec or None)
        syms.append(names)
    return tensors, tuple(specs), syms


@dataclasses.dataclass
class BlockExport:
    """One kind's block exported on its own, for the calls whose signature it was traced with."""

    ep: Any                           # core-ATen ExportedProgram of _Flat(block)
    rec: CallRecord                   # the call it was traced from
    outer_syms: list[list[str | None]]


def export_blocks(session: Session, core) -> dict[tuple, BlockExport]:
    """Export each (kind, call signature) once, to core ATen (``core``: a decompose.Decomposer). Raises
    Fallback for a kind that cannot be."""
    blocks: dict[tuple, BlockExport] = {}
    for rec in session.calls.values():
        key = rec.signature
        if key in blocks:
            continue
        try:
            tensors, dyn, syms = example_inputs(rec)
        except ValueError as e:
            raise Fallback(rec.kind, f"{rec.path}: {e}") from None
        flat = _Flat(rec.module, rec).eval()
        try:
            with torch.no_grad():
                ep = core.export(flat, tuple(tensors), dynamic_shapes=(dyn,) if any(dyn) else None)
        except Exception as e:  # noqa: BLE001 - any failure means: trace this kind inline
            raise _alone(rec, e) from None
        blocks[key] = BlockExport(ep, rec, syms)
    return blocks


def _alone(rec: CallRecord, e: Exception) -> Fallback:
    first = str(e).strip().splitlines()[0] if str(e).strip() else ""
    return Fallback(rec.kind, f"{rec.path} cannot be exported alone ({type(e).__name__}: {first[:200]})")




# -- the whole regional trace -------------------------------------------------------------------------
def _fallback_in(e: BaseException) -> "Fallback | None":
    seen = set()
    while e is not None and id(e) not in seen:
        if isinstance(e, Fallback):
            return e
        seen.add(id(e))
        e = e.__cause__ or e.__context__
    return None


@dataclasses.dataclass
class Report:
    """What regional export did: the kinds traced once, and each fallback with its reason."""

    kinds: list[dict] = dataclasses.field(default_factory=list)
    fallbacks: list[str] = dataclasses.field(default_factory=list)
    splits: list[str] = dataclasses.field(default_factory=list)   # kinds split by what their forward reads
    traces: int = 0            # torch.export runs of the whole model (1, or more after a fallback)
    blocks: int = 0            # block exports

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


class Regions:
    """Hands ``convert`` each block's IR at its opaque calls."""

    op = torch.ops.ostinato_regional.call.default

    def __init__(self, session: Session, blocks: dict[tuple, BlockExport], convert, strict: bool):
        self.session, self.blocks = session, blocks
        self._convert, self._strict = convert, strict
        self._irs: dict[tuple, Any] = {}

    def instantiate(self, conv, n):
        from .inline import Block, instantiate
        inputs, call_id = n.args
        rec = self.session.calls[call_id]
        block = self._irs.get(rec.signature)
        if block is None:
            block = self._irs[rec.signature] = Block(self.blocks[rec.signature],
                                                     lambda ep: self._convert(ep, strict=self._strict))
        return instantiate(conv, block, rec, [conv.arg(x) for x in inputs], self.session.real[id(rec.module)])


def trace(model: nn.Module, args: tuple, kwargs: dict, dynamic_shapes, decompose, convert, strict: bool):
    """torch.export of ``model`` with its repeated blocks opaque, each block exported once.

    Returns (ExportedProgram, Regions, Report), or (None, None, Report) when no kind is left to trace
    once (the caller then runs a full export)."""
    kinds, why = find_kinds(model)
    report = Report(fallbacks=why)
    if not kinds:
        return None, None, report
    from .decompose import decompositions
    with decompositions(decompose) as core:
        return _trace(model, args, kwargs, dynamic_shapes, convert, strict, kinds, report, core)


def _trace(model, args, kwargs, dynamic_shapes, convert, strict, kinds, report, core):
    while kinds:
        session = Session(model, kinds)
        report.traces += 1
        try:
            with session:
                ep = core.export(model, args, kwargs, dynamic_shapes)
            session.keep_calls_in(ep)
            split = None
            for kind in kinds:
                reason = session.differing_state(kind)
                if reason:
                    split = _split(session, kinds, kind, reason, report)
                    if split is None:
                        raise Fallback(kind, reason)
                    break
            if split is not None:
                kinds = split
                continue
            blocks = export_blocks(session, core)
        except Exception as e:  # noqa: BLE001 - a Fallback, or the model is not traceable at all
            fb = _fallback_in(e)
            if fb is None:
                report.fallbacks.append(f"regional trace failed ({type(e).__name__}: "
                                        f"{str(e).strip().splitlines()[0][:200] if str(e).strip() else ''}); "
                                        "full export")
                return None, None, report
            report.fallbacks.append(f"{fb.kind.cls}: {fb.reason}")
            kinds = [k for k in kinds if k is not fb.kind]
            continue
        report.blocks = len(blocks)
        called: dict[int, int] = {}
        for rec in session.calls.values():
            called[rec.kind.index] = called.get(rec.kind.index, 0) + 1
        report.kinds = [{"class": k.cls, "instances": len(k.instances), "calls": called.get(k.index, 0),
                         "traced": sum(1 for key in blocks if key[0] == k.index)} for k in kinds]
        return ep, Regions(session, blocks, convert, strict), report
    return None, None, report
