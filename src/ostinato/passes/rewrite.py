"""What every rewriting pass needs: replacing a Value's uses, and which Values a pass must not touch.

A replacement map sends a Value id to what takes its place: another Value, or a Python constant
(folded host arithmetic). Maps may chain (a → b → c); ``resolve`` follows them to the end.
"""
from __future__ import annotations

from typing import Any

import torch

from ..ir import Graph, Node, Value, get_op, map_values

Replacements = dict[int, Any]


def resolve(mapping: Replacements, v: Value) -> Any:
    """The final replacement of ``v`` (``v`` itself when it has none)."""
    seen = 0
    out: Any = v
    while isinstance(out, Value) and out.id in mapping:
        out = mapping[out.id]
        seen += 1
        if seen > len(mapping):  # a cycle would be a bug in the pass that built the map
            raise RuntimeError(f"replacement cycle through %{v.name}")
    return out


def unplaced_node(g: Graph, op: str, args: tuple, kwargs: dict, meta, name: str, source: str) -> Value:
    """The one output of a new node of ``g`` (its ``producer``), not yet in ``g.nodes``: the pass puts it
    where it belongs."""
    node = Node(op, args, kwargs, name, source)
    value = g.new_value(name, meta, "temp", node)
    node.outputs = [value]
    return value


def substitute(node: Node, mapping: Replacements) -> None:
    """Rewrite ``node``'s arguments through ``mapping`` (forward passes call it node by node); a node that
    reads no mapped Value keeps its arguments as they are."""
    if mapping and any(v.id in mapping for v in node.inputs):
        node.args = map_values(node.args, lambda v: resolve(mapping, v))
        node.kwargs = map_values(node.kwargs, lambda v: resolve(mapping, v))


def substitute_graph_refs(g: Graph, mapping: Replacements) -> None:
    """Rewrite graph outputs and mutation values; targets are state or inputs, never replaced."""
    if not mapping:
        return
    g.outputs = [resolve(mapping, o) if isinstance(o, Value) else o for o in g.outputs]
    muts = []
    for target, new in g.mutations:
        new2 = resolve(mapping, new)
        if not isinstance(new2, Value):
            raise RuntimeError(f"mutation of %{target.name} would be replaced by a constant {new2!r}")
        muts.append((target, new2))
    g.mutations = muts


def replace_values(g: Graph, mapping: Replacements) -> None:
    """Replace every use of the mapped Values: node arguments, graph outputs and mutations."""
    for node in g.nodes:
        substitute(node, mapping)
    substitute_graph_refs(g, mapping)


def pinned_values(g: Graph) -> set[int]:
    """Ids of graph outputs and of both sides of each mutation: the nodes producing them stay."""
    ids = {v.id for v in g.output_values()}
    for target, new in g.mutations:
        ids.add(target.id)
        ids.add(new.id)
    return ids


def is_inplace(node: Node) -> bool:
    """An op that writes its first argument (produced by reinplace): impure but not random."""
    op = get_op(node.op)
    return op is not None and op.category == "inplace"


def volatile_values(g: Graph) -> set[int]:
    """Ids of Values whose contents an in-place op may change during a run.

    Before reinplace a graph is functional and this is empty. After it, a mutated buffer, the in-place
    op's result (which *is* the buffer) and every view of either may read differently before and after
    the write, so two reads of them are not interchangeable and copies of them are not removable.
    """
    roots: set[int] = set()
    for node in g.nodes:
        if is_inplace(node):
            roots.update(v.id for v in node.inputs[:1])
            roots.update(o.id for o in node.outputs if o is not None)
    if not roots:
        return roots
    for target, _ in g.mutations:
        roots.add(target.id)
    # Views propagate forward in one sweep: the graph is topologically ordered.
    for node in g.nodes:
        op = get_op(node.op)
        if op is not None and op.category in ("view", "inplace") and any(v.id in roots for v in node.inputs):
            roots.update(o.id for o in node.outputs if o is not None)
    return roots


def drop_nodes(g: Graph, dead: set[int]) -> None:
    """Remove the nodes whose ``id()`` is in ``dead`` (their outputs must have no uses left)."""
    if dead:
        g.nodes = [n for n in g.nodes if id(n) not in dead]


_CAST_NEUTRAL = {"layout": (None, torch.strided), "memory_format": (None, torch.preserve_format),
                 "non_blocking": (False,), "pin_memory": (None, False)}


def is_dtype_cast(node: Node | None) -> bool:
    """``_to_copy(x, dtype=…)`` changing nothing but the dtype. ``type_as`` adds the device: the
    export device, the one every tensor of the graph lives on, so no move."""
    if node is None or node.op != "aten._to_copy" or len(node.args) != 1 or "dtype" not in node.kwargs:
        return False
    return all(k in ("dtype", "device") or v in _CAST_NEUTRAL.get(k, ()) for k, v in node.kwargs.items())
