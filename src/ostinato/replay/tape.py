"""Capturing a Plan on the CPU as a tape: the launches that compute, bound to static buffers.

Capture runs the Plan once as a probe (state saved first and restored after), learning every value's
shape, strides and whether it aliases an argument. Then it lays out one arena for the temporaries
(``runtime.memory.plan_memory``) and runs the Plan again for real, launch by launch, on static
buffers:

- host scalars (sizes) and views of static buffers are computed once and frozen: they leave the tape;
- ops that write an argument (KV-cache updates) stay on the tape as they are;
- every other op writes its result into its arena buffer through its ``out=`` form (torch's public
  binding, else the overload); an op with no ``out=`` form runs as is and is copied into its buffer;
- ops ostinato lacks (``fallback.*``, run through eager torch) are never frozen, as their effects are
  unknown, and never given an ``out=`` form: they run as is on every replay.

Each form is checked against the probe's result before it is kept, so a wrong ``out=`` binding falls
back instead of corrupting a replay. The tape is one generated function with every tensor bound as a
constant: a replay does no IR work, no shape work and no allocation (except inside the ops that have
no ``out=`` form, counted in the memory report).
"""
from __future__ import annotations

import time
from typing import Any, Callable

import torch

from ..backends.base import Launch, _Slot, _SlotList, resolve
from ..errors import CaptureError
from ..ir import get_op
from ..ir.fallback import is_fallback
from ..runtime.codegen import _literal
from ..runtime.memory import BufferLife, MemoryReport, plan_memory
from .outvariants import out_overload, public_binding, special_forms, writes_argument

END = 1 << 60   # the lifetime end of values read after the tape returns (outputs, state writes)
_RTOL = {torch.float16: 1e-2, torch.bfloat16: 5e-2}


def check_capturable(exe, launches: list[Launch]) -> None:
    """Raise CaptureError naming the first op a replay could not repeat faithfully."""
    sources = None
    for launch in launches:
        opdef = get_op(launch.op)
        why = ("draws random numbers: a replay would repeat the captured draw" if opdef.random else
               "reads tensor data on the host (a sync, or an output shape that depends on data)"
               if opdef.host_sync else "")
        if why:
            if sources is None:
                sources = {n.name: n.source for n in exe.program.graph.nodes}
            where = sources.get(launch.name) or "unknown source"
            raise CaptureError(f"cannot capture {launch.op} (node {launch.name}, at {where}): it {why}. "
                               "Fix: run this model without replay (compile(..., replay=False)), or move "
                               "the op out of the captured model")


def _arg_tensors(launch: Launch, env: list) -> list[tuple[int, torch.Tensor]]:
    """(slot or -1, tensor) for every tensor argument of a launch, in order."""
    out = []

    def walk(a):
        if type(a) is _Slot:
            v = env[a.i]
            if isinstance(v, torch.Tensor):
                out.append((a.i, v))
        elif type(a) is _SlotList:
            for x in a.items:
                walk(x)
        elif isinstance(a, torch.Tensor):
            out.append((-1, a))
    for a in (*launch.args, *launch.kwargs.values()):
        walk(a)
    return out


def _results(launch: Launch, res: Any) -> tuple:
    return tuple(res) if launch.unpack else (res,)


def _store(launch: Launch, results: tuple, env: list) -> None:
    for slot, r in zip(launch.outs, results):
        if slot >= 0:
            env[slot] = r


def _extent(t: torch.Tensor) -> int:
    """Elements of storage a tensor's layout spans."""
    if t.numel() == 0:
        return 0
    return 1 + sum((n - 1) * s for n, s in zip(t.shape, t.stride()))


def _close(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.dtype.is_floating_point or a.dtype.is_complex:
        rtol = _RTOL.get(a.dtype, 1e-4)
        return torch.allclose(a, b, rtol=rtol, atol=rtol * 1e-1, equal_nan=True)
    return torch.equal(a, b)


# Ops whose result holds no defined values (a buffer later filled, by slice assignment say).
_UNINITIALIZED = frozenset({"aten.empty.memory_format", "aten.empty_like", "aten.empty_strided",
                            "aten.empty_permuted", "aten.new_empty", "aten.new_empty_strided"})


def _layout_of(t) -> tuple | None:
    return (t.shape, t.stride(), t.dtype, t.device) if isinstance(t, torch.Tensor) else None


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether another form of a launch gives the plan's result: bit for bit in fp16/bf16 (a form one
    rounding apart, such as linear.out's matmul-then-bias, passes the half dtypes' tolerance at each
    launch and then carries its difference through every later layer, until a later check fails or the
    replay answers differently from eager), else ``_close``."""
    if a.dtype in (torch.float16, torch.bfloat16) and a.shape == b.shape and b.dtype == a.dtype:
        return bool(((a == b) | (a.isnan() & b.isnan())).all())
    return _close(a, b)


class Tape:
    """A captured Plan: ``fn()`` recomputes the captured outputs from the static inputs and state in
    place; ``arena`` holds every temporary."""

    def __init__(self, fn: Callable[[], None], source: str, arena: torch.Tensor, report: MemoryReport,
                 seconds: float):
        self.fn, self.source = fn, source
        self.arena, self.report, self.seconds = arena, report, seconds


class _TapeWriter:
    """Source of the tape function: one line per kept launch, every non-literal argument a global."""

    def __init__(self):
        self.namespace: dict[str, Any] = {}
        self.lines: list[str] = []

    def ref(self, a: Any) -> str:
        lit = _literal(a)
        if lit is not None:
            return lit
        name = f"k{len(self.namespace)}"
        self.namespace[name] = a
        return name

    def call(self, fn: Callable, args: tuple, kwargs: dict) -> str:
        parts = [self.ref(a) for a in args] + [f"{k}={self.ref(a)}" for k, a in kwargs.items()]
        return f"{self.ref(fn)}({', '.join(parts)})"

    def add(self, line: str, note: str) -> None:
        self.lines.append(f"    {line}  # {note}")

    def build(self, name: str) -> tuple[Callable[[], None], str]:
        source = f"def {name}():\n" + "\n".join(self.lines or ["    pass"]) + "\n    return None\n"
        exec(compile(source, f"<ostinato {name}>", "exec"), self.namespace)  # noqa: S102 - generated above
        return self.namespace[name], source


def _note(launch: Launch) -> str:
    return "".join(c if c.isalnum() or c in "_." else "_" for c in launch.name)[:80]


def snapshot_buffers(state: dict, mutations: list) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Copies of what a warm-up or probe run may write, to put back after it: every state buffer and
    every input a mutation targets (an input written in place, such as a reinplaced
    ``index_put_(..., accumulate=True)``, which a second run would apply again), each once."""
    saved, seen = [], set()
    for t in [*state.values(), *(target for target, _ in mutations)]:
        if isinstance(t, torch.Tensor) and id(t) not in seen:
            seen.add(id(t))
            saved.append((t, t.clone()))
    return saved


def restore_buffers(saved: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
    with torch.no_grad():
        for t, copy in saved:
            t.copy_(copy)


def capture_tape(exe, launches: list[Launch], env0: list, state: dict[str, torch.Tensor],
                 kept: set[int], mutations: list[tuple[torch.Tensor, int]], arena_for: Callable[[int], torch.Tensor],
                 signature: str) -> tuple[Tape, list]:
    """Capture ``launches`` over ``env0`` (constants, static inputs and state bound). ``kept`` are the
    slots read after a run (outputs, state writes); ``mutations`` pairs a target tensor with the slot
    whose value it must hold after each replay. ``arena_for(nbytes)`` gives the arena (shared by a
    session's tapes). Returns the tape and the static environment (this call's results)."""
    t0 = time.perf_counter()

    # 1. Probe: the plan as it runs today, every result kept; the state and the inputs it writes are
    # restored afterwards.
    snapshot = snapshot_buffers(state, mutations)
    env = list(env0)
    probe: list[tuple] = []
    # What each launch's results held when it ran, where a later in-place launch overwrote them (an
    # accumulation into a temporary: ost.linear_acc_): the values step 4 checks its static run against.
    checks: dict[int, tuple] = {}
    with torch.no_grad():
        for launch in launches:
            if writes_argument(launch.op):
                written = [t for slot, t in _arg_tensors(launch, env)[:1]]
                for j, earlier in enumerate(probe):
                    if j not in checks and any(isinstance(r, torch.Tensor) and _same_storage(r, w)
                                               for r in earlier for w in written):
                        checks[j] = tuple(r.clone() if isinstance(r, torch.Tensor) else r for r in earlier)
            res = _results(launch, launch.fn(*[resolve(a, env) for a in launch.args],
                                             **{k: resolve(a, env) for k, a in launch.kwargs.items()}))
            if launch.op in _UNINITIALIZED and len(res) == 1 and isinstance(res[0], torch.Tensor):
                res[0].zero_()      # (the tape zeroes it too: an allocation's values are otherwise undefined)
            probe.append(res)
            _store(launch, res, env)
    restore_buffers(snapshot)
    del snapshot

    # 2. What each launch is, and which buffer (root) each tensor value lives in.
    kinds: list[str] = []
    root: dict[int, int] = {}          # slot -> buffer id, for values living in the arena
    buffers: list[tuple[int, torch.Tensor]] = []   # (producing launch, probe tensor)
    out_buffer: dict[tuple[int, int], int] = {}    # (launch, result index) -> buffer id
    for i, (launch, res) in enumerate(zip(launches, probe)):
        fresh = any(isinstance(r, torch.Tensor) and _aliased(r, launch, env) is None for r in res)
        if writes_argument(launch.op) or (is_fallback(launch.op) and not fresh):
            kind = "inplace"    # stays on the tape as it is
        elif not fresh:
            kind = "frozen"
        else:
            kind = "compute"
        kinds.append(kind)
        for k, r in enumerate(res):
            if not isinstance(r, torch.Tensor):
                continue
            slot = launch.outs[k] if k < len(launch.outs) else -1
            if kind == "compute":
                out_buffer[(i, k)] = len(buffers)
                if slot >= 0:
                    root[slot] = len(buffers)
                buffers.append((i, r))
            elif slot >= 0:
                base = _aliased(r, launch, env)
                if base is not None and base in root:
                    root[slot] = root[base]

    # 3. Lifetimes and the arena.
    last = [i for i, _ in buffers]
    for i, launch in enumerate(launches):
        for slot, _ in _arg_tensors(launch, env):
            if slot in root:
                last[root[slot]] = max(last[root[slot]], i)
    for slot in kept:
        if slot in root:
            last[root[slot]] = END
    lives = [BufferLife(_extent(t) * t.element_size(), i, last[b]) for b, (i, t) in enumerate(buffers)]
    offsets, arena_bytes = plan_memory(lives)
    arena = arena_for(arena_bytes)
    static_bufs = []
    for (i, t), off, life in zip(buffers, offsets, lives):
        flat = arena[off:off + life.nbytes].view(t.dtype)
        static_bufs.append(flat.as_strided(t.shape, t.stride()))

    # 4. The real call, launch by launch on static buffers, writing the tape as it goes.
    senv = list(env0)
    writer = _TapeWriter()
    fallbacks = 0
    with torch.no_grad():
        for i, (launch, kind, res) in enumerate(zip(launches, kinds, probe)):
            args = tuple(resolve(a, senv) for a in launch.args)
            kwargs = {k: resolve(a, senv) for k, a in launch.kwargs.items()}
            if kind == "frozen":
                got = _results(launch, launch.fn(*args, **kwargs))
                for r, g in zip(res, got):
                    if isinstance(r, torch.Tensor) and (g.shape != r.shape or g.stride() != r.stride()):
                        raise CaptureError(f"{launch.op} (node {launch.name}) gives another layout on the "
                                           f"static buffers than in the plan: {list(g.shape)} vs {list(r.shape)}")
                _store(launch, got, senv)
                continue
            if kind == "inplace":
                got = _results(launch, launch.fn(*args, **kwargs))
                statics = [t for _, t in _arg_tensors(launch, senv)]
                for g in got:
                    if isinstance(g, torch.Tensor) and not any(g is s or _same_storage(g, s) for s in statics):
                        raise CaptureError(f"{launch.op} (node {launch.name}) writes an argument but returns a "
                                           "new tensor; a replay could not keep it static")
                _store(launch, got, senv)
                writer.add(writer.call(launch.fn, args, kwargs), _note(launch))
                continue
            res = checks.get(i, res)
            bufs = [static_bufs[out_buffer[(i, k)]] if (i, k) in out_buffer else None for k in range(len(res))]
            if launch.op in _UNINITIALIZED and len(bufs) == 1 and bufs[0] is not None \
                    and _layout_of(bufs[0]) == _layout_of(res[0]):
                # an allocation: zeros, as in the probe (its values are undefined, and what later
                # launches make of them, a slice assignment's untouched part say, must match the probe's)
                bufs[0].zero_()
                writer.add(f"{writer.ref(bufs[0])}.zero_()", _note(launch))
                _store(launch, tuple(bufs), senv)
                continue
            line = _compute_form(launch, args, kwargs, res, bufs, writer)
            if line is None:
                raise CaptureError(f"{launch.op} (node {launch.name}) gives other results on static buffers "
                                   "than in the plan; it cannot be captured")
            fallbacks += line.startswith("_r = ")
            writer.add(line, _note(launch))
            _store(launch, tuple(bufs), senv)
        # State and input writes the plan leaves to the caller: the tape does them itself.
        for target, slot in mutations:
            new = senv[slot]
            if new is not target:
                target.copy_(new)
                writer.add(f"{writer.ref(target)}.copy_({writer.ref(new)})", "write back")
    fn, source = writer.build("replay_" + exe.backend.name)
    naive = sum(life.nbytes for life in lives)
    report = MemoryReport(signature, arena_bytes, naive, len(lives), fallbacks)
    tape = Tape(fn, source, arena, report, time.perf_counter() - t0)
    return tape, senv


def _same_storage(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.numel() > 0 and b.numel() > 0 and a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()


def _aliased(r: torch.Tensor, launch: Launch, env: list) -> int | None:
    """The slot of the argument ``r`` shares storage with (-1 for a non-slot argument), or None."""
    if r.numel() == 0:
        return None
    for slot, t in _arg_tensors(launch, env):
        if _same_storage(r, t):
            return slot
    return None


def _compute_form(launch: Launch, args: tuple, kwargs: dict, res: tuple, bufs: list, w: _TapeWriter) -> str | None:
    """Run the launch into ``bufs`` with the first form whose results match the probe's; its tape line."""
    for fn, fargs, fkwargs in special_forms(launch.op, args, kwargs, bufs):
        try:
            fn(*fargs, **fkwargs)
        except (TypeError, RuntimeError, ValueError):
            continue
        if _same(bufs[0], res[0]):
            return w.call(fn, fargs, fkwargs)
    forms: list[tuple[Callable, dict]] = []   # (callable, its out arguments), fastest first
    ov = out_overload(launch.op)
    if ov is not None and all(b is not None for b in bufs):
        fn, names = ov
        if len(names) == 1:
            pub = public_binding(launch.op)
            if pub is not None:
                forms.append((pub, {"out": bufs[0]}))
        forms.append((fn, dict(zip(names, bufs))))
    for fn, outs in forms:
        try:
            fn(*args, **kwargs, **outs)
        except (TypeError, RuntimeError, ValueError):
            continue
        if all(b is None or _same(b, r) for b, r in zip(bufs, res)):
            return w.call(fn, args, {**kwargs, **outs})
    # No out= form (fused references, sdpa, ...): compute, then copy into the arena buffer.
    got = _results(launch, launch.fn(*args, **kwargs))
    for b, g in zip(bufs, got):
        if b is not None:
            b.copy_(g)
    if not all(b is None or _close(b, r) for b, r in zip(bufs, res)):
        return None
    call = w.call(launch.fn, args, kwargs)
    if launch.unpack:
        copies = "; ".join(f"{w.ref(b)}.copy_(_r[{k}])" for k, b in enumerate(bufs) if b is not None)
    else:
        copies = f"{w.ref(bufs[0])}.copy_(_r)"
    return f"_r = {call}; {copies}"
