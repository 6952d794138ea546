"""MLX backend: ostinato programs on Apple GPUs (and on MLX's CPU build, which CI runs).

Lowering maps each IR node to its handler in ``ops.HANDLERS`` (mlx.core ops; fused ops through
``mx.fast``); the plan runs over MLX arrays, lazily, and one ``mx.eval`` per call computes the outputs
and the new state together. A call takes and returns torch CPU tensors (the caller's side stays
torch): inputs are copied into MLX arrays, outputs are tensors over MLX's memory (no copy). State
buffers are MLXBuffer cells owned by sessions; weights are MLX arrays shared by every session.
Replay compiles the plan with ``mx.compile`` per shape signature (``replay.py``).
"""
from __future__ import annotations

import logging
from typing import Any, Callable

import torch

import mlx.core as mx

from ...errors import BackendError, UnsupportedOpError
from ...ir import Node, get_op
from ..base import Backend, Launch
from ..cpu.backend import returns_sequence
from .convert import MLXBuffer, host, to_mx
from .ops import HANDLERS, MULTI, bridge
from .rope import ROPE_PROOF, fast_rope_kwargs
from .ops_nn import adaptive_max_supported, batch_norm_supported, conv_supported, grid_sample_supported

log = logging.getLogger("ostinato")

# Ops whose handler covers only some of their forms: the predicate says whether a node is one of them
# (the others run through torch; the handler itself dispatches so that cached plans stay right).
def _plain_index(node) -> bool:
    """Boolean-mask indices give data-dependent shapes: those run through torch."""
    indices = node.args[1] if len(node.args) > 1 else ()
    return not any(i is not None and _is_bool(i) for i in indices)


def _is_bool(v) -> bool:
    if type(v) is mx.array:
        return v.dtype == mx.bool_
    return getattr(getattr(v, "meta", None), "dtype", None) == torch.bool


_PARTIAL: dict[str, Callable[[Node], bool]] = {
    "aten.index.Tensor": _plain_index,
    "aten.convolution": conv_supported,
    "aten.native_batch_norm": batch_norm_supported,
    "aten.adaptive_max_pool2d": adaptive_max_supported,
    "aten.grid_sampler_2d": grid_sample_supported,
}


def runs_through_torch(node: Node) -> bool:
    """Whether the MLX backend runs ``node`` through torch (no handler, or a form its handler lacks)."""
    if node.op not in HANDLERS:
        return True
    check = _PARTIAL.get(node.op)
    return check is not None and not check(node)


def torch_reason(node: Node) -> str:
    if node.op not in HANDLERS:
        return "no MLX handler for this op"
    return "this form of the op has no MLX handler"


class MLXBackend(Backend):
    name = "mlx"
    own_capture = True

    def __init__(self, kind: str | None = None, strict: bool = False):
        # A call's inputs and outputs are torch tensors on the host: that is the executable's device.
        super().__init__(torch.device("cpu"))
        gpu = mx.metal.is_available() if hasattr(mx, "metal") else False
        if kind is None:
            kind = "gpu" if gpu else "cpu"
        if kind not in ("cpu", "gpu"):
            raise BackendError(f"device 'mlx:{kind}' is not an MLX device; use 'mlx', 'mlx:cpu' or 'mlx:gpu'")
        if kind == "gpu" and not gpu:
            raise BackendError("device 'mlx:gpu' asked for, but this MLX build has no Metal GPU (MLX "
                               f"{mx.__version__}, the CPU build); use device='mlx:cpu', or run on a Mac")
        self.kind = kind
        self.label = f"mlx:{kind}"
        self.mlx_device = mx.Device(mx.gpu if kind == "gpu" else mx.cpu)
        self.strict = strict

    # -- lowering -------------------------------------------------------------------------------------
    def lower(self, node: Node) -> Launch:
        op, kwargs = self.op_and_kwargs(node)
        through_torch = runs_through_torch(node)
        if through_torch and op.category == "inplace":
            raise BackendError(f"the mlx backend cannot run {node.op} (node {node.name}, {node.source}): it "
                               "writes an argument in place, and an MLX array cannot be written through torch. "
                               "Fix: use the op's functional form in the model, or compile for 'cpu'")
        if through_torch:
            if self.strict:
                raise UnsupportedOpError(
                    [(node.op, node.source or node.name)],
                    f"The mlx backend would run it through torch ({torch_reason(node)}) and strict=True "
                    "refuses that. Fix: compile without strict=True, or add a handler in backends/mlx/ops_*.py")
        if node.op == "ost.rope" and not through_torch:
            kwargs.update(fast_rope_kwargs(node))
        if not through_torch and node.op not in MULTI and len(node.outputs) == 1 and node.outputs[0] is not None \
                and node.outputs[0].is_tensor:
            kwargs["_dt"] = node.outputs[0].meta.dtype
        fn = _bridged(node.op) if through_torch else self.kernel(node.op)
        return Launch(fn, node, node.args, kwargs,
                      node.op in MULTI or (node.op not in HANDLERS and returns_sequence(node.op)))

    def kernel(self, op: str) -> Callable:
        fn = HANDLERS.get(op)
        if fn is not None:
            partial = _PARTIAL.get(op)
            return fn if partial is None else _dispatching(fn, op)
        return _bridged(op)

    def through_torch(self, node: Node) -> str:
        return super().through_torch(node) or (torch_reason(node) if runs_through_torch(node) else "")

    def target(self) -> dict[str, str]:
        from ...cache.keys import cpu_arch
        arch = cpu_arch() if self.kind == "cpu" else mx.device_info().get("architecture", "metal")
        return {"backend": "mlx", "arch": f"{self.kind}-{arch}"}

    def plan_key_parts(self) -> dict[str, str]:
        # "rope": lowering writes rope.py's proof into ost.rope's keywords; a plan lowered by another
        # version of that proof is not reused.
        return {"mlx": mx.__version__, "mlx_device": self.kind, "strict": str(self.strict), "rope": ROPE_PROOF}

    # -- values at the plan's edges ---------------------------------------------------------------------
    def place(self, tensor: torch.Tensor) -> Any:
        return to_mx(tensor)

    def from_host(self, x: Any) -> Any:
        return to_mx(x, borrowed=True) if type(x) is torch.Tensor else x

    def to_host(self, x: Any) -> Any:
        return host(x)

    def new_state(self, init: torch.Tensor) -> MLXBuffer:
        return MLXBuffer(to_mx(init))

    def adopt_state(self, tensor: torch.Tensor) -> MLXBuffer:
        return MLXBuffer(to_mx(tensor, borrowed=True), mirror=tensor)

    def state_value(self, buf: Any) -> Any:
        return buf.array if type(buf) is MLXBuffer else buf

    def materialize(self, values: list) -> None:
        mx.eval([v for v in values if type(v) is mx.array])

    def run_scope(self):
        """The MLX device as the default for the plan's ops, when it is not already."""
        if mx.default_device() == self.mlx_device:
            return None
        return mx.stream(self.mlx_device)

    def capture(self, exe, session, leaves: list, env: list, signature: str):
        from .replay import capture_compiled
        return capture_compiled(self, exe, session, leaves, env, signature)

    def synchronize(self) -> None:
        mx.synchronize()


_BRIDGES: dict[str, Callable] = {}


def _bridged(op: str) -> Callable:
    fn = _BRIDGES.get(op)
    if fn is None:
        fn = _BRIDGES[op] = bridge(get_op(op).target, op)
    return fn


def _dispatching(fn: Callable, op: str) -> Callable:
    """``fn``, or torch for the forms of ``op`` it lacks (decided from the call's own arguments)."""
    torch_fn = _bridged(op)

    def run(*args, _dt=None, **kwargs):
        node = _ArgsView(op, args, kwargs)
        if _PARTIAL[op](node):
            return fn(*args, _dt=_dt, **kwargs) if op not in MULTI else fn(*args, **kwargs)
        return torch_fn(*args, **kwargs)
    run.__name__ = fn.__name__
    return run


class _ArgsView:
    """What the form predicates read of a node (op, args, kwargs), from a call's arguments."""

    __slots__ = ("op", "args", "kwargs")

    def __init__(self, op: str, args: tuple, kwargs: dict):
        self.op, self.args, self.kwargs = op, args, kwargs
