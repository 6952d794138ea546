"""Hand-built IR graphs for pass tests, and a plain interpreter to check a pass keeps their results."""
from __future__ import annotations

from typing import Any

import torch

from ostinato.ir import Graph, TensorMeta, Value, get_op, map_values


def f32(*shape) -> TensorMeta:
    return TensorMeta(torch.float32, tuple(shape))


def op(g: Graph, name: str, args: tuple, out_meta, kwargs: dict | None = None, node_name: str = "") -> Value:
    """Add a one-output node and return its Value."""
    node_name = node_name or f"n{len(g.nodes)}"
    return g.add_node(name, args, kwargs or {}, [out_meta], node_name).outputs[0]


def run_graph(g: Graph, feeds: dict[str, Any]) -> list[Any]:
    """Evaluate ``g`` node by node with torch (inputs, state and constants by name); returns outputs.

    Mutations are applied to the fed tensors at the end, as the runtime does.
    """
    env: dict[int, Any] = {v.id: feeds[v.name] for v in g.constants + g.inputs + g.state}
    for node in g.nodes:
        args = map_values(node.args, lambda v: env[v.id])
        kwargs = map_values(node.kwargs, lambda v: env[v.id])
        res = get_op(node.op).target(*args, **kwargs)
        results = res if len(node.outputs) > 1 else (res,)
        for o, r in zip(node.outputs, results):
            if o is not None:
                env[o.id] = r
    outs = [env[o.id] if isinstance(o, Value) else o for o in g.outputs]
    for target, new in g.mutations:
        if env[new.id] is not feeds[target.name]:
            feeds[target.name].copy_(env[new.id])
    return outs
