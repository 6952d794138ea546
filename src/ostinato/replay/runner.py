"""``compile(..., replay=True)``: run the first call of each shape signature step by step, capture on
the second, replay after.

The first call is the warm-up, as in torch.compile's CUDA-graph trees (warm up eagerly, record on the
next call) and tinygrad's TinyJit: a first output waits for no capture (on CUDA a capture is a warm-up,
a run under capture and the graph's instantiation: 0.2-0.3 s for a 64-layer decoder). An op no replay
can repeat is still named on the first call. ``OSTINATO_CAPTURE_CALL=1`` captures on the first call
(``stats()["uncaptured_calls"]`` counts the calls answered step by step either way).

Captures live in the session (its own state, arena and CUDA pool), so sessions on different threads
never share a buffer. With ``buckets``, the named dynamic dims are padded up to a rung of a ladder
(powers of two by default): one capture serves every size up to its rung, the padding is zeroed, and
outputs are narrowed back to the real sizes. Padding is only right for batch-like dims, whose rows
do not interact: name only those.

A cold kernel cache (CUDA), when the first call captures: the capture's warm-up submits the missing
kernels to the compile workers. The first call of a shape does not wait for them, as torch.compile's
CUDA-graph trees warm up eagerly and record later: the capture is given up (``CompilesInFlight``; the
warm-up's writes were undone) and the call runs step by step on the caller's own inputs
(``Executable.step``: the ops whose kernels still compile run their torch references; state and input
writes happen once; the outputs are new tensors of the real sizes). No capture is stored; the next
call of that shape waits for the compiles still running and captures, so at most one call per shape
goes uncaptured and the steps after it replay.
``stats()["uncaptured_calls"]`` counts those calls (each is also a plan miss). ``capture_buckets``
always waits for the compiles and captures.
"""
from __future__ import annotations

import itertools
import os
import threading
from typing import Any

import torch
from torch.utils import _pytree as pytree

from ..errors import InputError, OstinatoError, ReplayError
from ..ir import TensorMeta, Value
from .capture import Captured, CompilesInFlight


def capture_deferred() -> bool:
    """Whether the first call of a shape runs step by step and the second captures (the default, as
    torch.compile's CUDA-graph trees warm up on the first call and record on the next): the first output
    does not wait for a capture. OSTINATO_CAPTURE_CALL=1 captures on the first call instead."""
    value = os.environ.get("OSTINATO_CAPTURE_CALL", "2")
    if value not in ("1", "2"):
        raise OstinatoError(f"OSTINATO_CAPTURE_CALL={value!r}: give 1 (capture on a shape's first call) or "
                            "2 (run the first call step by step, capture on the second; the default)")
    return value == "2"


def bucket_ladders(program, buckets: dict[str, Any] | None) -> dict[str, list[int]]:
    """Symbol name -> sorted rungs, from ``{dim: "pow2" | None | [sizes]}`` (a Dim's name or a symbol)."""
    if not buckets:
        return {}
    symbols = program.graph.symbols
    by_label = {r.label: name for name, r in symbols.items() if r.label}
    ladders: dict[str, list[int]] = {}
    for dim, spec in buckets.items():
        name = dim if dim in symbols else by_label.get(dim)
        if name is None:
            known = ", ".join(sorted({*by_label, *symbols})) or "none (the program is static)"
            raise OstinatoError(f"buckets names {dim!r}, which is not a dynamic dim of this program; its "
                                f"dynamic dims are: {known}")
        r = symbols[name]
        if spec is None or spec == "pow2":
            if r.max is None:
                raise OstinatoError(f"dim {dim!r} has no maximum, so no default ladder; give its sizes: "
                                    f"buckets={{{dim!r}: [...]}}")
            rungs = [1 << k for k in range(r.max.bit_length() + 1) if r.min <= 1 << k <= r.max]
            if not rungs or rungs[-1] != r.max:
                rungs.append(r.max)
        else:
            rungs = sorted({int(x) for x in spec})
            bad = [x for x in rungs if x < r.min or (r.max is not None and x > r.max)]
            if not rungs or bad:
                raise OstinatoError(f"buckets for {dim!r}: sizes {bad or rungs} are outside its range "
                                    f"[{r.min}, {r.max if r.max is not None else 'inf'}]")
        ladders[name] = rungs
    return ladders


class ReplayRunner:
    """Takes over an Executable's calls: capture per (padded) shape signature, then replay."""

    def __init__(self, exe, buckets: dict[str, Any] | None = None):
        self.exe = exe
        self.ladders = bucket_ladders(exe.program, buckets)
        program = exe.program
        self._tensor_inputs = [(pos, program.graph.inputs[s.index].meta) for pos, s in enumerate(program.inputs)
                               if s.kind == "tensor"]
        self._scalar_pos = [pos for pos, s in enumerate(program.inputs) if s.kind == "scalar"]
        self._out_metas = [o.meta if isinstance(o, Value) else None for o in program.graph.outputs]
        # Inputs the model writes (x.mul_(2)): the tape writes the static copy; the caller's gets it back.
        self._mutated_pos = [exe._input_pos_by_slot[target] for role, target, _, _ in exe._mutations
                             if role == "input"]
        self._lock = threading.Lock()
        self.defer = capture_deferred()
        self._checked = False       # check_capturable passed (once per executable, not per shape)
        # uncaptured_calls: calls answered step by step, without a capture, while kernels compiled
        self._counts = {"captures": 0, "replays": 0, "bucket_hits": 0, "plan_hits": 0, "plan_misses": 0,
                        "uncaptured_calls": 0, "capture_seconds": 0.0}

    def _count(self, **inc) -> None:
        with self._lock:
            for k, v in inc.items():
                self._counts[k] += v

    def stats(self) -> dict[str, float]:
        with self._lock:
            return dict(self._counts)

    def _padded(self, bindings: dict[str, int]) -> dict[str, int]:
        if not self.ladders:
            return bindings
        out = dict(bindings)
        for name, rungs in self.ladders.items():
            n = bindings.get(name)
            if n is None:
                continue
            rung = next((r for r in rungs if r >= n), None)
            if rung is None:
                raise InputError(f"dim {self.exe.program.graph.symbols[name]} is {n}, above the largest "
                                 f"bucket {rungs[-1]}; add a larger size to buckets")
            out[name] = rung
        return bindings if out == bindings else out

    def __call__(self, session, args: tuple, kwargs: dict | None) -> Any:
        leaves, bindings = self.exe.check_inputs(args, kwargs)
        padded = self._padded(bindings)
        key = (tuple(sorted(padded.items())), tuple(leaves[p] for p in self._scalar_pos))
        graphs = session.replay.setdefault("graphs", {})
        cap = graphs.get(key)
        if cap is None:
            answered = session.replay.setdefault("uncaptured", set())
            if self.defer and key not in answered:
                # the first call of a shape runs step by step (the warm-up); the next one captures
                if not self._checked:   # an op no replay can repeat: said now (same launches for every shape)
                    from .tape import check_capturable
                    check_capturable(self.exe, self.exe.launches)
                    self._checked = True
                return self._uncaptured(session, key, leaves)
            # a first call that captures does not wait for kernels compiling in workers; the next one does
            try:
                cap = self._capture(session, self._static_leaves(leaves, padded), padded,
                                    wait=key in answered)
            except CompilesInFlight:
                return self._uncaptured(session, key, leaves)
            graphs[key] = cap
            self._count(plan_misses=1)
            out = cap.outputs   # the capture was this call
        else:
            self._count(plan_hits=1, replays=1)
            self._load(cap, leaves, bindings, padded)
            out = cap.replay()
        session.replay["last"] = cap
        for pos in self._mutated_pos:
            x, static = leaves[pos], cap.leaves[pos]
            if x is not static:
                x.copy_(static[tuple(slice(0, n) for n in x.shape)] if x.shape != static.shape else static)
        if padded is not bindings:
            self._count(bucket_hits=1)
            out = self._narrowed(cap, bindings)
        return out

    def _uncaptured(self, session, key: tuple, leaves: list) -> Any:
        """A call answered step by step, no capture made: the next call of ``key`` captures (waiting for
        any kernels still compiling)."""
        session.replay["uncaptured"].add(key)
        self._count(plan_misses=1, uncaptured_calls=1)
        session.replay.pop("last", None)    # static_inputs() must not hand out another shape's
        return self.exe.step(session, leaves)

    def _capture(self, session, leaves: list, padded: dict[str, int], wait: bool = True) -> Captured:
        """A capture of one call (CompilesInFlight, with nothing changed, where ``wait`` is False and
        kernels were still compiling)."""
        pool = None
        if self.exe.device.type == "cuda":
            pool = session.replay.get("pool")
            if pool is None:
                pool = session.replay["pool"] = torch.cuda.graph_pool_handle()
        cap = Captured(self.exe, session, leaves, padded, holder=session.replay, pool=pool, wait=wait)
        self.exe.capture_reports.append(cap.report)
        self._count(captures=1, capture_seconds=cap.seconds)
        return cap

    def _static_leaves(self, leaves: list, padded: dict[str, int]) -> list:
        """Fresh contiguous input buffers at the padded sizes holding ``leaves``, zero-padded."""
        out = list(leaves)
        for pos, meta in self._tensor_inputs:
            x = leaves[pos]
            shape = meta.concrete_shape(padded)
            static = torch.zeros(shape, dtype=x.dtype, device=x.device)
            static[tuple(slice(0, n) for n in x.shape)].copy_(x)
            out[pos] = static
        return out

    def _load(self, cap: Captured, leaves: list, bindings: dict[str, int], padded: dict[str, int]) -> None:
        statics = cap.leaves
        for pos, _ in self._tensor_inputs:
            x, static = leaves[pos], statics[pos]
            if x is static:
                continue
            if padded is bindings or x.shape == static.shape:
                static.copy_(x)
            else:
                static.zero_()
                static[tuple(slice(0, n) for n in x.shape)].copy_(x)

    def _narrowed(self, cap: Captured, bindings: dict[str, int]) -> Any:
        """The captured outputs cut to the real sizes (views, made once per real signature)."""
        views = cap.__dict__.setdefault("narrowed", {})
        key = tuple(sorted(bindings.items()))
        out = views.get(key)
        if out is None:
            leaves, spec = pytree.tree_flatten(cap.outputs)
            cut = []
            for leaf, meta in zip(leaves, self._out_metas):
                if isinstance(meta, TensorMeta) and isinstance(leaf, torch.Tensor):
                    leaf = leaf[tuple(slice(0, n) for n in meta.concrete_shape(bindings))]
                elif meta is not None and getattr(meta, "expr", None) is not None:
                    leaf = meta.expr.evaluate(bindings)
                cut.append(leaf)
            out = views[key] = pytree.tree_unflatten(cut, spec)
        return out

    def static_inputs(self, session) -> tuple:
        cap = session.replay.get("last")
        if cap is None:
            raise ReplayError("no capture yet in this session: a shape's first call runs step by step and its "
                              "second captures, so call the executable twice first (once with "
                              "OSTINATO_CAPTURE_CALL=1, unless kernels were still compiling: "
                              "stats()['uncaptured_calls'] counts the calls that captured nothing)")
        args, kwargs = pytree.tree_unflatten(cap.leaves, self.exe.program.in_spec)
        return tuple(args) if not kwargs else (tuple(args), kwargs)

    def capture_buckets(self, session) -> int:
        """Capture every bucket (the product of the ladders) now, largest first, on zero inputs; the
        session's state is left as it was. Needs every dynamic dim bucketed. Returns the count."""
        missing = sorted(set(self.exe.program.graph.symbols) - set(self.ladders))
        if missing:
            raise OstinatoError(f"capture_buckets needs a bucket ladder for every dynamic dim; missing: "
                                f"{', '.join(missing)}")
        if self._scalar_pos:
            raise OstinatoError("capture_buckets cannot guess the program's non-tensor inputs; call it instead")
        names = sorted(self.ladders)
        combos = sorted(itertools.product(*(self.ladders[n] for n in names)), key=lambda c: [-x for x in c])
        snapshot = {name: t.clone() for name, t in session.state.items()}
        graphs = session.replay.setdefault("graphs", {})
        made = 0
        template = [None] * len(self.exe.program.inputs)
        for combo in combos:
            padded = dict(zip(names, combo))
            key = (tuple(sorted(padded.items())), ())
            if key in graphs:
                continue
            leaves = list(template)
            for pos, meta in self._tensor_inputs:
                leaves[pos] = torch.zeros(meta.concrete_shape(padded), dtype=meta.dtype, device=self.exe.device)
            for pos, s in enumerate(self.exe.program.inputs):
                if s.kind == "constant":
                    leaves[pos] = s.value
            graphs[key] = self._capture(session, leaves, padded)
            made += 1
        with torch.no_grad():
            for name, t in snapshot.items():
                session.state[name].copy_(t)
        return made

