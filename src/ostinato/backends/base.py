"""The backend contract: turn IR nodes into Launches, place tensors, synchronize.

A Launch is a kernel with its arguments pre-bound: constants stay in place, Values become slot
indices into the runtime's environment list; running a plan of them consults no IR.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, Callable, Iterator

import torch

from ..errors import BackendError
from ..ir import Node, Value, get_op


class _Slot:
    __slots__ = ("i",)

    def __init__(self, i: int):
        self.i = i


class _SlotList:
    """A list argument some of whose items are Values (``cat``'s tensors, ``index``'s indices)."""

    __slots__ = ("items",)

    def __init__(self, items: list):
        self.items = items


def slot_reads(launch: "Launch") -> Iterator[int]:
    """The slots a launch reads, in argument order (items of list arguments included)."""
    for a in (*launch.args, *launch.kwargs.values()):
        yield from arg_slots(a)


def arg_slots(a: Any) -> Iterator[int]:
    """The slots one bound argument reads (a list argument's items)."""
    for x in (a.items if type(a) is _SlotList else (a,)):
        if type(x) is _Slot:
            yield x.i


def resolve(a: Any, env: list) -> Any:
    """A launch argument with its slots read from ``env``."""
    if type(a) is _Slot:
        return env[a.i]
    if type(a) is _SlotList:
        return [resolve(x, env) for x in a.items]
    return a


def _bind(a: Any) -> Any:
    if isinstance(a, Value):
        return _Slot(a.slot)
    if isinstance(a, (list, tuple)) and any(isinstance(x, Value) for x in a):
        return _SlotList([_bind(x) for x in a])
    return a


class Launch:
    """One kernel call, ``fn(*args, **kwargs)``, with Values bound to slots and results stored into
    ``outs`` (-1 where a result is unused). The runtime compiles a Plan's Launches into one function
    (runtime/codegen.py; a plan's first runs loop over them instead)."""

    __slots__ = ("fn", "args", "kwargs", "outs", "unpack", "name", "op")

    def __init__(self, fn: Callable, node: Node, args: tuple, kwargs: dict, unpack: bool):
        self.fn = fn
        self.name = node.name
        self.op = node.op
        self.args = tuple(_bind(a) for a in args)
        self.kwargs = {k: _bind(a) for k, a in kwargs.items()}
        self.outs = tuple(-1 if o is None else o.slot for o in node.outputs)
        self.unpack = unpack

    @classmethod
    def of(cls, fn: Callable, op: str, name: str, args: tuple, kwargs: dict, outs: tuple[int, ...],
           unpack: bool) -> "Launch":
        """A Launch from already-bound parts (a cached plan), without its IR node."""
        launch = cls.__new__(cls)
        launch.fn, launch.op, launch.name = fn, op, name
        launch.args, launch.kwargs, launch.outs, launch.unpack = args, kwargs, outs, unpack
        return launch

    def __repr__(self) -> str:
        return f"Launch({self.name}: {self.op})"


def fused_launches(backend: "Backend", graph, fused_fn: Callable) -> list[Launch]:
    """The graph's Launches with each fusion group of ostinato.codegen's scheduler as one ``ost.fused``
    launch of ``fused_fn`` (the group's spec, then its inputs); other nodes through ``backend.lower``."""
    from .. import codegen
    launches = []
    for item in codegen.schedule(graph, backend.channels_last):
        if isinstance(item, codegen.FusionGroup):
            args = (item.spec.to_json(), *(_bind(v) for v in item.inputs))
            launches.append(Launch.of(fused_fn, "ost.fused", item.name, args, {},
                                      tuple(v.slot for v in item.outputs), True))
        else:
            launches.append(backend.lower(item))
    return launches


class Backend(ABC):
    """What a device needs to provide to run ostinato programs."""

    name: str = ""
    # Names of the convolutions the lowering in progress runs channels-last (backends/cuda/layout.py).
    channels_last: frozenset = frozenset()

    def __init__(self, device: torch.device):
        self.device = device

    @abstractmethod
    def lower(self, node: Node) -> Launch:
        """A Launch running ``node``; raises BackendError naming the op when it cannot."""

    def op_and_kwargs(self, node: Node):
        """``node``'s op definition and its keywords for this backend: creation ops recorded the export
        device, and run on this backend's. BackendError naming the op when the op table lacks it."""
        op = get_op(node.op)
        if op is None:
            raise BackendError(f"the {self.name or type(self).__name__} backend has no kernel for {node.op} (node "
                               f"{node.name}, {node.source}); export a model without it or add the op to "
                               "ir/aten_ops.py")
        kwargs = dict(node.kwargs)
        if "device" in kwargs:
            kwargs["device"] = self.device
        return op, kwargs

    def lower_graph(self, graph) -> list[Launch]:
        """The Launches of a whole graph, in order: one per node here; a backend that generates fused
        kernels (CUDA) groups nodes first."""
        return [self.lower(n) for n in graph.nodes]

    def through_torch(self, node: Node) -> str:
        """Why this backend runs ``node`` through eager torch instead of its own kernels ("" when it
        does not): ops ostinato lacks (``fallback.*``) everywhere; on MLX, ops it has no handler for."""
        if node.op.startswith("fallback."):
            from ..ir import get_op
            op = get_op(node.op)
            return (op.reason if op is not None else "") or "an op ostinato has no kernel for"
        return ""

    def target(self) -> dict[str, str]:
        """What this backend compiles for, in cache keys: ``{"backend", "arch"}``."""
        from ..cache.keys import current_target
        return current_target(self.name, self.device.index or 0)

    def plan_key_parts(self) -> dict[str, str]:
        """What, besides the program and the device, decides this backend's lowering (the plan cache's key)."""
        return {}

    @abstractmethod
    def kernel(self, op: str) -> Callable:
        """The callable a Launch of ``op`` runs (what ``lower`` binds), for plans read from a cache."""

    def place(self, tensor: torch.Tensor) -> torch.Tensor:
        """The tensor on this backend's device; no copy when it already lives there."""
        return tensor if tensor.device == self.device else tensor.to(self.device)

    def upload_bytes(self, src: torch.Tensor) -> torch.Tensor:
        """A 1-d uint8 host tensor (a run of a loaded program's mapped data segment: many weights at once)
        copied to this backend's device; runtime/packing.py makes the weights views of the result."""
        return src.to(self.device)

    def synchronize(self) -> None:
        """Wait for every launch issued so far."""

    def warm_libraries(self, graph):
        """Start setting up the libraries ``graph`` will call in a background thread, returned for the
        caller to join once ``graph`` is compiled (CUDA: cuBLAS and cuDNN, warm.py); None by default."""
        return None

    def kernel_stats(self) -> dict[str, float]:
        """Process-wide counts of the kernels this backend compiled or read from the cache (empty where
        it compiles none)."""
        return {}

    # -- the plan's edges. A backend whose values are not torch tensors (MLX arrays) converts here;
    # the defaults are torch's, identities where a plan's values are the caller's tensors.
    label: str = ""     # how the device is named to users when torch.device cannot say it ("mlx:cpu")
    own_capture = False  # whether ``capture`` below replaces the generic capture

    def from_host(self, x: Any) -> Any:
        """A call's input tensor as the plan reads it (already checked against the program's spec)."""
        return x

    def to_host(self, x: Any) -> Any:
        """A plan's value (an output, a mutated input's new value) as the caller receives it."""
        return x

    def new_state(self, init: torch.Tensor) -> Any:
        """A session's own buffer for a state value, starting at ``init``. It answers ``copy_(value)``
        (a run's write, ``reset``) and ``clone()``."""
        return self.place(init).clone()

    def adopt_state(self, tensor: torch.Tensor) -> Any:
        """A session buffer that *is* ``tensor`` for the code around the program (torch.compile's
        state: the model's own buffer), or one whose every write reaches it."""
        return tensor

    def state_value(self, buf: Any) -> Any:
        """What the plan reads for a session's state buffer."""
        return buf

    def materialize(self, values: list) -> None:
        """After a run: compute ``values`` (outputs and new state) where the backend is lazy (MLX)."""

    def run_scope(self):
        """A context manager every run enters (MLX: the device's stream), or None."""
        return None

    def capture(self, exe, session, leaves: list, env: list, signature: str):
        """A capture of its own (MLX: mx.compile of the plan): ``(replay, static_env, source)``; None
        takes the generic one (the CPU tape, a CUDA graph)."""
        return None
