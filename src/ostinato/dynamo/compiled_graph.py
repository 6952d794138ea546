"""One Dynamo graph lowered by ostinato: the callable the backend hands back to Dynamo."""
from __future__ import annotations

import dataclasses
import logging
import operator
from typing import Any, Callable

import torch
from torch._subclasses.fake_tensor import unset_fake_temporarily
from torch.utils import _pytree as pytree

from ..errors import InputError, first_line
from ..frontend import export
from ..passes.manager import default_pipeline
from ..program import Program
from ..replay import compile as compile_program
from ..runtime import Executable, Session
from ..runtime.packing import live_weights
from . import stats
from .graph_inputs import DynamoGraph, Placeholder, Role, call_inputs, classify, dynamic_shapes

log = logging.getLogger("ostinato")

# Programs kept per graph for sizes its dynamic program does not cover, and re-exports allowed for
# replaced model tensors or changed floats; past these the graph runs eagerly (a model that changes
# them on every call would otherwise export on every call).
MAX_SPECIALIZATIONS = 8
MAX_REBUILDS = 4


@dataclasses.dataclass(frozen=True)
class Settings:
    """The backend's options (``torch.compile(..., options={...})``), resolved."""

    replay: bool | None = None          # None: on for CUDA, off for the CPU
    clone_outputs: bool | None = None   # None: when replaying (captured outputs are overwritten next call)
    cache: bool = True                  # ostinato's compile cache (memory, disk, Redis)
    eager_fallback: bool = True         # False: raise when ostinato cannot take a graph
    device: str | None = None           # compile for this device ("mlx", "mlx:gpu", ...) instead of the inputs'


def _device_of(placeholders: list[Placeholder]) -> torch.device:
    tensors = [p.example for p in placeholders if isinstance(p.example, torch.Tensor)]
    call = [p.example for p in placeholders if p.role is Role.ARG and isinstance(p.example, torch.Tensor)]
    for t in call + tensors:
        if t.device.type != "cpu":
            return t.device
    return torch.device("cpu")


class CompiledGraph:
    """Calls the graph's ostinato Executable with the call's inputs (the model's own tensors are held
    by the program); checks on each call that the model's tensors are the ones it holds."""

    def __init__(self, gm: torch.fx.GraphModule, example_inputs: list, settings: Settings, name: str):
        self.gm = gm
        self.name = name
        self.settings = settings
        self.rebuilds = 0
        self._demoted: frozenset[int] = frozenset()
        self._build(example_inputs)

    # -- building ---------------------------------------------------------------------------------

    def _build(self, example_inputs: list) -> None:
        placeholders = classify(self.gm, example_inputs, self._demoted)
        self.placeholders = placeholders
        self.module = DynamoGraph(self.gm, placeholders)
        self.device = _device_of(placeholders)
        self.replay = self.settings.replay if self.settings.replay is not None else self.device.type == "cuda"
        clone = self.settings.clone_outputs
        self.clone_outputs = self.replay if clone is None else clone
        self.program = self._export(placeholders)
        self.executable = self._compile(self.program)
        self.special: dict[tuple, Executable] = {}
        self._arg_pos = [p.index for p in placeholders if p.role is Role.ARG]
        held = [p for p in placeholders if p.role in (Role.WEIGHT, Role.STATE)]
        self._held_pos = [p.index for p in held]
        self._held = tuple(p.example for p in held)
        self._get_held = operator.itemgetter(*self._held_pos) if len(held) > 1 else None
        self._floats = [(p.index, p.example) for p in placeholders if p.role is Role.FLOAT]

    def _export(self, placeholders: list[Placeholder]) -> Program:
        """Every dim Dynamo made dynamic symbolic; failing that (torch.export cannot solve some size
        relations, e.g. pooled then upsampled heights), only the leading (batch) dims; failing that,
        every size fixed (one program per size, made on demand)."""
        inputs = call_inputs(placeholders)
        attempts = [dynamic_shapes(placeholders), dynamic_shapes(placeholders, only_dim0=True)]
        attempts = [d for k, d in enumerate(attempts) if d is not None and d not in attempts[:k]]
        for dynamic in attempts:
            try:
                return _export_outside_dynamo(self.module, inputs, dynamic)
            except Exception as e:
                log.info("torch.compile backend: %s: export with dynamic %s failed (%s: %s)",
                         self.name, _dims_text(dynamic), type(e).__name__, first_line(e))
        if attempts:
            stats.count(static_exports=1)
        return _export_outside_dynamo(self.module, inputs, None)

    def _compile(self, program: Program) -> Executable:
        s = self.settings
        # The executable's constants alias the model's tensors, and in-place updates of those
        # (load_state_dict) must reach every value computed from them: no packing copy, no folding.
        with live_weights():
            exe = compile_program(program, s.device or self.device, cache=s.cache, replay=self.replay)
        # Buffers the graph writes (KV caches) are program state: the session uses the model's own
        # tensors, so the writes land where the model (and the code around the graph) reads them.
        held = dict(self.module.named_buffers())
        state = {}
        for name in program.state_init:
            tensor = held.get(name)
            if tensor is None or tensor.device.type != exe.device.type:
                log.warning("torch.compile backend: %s: state %s is not a model tensor on %s; its updates "
                            "stay inside ostinato, the model's copy is not written", self.name, name, exe.device)
                return exe
            # A backend with buffers of its own (MLX) keeps one that writes through to the model's tensor.
            state[name] = exe.backend.adopt_state(tensor)
        exe.session = Session(exe, state)
        return exe

    # -- calling ----------------------------------------------------------------------------------

    def __call__(self, *args: Any) -> Any:
        if self._held_pos and not self._holds_same(args):
            self._rebuild(args, "a parameter or buffer was replaced")
        for pos, value in self._floats:
            if float(args[pos]) != value:
                self._rebuild(args, "a Python float the graph reads changed")
                break
        inputs = [args[i] for i in self._arg_pos]
        exe = self.executable
        if self.special:
            exe = self.special.get(_signature(inputs), exe)
        try:
            out = exe(inputs)
        except InputError:
            if exe is not self.executable:
                raise
            out = self._specialize(inputs)(inputs)
        stats.count(calls=1)
        if self.clone_outputs:
            out = pytree.tree_map_only(torch.Tensor, torch.Tensor.clone, out)
        return out

    def _holds_same(self, args: tuple) -> bool:
        if self._get_held is None:
            return args[self._held_pos[0]] is self._held[0]
        return all(map(operator.is_, self._get_held(args), self._held))

    def _rebuild(self, args: tuple, why: str) -> None:
        """Export again with the call's values; a replaced tensor is passed on every call from now on."""
        self.rebuilds += 1
        stats.count(rebuilds=1)
        if self.rebuilds > MAX_REBUILDS:
            raise _GiveUp(f"{why} ({self.rebuilds} re-exports)")
        replaced = {pos for pos, obj in zip(self._held_pos, self._held) if args[pos] is not obj}
        self._demoted = self._demoted | replaced
        log.info("torch.compile backend: %s: %s; exporting it again", self.name, why)
        try:
            self._build(list(args))
        except Exception as e:
            raise _GiveUp(f"{why} and exporting it again failed: {type(e).__name__}: {first_line(e)}") from e

    def _specialize(self, inputs: list) -> Executable:
        """A program with every size fixed, for inputs the graph's program does not take."""
        if len(self.special) >= MAX_SPECIALIZATIONS:
            raise _GiveUp(f"more than {MAX_SPECIALIZATIONS} input signatures outside its dynamic program")
        log.info("torch.compile backend: %s: inputs outside its program's sizes; exporting a program "
                 "for %s", self.name, _signature(inputs))
        stats.count(specializations=1)
        try:
            exe = self._compile(_export_outside_dynamo(self.module, inputs, None))
        except Exception as e:
            raise _GiveUp(f"exporting it for {_signature(inputs)} failed: {type(e).__name__}: "
                          f"{first_line(e)}") from e
        self.special[_signature(inputs)] = exe
        return exe


def _export_outside_dynamo(module: DynamoGraph, inputs: list, dynamic: tuple | None) -> Program:
    """ostinato.export, cut off from the Dynamo compilation that calls the backend: torch.export would
    otherwise trace with Dynamo's fake mode and its shape environment (whose symbols then leak into a
    static export, and whose guards are not ours)."""
    stats.count(exports=1)
    # torch.export marks its example tensors for Dynamo (_dynamo_weak_dynamic_indices) and leaves the
    # marks when it fails; on the caller's tensors they would change how torch.compile treats them
    # later (and a failed dynamic export would make the static retry dynamic). Aliases take the marks.
    inputs = [x.detach() if isinstance(x, torch.Tensor) else x for x in inputs]
    # No norm folded into projections (passes/fold_norms.py): the executable's weights stay the model's own
    # (live_weights), and a folded copy would not follow their in-place updates.
    passes = [p for p in default_pipeline((inputs,)) if p[0] != "fold_norms"]
    with torch._guards.tracing(None), unset_fake_temporarily():
        return export(module, (inputs,), dynamic_shapes=dynamic, passes=passes)


class _GiveUp(Exception):
    """The graph should run eagerly from now on (raised inside a call, handled by EagerOnFailure)."""


def _dims_text(dynamic: tuple) -> str:
    return "; ".join(f"input {k} dims {sorted(spec)}" for k, spec in enumerate(dynamic[0]) if spec)


def _signature(inputs: list) -> tuple:
    return tuple((tuple(x.shape), x.dtype) if isinstance(x, torch.Tensor) else x for x in inputs)


class EagerOnFailure:
    """Runs a CompiledGraph; when it gives up (a re-export failed, or too many were needed), logs why and
    runs the graph eagerly from then on (or raises, with ``eager_fallback=False``)."""

    def __init__(self, compiled: CompiledGraph, eager: Callable, allow_eager: bool):
        self.compiled = compiled
        self.eager = eager
        self.allow_eager = allow_eager
        self.on_ostinato = True

    def __call__(self, *args: Any) -> Any:
        if self.on_ostinato:
            try:
                return self.compiled(*args)
            except _GiveUp as e:
                self._give_up(str(e), e)
        stats.count(eager_calls=1)
        return self.eager(*args)

    def _give_up(self, reason: str, error: Exception) -> None:
        name = self.compiled.name
        if not self.allow_eager:
            raise RuntimeError(f"ostinato torch.compile backend: {name}: {reason}. Fix: pass "
                               "options={'eager_fallback': True} to run such graphs eagerly") from error
        log.warning("torch.compile backend: %s: %s; running it eagerly from now on", name, reason)
        stats.record_fallback(name, reason)
        stats.count(compiled=-1, eager=1)
        self.on_ostinato = False
