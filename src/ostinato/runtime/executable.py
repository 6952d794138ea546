"""Executable: a Program lowered for one device, callable like the eager module."""
from __future__ import annotations

import collections
import logging
import threading
import time
from typing import Any

import torch
from torch.utils import _pytree as pytree

from ..backends import Backend, Launch, get_backend
from ..errors import OstinatoError
from ..ir import Value
from ..ir.ops import does_device_work
from ..ir.bulk import paused_gc
from ..ir.fallback import is_fallback
from ..program import Program
from ..program.reader import DECODED_HOOKS
from .codegen import compile_launches
from .folding import fold_constants
from .inputs import InputChecker
from .packing import place_constants
from .plan_cache import cached_plan
from .segments import Segment, split_plan


def launch_is_kernel(launch: Launch) -> bool:
    """Whether a launch runs device work (views, size arithmetic and no-op aliases do not)."""
    return does_device_work(launch.op)
from .session import Session, write_state

log = logging.getLogger("ostinato")


class _Capturing(threading.local):
    """The capture (``ostinato.graph``) open on this thread, if any: calls of any Executable inside it
    are handed to its ``capture(executable, session, leaves)`` instead of running."""

    target = None


capturing = _Capturing()


class Executable:
    """Run with ``exe(*args, **kwargs)``; state lives in ``exe.session`` (or sessions you create)."""

    def __init__(self, program: Program, backend: Backend, cache: bool = True,
                 placed: dict[str, torch.Tensor] | None = None):
        self.program = program
        self.backend = backend
        self.device = backend.device
        g = program.graph
        self.num_slots = g.assign_slots()
        t0 = time.perf_counter()
        # Seconds of each part of the compile (the library warm-up: the wait for it at the end).
        self.compile_timings: dict[str, float] = {}
        # CUDA: cuBLAS/cuDNN are set up in a thread while the plan is built, joined before compile returns
        warming = backend.warm_libraries(g)
        try:
            keep = self._build(program, backend, cache, placed)
        finally:
            if warming is not None:
                t1 = time.perf_counter()
                warming.join()
                self.compile_timings["warm_up_wait"] = time.perf_counter() - t1
        self.compile_seconds = time.perf_counter() - t0
        # Slots read after a plan runs: its outputs and the values state and inputs must take.
        self.kept_slots = keep
        # Set by ostinato.compile(..., replay=True): takes over calls (capture per shape, then replay).
        self.runner = None
        # A MemoryReport per capture made of this executable (the latest 256).
        self.capture_reports: collections.deque = collections.deque(maxlen=256)
        self._segments: list[Segment] | None = None
        # The program's other entry points (an LM's "prefill"), lowered over the same placed weights; a
        # session runs them on its own state through session.method(name).
        shared = {v.name: self._template[v.slot] for v in g.constants} if program.methods else None
        self.methods: dict[str, Executable] = {name: Executable(m, backend, cache, shared)
                                                for name, m in program.methods.items()}
        # Backends whose plan values are not the caller's tensors (MLX) convert at the edges.
        self._converts = type(backend).to_host is not Backend.to_host
        self.session = self.new_session()

    def _build(self, program: Program, backend: Backend, cache: bool, placed) -> set[int]:
        """Place the constants and lower, fold and build the plan (from the plan cache when ``cache``);
        returns the slots read after a run."""
        g = program.graph
        self._checker = InputChecker(program, self.device)
        # Environment template: constants placed once, shared by every call and session.
        self._template: list[Any] = [None] * self.num_slots
        # ``placed``: weights already on the device, by name (a method gets its root's, packed). Sibling
        # projections' weights are packed as they are placed, each byte copied at most once (packing.py).
        t0 = time.perf_counter()
        place_constants(g, program.weights, backend, self._template, placed)
        self.compile_timings["place_constants"] = time.perf_counter() - t0
        self._state_slots = [(v.slot, v.name) for v in g.state]
        self._input_slots = [(pos, g.inputs[s.index].slot) for pos, s in enumerate(program.inputs)
                             if s.kind != "constant"]
        self._outputs = [(True, o.slot) if isinstance(o, Value) else (False, o) for o in g.outputs]
        self._mutations = [(t.role, t.slot, t.name, new.slot) for t, new in g.mutations]
        self._input_pos_by_slot = {slot: pos for pos, slot in self._input_slots}
        keep = {x for is_slot, x in self._outputs if is_slot} | {m[3] for m in self._mutations}

        def lower() -> list[Launch]:
            return backend.lower_graph(g)

        # Launches reading only weights run once here, into the template (folding.py): the plan runs the
        # rest. A plan function records the launches folded for it; one made for another folding (this
        # process's memory of a plan, built by an executable that folded differently) is not reused.
        constant_slots = {v.slot for v in g.constants}
        folded: list = []

        def fold(launches: list[Launch]) -> tuple[list[Launch], frozenset]:
            if not folded:
                rest, which = fold_constants(launches, self._template, constant_slots, keep, backend,
                                             drop_weights=not program.methods)
                folded.append((rest, which))
            return folded[0]

        def build(launches: list[Launch], keep: set[int]):
            rest, which = fold(launches)
            fn = compile_launches(rest, keep, name="run_" + backend.name)
            fn.folded = which
            return fn

        t0 = time.perf_counter()
        if cache:
            launches, self._plan, self.plan_source = cached_plan(program, backend, self.num_slots, keep, lower, build)
        else:
            launches = lower()
            self._plan, self.plan_source = build(launches, keep), "compiled"
        self.launches, which = fold(launches)
        if getattr(self._plan, "folded", frozenset()) != which:
            self._plan = build(launches, keep)
        self.compile_timings["plan"] = time.perf_counter() - t0
        self.folded_launches = len(which)
        return keep

    @property
    def segments(self) -> list[Segment]:
        """The plan split at the ops run through eager torch (``fallback.*``), which a CUDA graph
        cannot hold: regions captured one by one, those ops run between them (made on first use)."""
        if self._segments is None:
            if any(is_fallback(launch.op) for launch in self.launches):
                self._segments = split_plan(self.launches, self.kept_slots, lambda l: is_fallback(l.op),
                                            name="segment_" + self.backend.name + "_")
            else:   # one region: the plan's own function (generating another costs ~0.1 s per capture)
                self._segments = [Segment(False, self.launches, set(self.kept_slots), self._plan)]
        return self._segments

    def new_session(self) -> Session:
        """A fresh session: state buffers copied from the program's initial values onto the device."""
        return Session(self, {name: self.backend.new_state(t) for name, t in self.program.state_init.items()})

    def __call__(self, *args, **kwargs):
        return self.run(self.session, args, kwargs)

    def method(self, name: str) -> Session:
        """The program's entry point ``name`` on this executable's session (its state shared): call it
        like the executable. ``exe.method("prefill")(ids, pos)`` on a causal LM."""
        return self.session.method(name)

    def generate(self, ids, max_new_tokens: int, **options):
        """Generate tokens with a program made by ``ostinato.llm.export_causal_lm`` (its prefill and
        decode methods); see ``ostinato.llm.generate`` for the options."""
        from ..llm.generate import generate   # the LM layer sits above the runtime: imported on use
        return generate(self, ids, max_new_tokens, **options)

    def check_inputs(self, args: tuple, kwargs: dict | None) -> tuple[list, dict[str, int]]:
        """The flattened inputs and the size-symbol bindings they imply; InputError when they do not fit."""
        leaves = self._checker.flatten(args, kwargs or {})
        return leaves, self._checker.check(leaves)

    def bind(self, session: Session, leaves: list) -> list:
        """A run's environment: constants, the inputs (made contiguous, as at export) and the state."""
        env = list(self._template)
        for pos, slot in self._input_slots:
            x = leaves[pos]
            # The graph was traced with contiguous example inputs; its views may rely on that layout.
            env[slot] = x.contiguous() if type(x) is torch.Tensor and not x.is_contiguous() else x
        state = session.state
        for slot, name in self._state_slots:
            env[slot] = state[name]
        if self._converts:
            backend = self.backend
            for _, slot in self._input_slots:
                env[slot] = backend.from_host(env[slot])
            for slot, _ in self._state_slots:
                env[slot] = backend.state_value(env[slot])
        return env

    def mutation_targets(self, session: Session, leaves: list) -> list[tuple[torch.Tensor, int]]:
        """(tensor, slot): after a run each tensor (a state buffer or a mutated input) holds the slot's value."""
        return [(session.state[name] if role == "state" else leaves[self._input_pos_by_slot[target]], new)
                for role, target, name, new in self._mutations]

    def outputs(self, env: list):
        """The user's outputs, structured like the eager module's, from a finished run's environment."""
        outs = [env[x] if is_slot else x for is_slot, x in self._outputs]
        if self._converts:
            outs = [self.backend.to_host(x) for x in outs]
        return pytree.tree_unflatten(outs, self.program.out_spec)

    @torch.no_grad()
    def run(self, session: Session, args: tuple, kwargs: dict | None = None):
        target = capturing.target
        if self.runner is not None and target is None:
            return self.runner(session, args, kwargs)
        leaves, bindings = self.check_inputs(args, kwargs)
        if target is not None:
            return target.capture(self, session, leaves, bindings)
        return self.step(session, leaves)

    def step(self, session: Session, leaves: list):
        """One call op by op on checked inputs (no replay): the plan, the state and input writes once,
        new output tensors. Also what a replayed call runs while its capture waits for kernel compiles."""
        env = self.bind(session, leaves)
        state = session.state
        if self._converts:
            return self._run_converting(session, leaves, env)
        self._plan(env)
        # reinplaced writes already updated the buffer itself; the rest are copied back (batched)
        write_state([(state[name] if role == "state" else leaves[self._input_pos_by_slot[target_slot]],
                      env[new_slot]) for role, target_slot, name, new_slot in self._mutations])
        return self.outputs(env)

    def _run_converting(self, session: Session, leaves: list, env: list):
        """``run`` on a backend whose values are its own (MLX): the plan in the backend's scope, then one
        materialization of the outputs and the new state, then the outputs converted."""
        backend = self.backend
        scope = backend.run_scope()
        if scope is None:
            self._plan(env)
        else:
            with scope:
                self._plan(env)
        news = [env[m[3]] for m in self._mutations]
        backend.materialize([env[x] for is_slot, x in self._outputs if is_slot] + news)
        state = session.state
        for (role, target_slot, name, _), new in zip(self._mutations, news):
            if role == "state":
                state[name].copy_(new)
            else:
                leaves[self._input_pos_by_slot[target_slot]].copy_(backend.to_host(new))
        return self.outputs(env)

    def stats(self) -> dict[str, float]:
        """Plan source and, with replay, captures, replays, bucket hits and plan hits/misses; the backend's
        kernel compiles (process-wide: compiled, from the cache, seconds, calls deferred, in flight)."""
        counts = {"launches": len(self.launches), "compile_seconds": self.compile_seconds,
                  "folded_launches": self.folded_launches,
                  "kernels": sum(1 for l in self.launches if launch_is_kernel(l)),
                  "fused_kernels": sum(1 for l in self.launches if l.op == "ost.fused"),
                  # launches a backend runs through torch instead of its own kernels (MLX's bridge)
                  "torch_bridged": sum(1 for l in self.launches if getattr(l.fn, "bridged", False))}
        if self.runner is not None:
            counts.update(self.runner.stats())
        counts.update(self.backend.kernel_stats())
        return counts

    def memory_report(self) -> list:
        """A runtime.memory.MemoryReport per capture made so far (replay=True, or ostinato.graph)."""
        return list(self.capture_reports)

    def static_inputs(self, session: Session | None = None):
        """With replay=True: the static input tensors of the session's last capture, as the call's
        positional arguments (``(args, kwargs)`` for a program called with keywords). Write into them
        and call ``exe(*args)``: no copy is made."""
        if self.runner is None:
            raise OstinatoError("static_inputs() needs an executable compiled with replay=True")
        return self.runner.static_inputs(session or self.session)

    def __repr__(self) -> str:
        return (f"<ostinato.Executable {self.program.info.get('model', '')} on {self.backend.label or self.device}: "
                f"{len(self.launches)} launches>")


def compile(program: Program, device: str | torch.device = "cpu", *, cache: bool = True,
            strict: bool = False) -> Executable:
    """Lower ``program`` for ``device`` and return an Executable.

    With ``cache`` (the default) the lowered plan is looked up by content in the compile cache
    (``ostinato.cache``: memory, disk, Redis) and stored there on a miss; ``exe.plan_source`` says
    whether it was "compiled", read from the "cache", or reused from this process's "memory".
    ``strict``: refuse ops the backend would run through torch rather than its own kernels (MLX).
    """
    warming = _warm_cuda_libraries(program, device)
    try:
        with paused_gc():     # a full collection over every object in the process (ir/bulk.py)
            return Executable(program, get_backend(device, strict=strict), cache=cache)
    finally:
        if warming is not None:
            warming.join()


def _warm_early(graph) -> None:
    """reader.DECODED_HOOKS: CUDA's library warm-up started by ``load`` (backends/cuda/warm.start_early)."""
    if torch.cuda.is_initialized():         # (else backends.cuda is not imported: a CPU process)
        from ..backends.cuda import warm
        warm.start_early(graph)


def _warm_cuda_libraries(program: Program, device):
    """The CUDA library warm-up thread (backends/cuda/warm.py) for ``program`` on a CUDA ``device``,
    started before the backend's modules are imported (about 0.03 s of a warm start's critical path,
    which cuBLAS's set-up in the thread then overlaps); None for other devices. ``compile`` joins it."""
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError):
        return None     # (get_backend names the bad device)
    if dev.type != "cuda" or not torch.cuda.is_available():
        return None
    from ..backends.cuda import warm
    return warm.start(program.graph, dev)


DECODED_HOOKS.append(_warm_early)
