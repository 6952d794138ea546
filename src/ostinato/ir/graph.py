"""The IR: a Graph is an ordered list of Nodes over Values.

A Value is a tensor (dtype and a shape of ints or symbols) or a host scalar. Every Value has a role:
a constant (weight), a user input, program state (a buffer the model mutates) or a temporary produced
by a node. Slots number Values in the order constants → inputs → outputs → state → temps; runtimes
index their environments by slot.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterator

from .types import Meta, ScalarMeta, SymbolRange, TensorMeta

ROLES = ("constant", "input", "state", "temp")


class Value:
    __slots__ = ("id", "name", "meta", "role", "producer", "slot")

    def __init__(self, id: int, name: str, meta: Meta, role: str, producer: "Node | None" = None):
        assert role in ROLES, role
        self.id = id
        self.name = name
        self.meta = meta
        self.role = role
        self.producer = producer
        self.slot = -1

    @property
    def is_tensor(self) -> bool:
        return isinstance(self.meta, TensorMeta)

    def __repr__(self) -> str:
        return f"%{self.name}"


class Node:
    __slots__ = ("op", "args", "kwargs", "outputs", "source", "name", "_read")

    def __init__(self, op: str, args: tuple, kwargs: dict, name: str, source: str = ""):
        self.op = op
        self.args = args
        self.kwargs = kwargs
        self.outputs: list[Value | None] = []
        self.source = source
        self.name = name
        self._read: tuple | None = None

    @property
    def inputs(self) -> list[Value]:
        """Every Value the node reads, in argument order (a new list). Kept while ``args`` and ``kwargs``
        are the very objects it was collected from: passes replace them to rewrite a node (no code
        changes a node's argument lists in place), and the scheduler and the passes ask every node for
        its inputs many times (92k times in a 128-layer decoder's export)."""
        read = self._read
        if read is None or read[0] is not self.args or read[1] is not self.kwargs:
            out: list[Value] = []
            _collect(self.args, out)
            if self.kwargs:
                _collect(self.kwargs, out)
            self._read = read = (self.args, self.kwargs, out)
        return list(read[2])

    def __repr__(self) -> str:
        return f"Node({self.name}: {self.op})"


def _collect(obj: Any, out: list[Value]) -> None:
    """Append the Values inside a nested structure of tuples, lists and dicts to ``out``, in order (a
    loop, not nested generators: passes and the scheduler ask every node for its inputs many times)."""
    if isinstance(obj, Value):
        out.append(obj)
        return
    items = obj.values() if isinstance(obj, dict) else obj if isinstance(obj, (list, tuple)) else ()
    for o in items:
        if isinstance(o, Value):
            out.append(o)
        elif isinstance(o, (list, tuple, dict)):
            _collect(o, out)


def iter_values(obj: Any) -> Iterator[Value]:
    """The Values inside a nested structure of tuples, lists and dicts, in order."""
    out: list[Value] = []
    _collect(obj, out)
    return iter(out)


def map_values(obj: Any, fn) -> Any:
    """Rebuild a nested argument structure with ``fn`` applied to every Value."""
    if isinstance(obj, Value):
        return fn(obj)
    if isinstance(obj, tuple):
        return tuple([_map_item(o, fn) for o in obj])
    if isinstance(obj, list):
        return [_map_item(o, fn) for o in obj]
    if isinstance(obj, dict):
        return {k: _map_item(o, fn) for k, o in obj.items()}
    return obj


def _map_item(o: Any, fn) -> Any:
    """map_values of one element, without a call for the leaves that hold no Value (ints of a shape)."""
    if isinstance(o, Value):
        return fn(o)
    if isinstance(o, (tuple, list, dict)):
        return map_values(o, fn)
    return o


@dataclass
class Graph:
    nodes: list[Node] = field(default_factory=list)
    constants: list[Value] = field(default_factory=list)
    inputs: list[Value] = field(default_factory=list)
    state: list[Value] = field(default_factory=list)
    # Flattened user outputs: a Value, or a Python constant the model returns (an int, None, ...).
    outputs: list[Any] = field(default_factory=list)
    # (target, new value): after a run, ``target`` (a state Value or a user input) holds ``new value``.
    mutations: list[tuple[Value, Value]] = field(default_factory=list)
    symbols: dict[str, SymbolRange] = field(default_factory=dict)
    _next_id: int = 0

    # -- construction -------------------------------------------------------------------------
    def new_value(self, name: str, meta: Meta, role: str = "temp", producer: Node | None = None) -> Value:
        v = Value(self._next_id, name, meta, role, producer)
        self._next_id += 1
        if role == "constant":
            self.constants.append(v)
        elif role == "input":
            self.inputs.append(v)
        elif role == "state":
            self.state.append(v)
        return v

    def add_node(self, op: str, args: tuple, kwargs: dict, out_metas: list[Meta | None], name: str,
                 source: str = "") -> Node:
        node = Node(op, args, kwargs, name, source)
        for i, m in enumerate(out_metas):
            if m is None:
                node.outputs.append(None)
            else:
                vname = name if len(out_metas) == 1 else f"{name}.{i}"
                node.outputs.append(self.new_value(vname, m, "temp", node))
        self.nodes.append(node)
        return node

    # -- queries ------------------------------------------------------------------------------
    def output_values(self) -> list[Value]:
        return [o for o in self.outputs if isinstance(o, Value)]

    def temps(self) -> list[Value]:
        return [o for n in self.nodes for o in n.outputs if o is not None]

    def users(self) -> dict[int, list[Node]]:
        """Value id → the nodes that read it."""
        out: dict[int, list[Node]] = {}
        for n in self.nodes:
            for v in n.inputs:
                out.setdefault(v.id, []).append(n)
        return out

    def assign_slots(self) -> int:
        """Number every Value: constants → inputs → outputs → state → temps. Returns the count."""
        order: list[Value] = []
        seen: set[int] = set()

        def take(vs):
            for v in vs:
                if v.id not in seen:
                    seen.add(v.id)
                    order.append(v)

        take(self.constants)
        take(self.inputs)
        take(self.output_values())
        take(self.state)
        take(self.temps())
        for i, v in enumerate(order):
            v.slot = i
        return len(order)

    def op_counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for n in self.nodes:
            counts[n.op] = counts.get(n.op, 0) + 1
        return counts

    def __str__(self) -> str:
        from .printer import format_graph
        return format_graph(self)


def scalar_meta(kind: type, expr=None) -> ScalarMeta:
    return ScalarMeta(kind, expr)
