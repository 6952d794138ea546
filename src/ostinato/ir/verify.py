"""The IR verifier: structural rules, and (optionally) shapes and dtypes re-derived op by op."""
from __future__ import annotations

import logging
from typing import Mapping

import torch

from ..errors import GraphError
from .graph import Graph, Node, Value, iter_values, map_values
from .ops import get_op
from .types import DTYPE_NAMES, SymDim, TensorMeta


def _fail(node: Node | None, msg: str) -> GraphError:
    where = f"node {node.name} ({node.op})" if node is not None else "graph"
    src = f" [{node.source}]" if node is not None and node.source else ""
    return GraphError(f"invalid IR at {where}{src}: {msg}")


def _check_meta(g: Graph, v: Value, node: Node | None) -> None:
    if not isinstance(v.meta, TensorMeta):
        return
    if v.meta.dtype not in DTYPE_NAMES:
        raise _fail(node, f"value %{v.name} has unsupported dtype {v.meta.dtype}")
    for d in v.meta.shape:
        if isinstance(d, SymDim):
            unknown = [s for s in d.symbols if s not in g.symbols]
            if unknown:
                raise _fail(node, f"value %{v.name} uses undeclared size symbol(s) {unknown}")
        elif not isinstance(d, int) or d < 0:
            raise _fail(node, f"value %{v.name} has invalid dim {d!r}")


def verify(g: Graph, check_shapes: bool = False, hints: Mapping[str, int] | None = None) -> None:
    """Raise GraphError unless every rule holds.

    Rules: ops are registered; every Value is defined before use and defined once; metadata uses
    known dtypes and declared symbols; outputs and mutations refer to defined Values, and a mutation
    keeps its target's dtype and shape. With ``check_shapes``, every op is re-run on fake tensors at
    the symbols' ``hints`` and must reproduce the recorded dtypes and shapes.
    """
    defined: set[int] = set()
    for v in g.constants + g.inputs + g.state:
        if v.id in defined:
            raise _fail(None, f"value %{v.name} declared twice")
        _check_meta(g, v, None)
        defined.add(v.id)
    for node in g.nodes:
        if get_op(node.op) is None:
            raise _fail(node, f"unknown op {node.op!r}")
        for v in node.inputs:
            if v.id not in defined:
                raise _fail(node, f"reads %{v.name} before it is defined")
        for o in node.outputs:
            if o is None:
                continue
            if o.id in defined:
                raise _fail(node, f"redefines %{o.name}")
            if o.producer is not node:
                raise _fail(node, f"output %{o.name} does not name this node as its producer")
            _check_meta(g, o, node)
            defined.add(o.id)
    for o in g.output_values():
        if o.id not in defined:
            raise _fail(None, f"output %{o.name} is never defined")
    for target, new in g.mutations:
        if target.role not in ("state", "input"):
            raise _fail(None, f"mutation target %{target.name} is a {target.role}, not state or an input")
        if new.id not in defined:
            raise _fail(None, f"mutation of %{target.name} reads undefined %{new.name}")
        if str(target.meta) != str(new.meta):
            raise _fail(None, f"mutation of %{target.name} ({target.meta}) by %{new.name} ({new.meta}) "
                              "changes its dtype or shape")
    if check_shapes:
        _check_shapes(g, hints or {})


def _check_shapes(g: Graph, hints: Mapping[str, int]) -> None:
    # Symbols without a hint (data-dependent sizes such as u0) cannot be re-derived; nodes whose
    # outputs use them are taken as recorded.
    unknown = {s for s in g.symbols if s not in hints}
    hints = {**{s: 2 for s in unknown}, **hints}  # placeholder sizes for tensors that carry them
    # Fake tensors, not the meta device: fake kernels reproduce the CPU kernels' output strides and
    # shapes (meta kernels differ for some ops, e.g. SDPA's layout and batch norm's saved stats).
    from torch._subclasses.fake_tensor import FakeTensorMode
    fake_log = logging.getLogger("torch._subclasses.fake_tensor")
    level = fake_log.level
    fake_log.setLevel(logging.CRITICAL)  # a failing op is reported as a GraphError, not a logged trace
    try:
        with FakeTensorMode(allow_non_fake_inputs=False):
            _propagate(g, hints, unknown)
    finally:
        fake_log.setLevel(level)


def _check_dim_args(node, schema, args, kwargs) -> None:
    """A ``dim`` argument must index its op's first tensor: torch's shape functions leave some unchecked
    (softmax's), so a damaged program with a dim of 2**32 would pass here and fail when run. The bound
    allows one past the rank (unsqueeze's dims index its result)."""
    if schema is None or not args or not isinstance(args[0], torch.Tensor):
        return
    rank = max(args[0].dim(), 1)
    for i, param in enumerate(schema.arguments):
        if param.name != "dim":
            continue
        value = args[i] if i < len(args) else kwargs.get("dim")
        for d in value if isinstance(value, (list, tuple)) else (value,):
            if isinstance(d, int) and not isinstance(d, bool) and not -rank - 1 <= d <= rank:
                raise _fail(node, f"dim {d} is out of range for the rank-{args[0].dim()} input")


def _on_float_inputs(target, args, kwargs, error: Exception):
    """The op's result with its integer tensors given as float64, where its CPU kernel refused their dtype
    ("... not implemented for 'Int'"): an op the program's own device runs on integers (CUDA's
    ``histc`` of int32 expert ids, transformers' grouped experts) is checked here, on the CPU, for its
    shapes; its dtypes are then the recorded ones. None when that does not apply or fails too."""
    if "not implemented for" not in str(error):
        return None
    def floated(a):
        return a.to(torch.float64) if isinstance(a, torch.Tensor) and not a.is_floating_point() \
            and a.dtype != torch.bool else a
    args2, kwargs2 = [floated(a) for a in args], {k: floated(a) for k, a in kwargs.items()}
    if all(a is b for a, b in zip(args2, args)) and all(kwargs2[k] is kwargs[k] for k in kwargs):
        return None
    try:
        return target(*args2, **kwargs2)
    except Exception:  # noqa: BLE001 - the original error is reported
        return None


def _propagate(g: Graph, hints: Mapping[str, int], unknown: set[str]) -> None:
    env: dict[int, object] = {}

    def meta_of(v: Value):
        if isinstance(v.meta, TensorMeta):
            return torch.empty(v.meta.concrete_shape(hints), dtype=v.meta.dtype)
        if v.meta.expr is not None:
            return v.meta.expr.evaluate(hints)
        return v.meta.kind(1)

    for v in g.constants + g.inputs + g.state:
        env[v.id] = meta_of(v)
    # Values nothing reads: an op's secondary results (batch norm's saved statistics) whose shape and
    # dtype depend on the device that exported the program (CUDA's f32[C], the CPU's empty tensor).
    read = set(g.users()) | {v.id for v in g.output_values()} | {v.id for m in g.mutations for v in m}
    for node in g.nodes:
        op = get_op(node.op)
        if node.op.startswith("sym.") or op.host_sync or any(
                isinstance(o.meta, TensorMeta) and any(
                    isinstance(d, SymDim) and any(s in unknown for s in d.symbols) for d in o.meta.shape)
                for o in node.outputs if o is not None):
            # Host arithmetic and data-dependent shapes cannot be re-derived on fake tensors.
            for o in node.outputs:
                if o is not None:
                    env[o.id] = meta_of(o)
            continue
        args = map_values(node.args, lambda v: env[v.id])
        kwargs = map_values(node.kwargs, lambda v: env[v.id])
        kwargs = {k: (torch.device("cpu") if k == "device" else a) for k, a in kwargs.items()}
        _check_dim_args(node, getattr(op.target, "_schema", None), args, kwargs)
        shapes_only = False
        try:
            res = op.target(*args, **kwargs)
        except Exception as e:  # noqa: BLE001 - reported as a graph error naming the node
            res = _on_float_inputs(op.target, args, kwargs, e)
            if res is None:
                raise _fail(node, f"op fails on fake tensors: {type(e).__name__}: {e}") from None
            shapes_only = True
        results = res if isinstance(res, (tuple, list)) else (res,)
        for o, r in zip(node.outputs, results):
            if o is None:
                continue
            if isinstance(o.meta, TensorMeta):
                want = o.meta.concrete_shape(hints)
                if shapes_only and isinstance(r, torch.Tensor):
                    r = torch.empty(tuple(r.shape), dtype=o.meta.dtype)
                if o.id not in read:
                    env[o.id] = r
                    continue
                if not isinstance(r, torch.Tensor) or tuple(r.shape) != want or r.dtype != o.meta.dtype:
                    got = f"{r.dtype}{list(r.shape)}" if isinstance(r, torch.Tensor) else repr(r)
                    raise _fail(node, f"output %{o.name} recorded as {o.meta} (= {list(want)} here) "
                                      f"but the op gives {got}")
                env[o.id] = r
            else:
                env[o.id] = meta_of(o)


__all__ = ["verify", "iter_values"]
