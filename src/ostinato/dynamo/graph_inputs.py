"""How each input of a Dynamo graph reaches the ostinato Program.

Dynamo hands a backend a GraphModule whose placeholders are everything the traced frame read: the
call's tensors, sizes Dynamo made symbolic, and (with ``inline_inbuilt_nn_modules``, the default) every
parameter and buffer of the modules it inlined, plus Python floats it turned into 0-d tensors. Passing
all of them as program inputs would work, but a replayed plan copies each input into its captured
buffer on every call: every weight, every step. So the module's own tensors are held by a wrapper
module instead, where ``torch.export`` sees them as weights (constants) or, when the graph writes them
(KV caches), as program state; sizes that are dims of an input tensor are re-derived from it.
"""
from __future__ import annotations

import copy
import dataclasses
import enum
import re
from typing import Any

import torch
from torch.export import Dim


class Role(enum.Enum):
    ARG = "arg"          # a tensor or scalar of the call: a program input
    SIZE = "size"        # a SymInt equal to a dim of an ARG tensor: derived, not an input
    WEIGHT = "weight"    # a parameter: held by the wrapper, a program constant
    STATE = "state"      # a module buffer or attribute tensor: held by the wrapper (constant, or state if written)
    FLOAT = "float"      # a Python float Dynamo passes as a 0-d tensor: inlined as a constant, value checked


@dataclasses.dataclass
class Placeholder:
    """One input of the Dynamo graph: its role, where it comes from, and what the backend saw."""

    index: int
    name: str             # the wrapper's attribute name (WEIGHT, STATE, FLOAT) or the placeholder's
    role: Role
    source: str           # Dynamo's description of where the value came from (L['self']..., L['x'])
    example: Any          # the example input (a tensor, or an int for sizes and scalars)
    dims: tuple = ()      # ARG tensors: per dim, the sympy symbol Dynamo made it, or None when static
    derived_from: tuple[int, int] | None = None   # SIZE: (index of the ARG tensor, dim)


def _source_name(source) -> str:
    if source is None:
        return ""
    name = source.name
    return name() if callable(name) else str(name)   # a method before torch 2.12, a property after


def _source_root(source):
    while getattr(source, "base", None) is not None:
        source = source.base
    return source


def _held_by_model(source, value: Any) -> bool:
    """A tensor that belongs to the model rather than to the call: a parameter, a module buffer, or a
    tensor attribute of ``self`` or of a global. The same object comes back on every call (the
    compiled graph checks that), so the wrapper can hold it."""
    if isinstance(value, torch.nn.Parameter) or "._buffers[" in _source_name(source):
        return True
    root = _source_root(source)
    if type(root).__name__ == "GlobalSource":
        return True
    return type(root).__name__ == "LocalSource" and root.local_name == "self" and root is not source


_PATH_TOKEN = re.compile(r"\[['\"]?([^'\"\]]+)['\"]?\]|\.([A-Za-z_]\w*)")
_PLUMBING = {"self", "_modules", "_parameters", "_buffers"}


def _attr_name(source_name: str, taken: set[str]) -> str:
    """A readable attribute name from a source: L['self']._modules['layers']._modules['0']._buffers['k']
    -> layers_0_k (the name program state and messages show)."""
    tokens = [a or b for a, b in _PATH_TOKEN.findall(source_name)]
    base = re.sub(r"\W", "_", "_".join(t for t in tokens if t not in _PLUMBING)).strip("_") or "input"
    if base[0].isdigit():
        base = "t_" + base
    name, n = base, 1
    while name in taken:
        n += 1
        name = f"{base}_{n}"
    taken.add(name)
    return name


def _symbol(x: Any):
    """The sympy symbol of a SymInt that is a plain symbol (s0), else None."""
    if isinstance(x, torch.SymInt):
        expr = x.node.expr
        return expr if getattr(expr, "is_Symbol", False) else None
    return None


def _hint(x: Any) -> Any:
    """A SymInt's value in the example inputs (the example list holds SymInts for dynamic sizes)."""
    if isinstance(x, torch.SymInt):
        node = x.node
        return int(node.hint) if node.hint is not None else int(node.shape_env.size_hint(node.expr))
    return x


def classify(gm: torch.fx.GraphModule, example_inputs: list, demoted: frozenset[int] = frozenset()
             ) -> list[Placeholder]:
    """The role of each placeholder of ``gm``; ``demoted`` positions are ARGs whatever they are (a model
    tensor the caller replaced: it is passed on every call from then on)."""
    nodes = list(gm.graph.find_nodes(op="placeholder"))
    if len(nodes) != len(example_inputs):
        raise ValueError(f"graph has {len(nodes)} inputs but Dynamo gave {len(example_inputs)} examples")
    taken: set[str] = set()
    out: list[Placeholder] = []
    sym_dims: dict[Any, tuple[int, int]] = {}   # symbol -> (ARG index, dim) where it first appears
    for i, (node, value) in enumerate(zip(nodes, example_inputs)):
        grapharg = node.meta.get("grapharg")
        source = getattr(grapharg, "source", None)
        source_name = _source_name(source)
        fake = node.meta.get("example_value")
        if isinstance(value, torch.Tensor) and i not in demoted:
            if getattr(grapharg, "pass_arg_as_tensor", False) and value.dim() == 0 and value.is_floating_point():
                out.append(Placeholder(i, node.name, Role.FLOAT, source_name, value.item()))
                continue
            if _held_by_model(source, value):
                role = Role.WEIGHT if isinstance(value, torch.nn.Parameter) else Role.STATE
                out.append(Placeholder(i, _attr_name(source_name, taken), role, source_name, value))
                continue
        if isinstance(value, torch.Tensor):
            shape = fake.shape if isinstance(fake, torch.Tensor) else value.shape
            dims = tuple(_symbol(d) for d in shape)
            for d, sym in enumerate(dims):
                if sym is not None:
                    sym_dims.setdefault(sym, (i, d))
            out.append(Placeholder(i, node.name, Role.ARG, source_name, value, dims=dims))
        else:
            out.append(Placeholder(i, node.name, Role.ARG, source_name, _hint(value)))
    for p, node in zip(out, nodes):   # a size of an input tensor is read from that tensor, not passed
        sym = _symbol(node.meta.get("example_value"))
        if p.role is Role.ARG and sym is not None and sym in sym_dims:
            p.role, p.derived_from = Role.SIZE, sym_dims[sym]
    return out


def inline_floats(gm: torch.fx.GraphModule, placeholders: list[Placeholder]) -> torch.fx.GraphModule:
    """A copy of ``gm`` with each FLOAT input replaced by its value.

    Dynamo passes a float it did not specialize (``dynamic=True``: a BatchNorm's eps, an upsampling
    factor) as a 0-d tensor and reads it back with ``.item()``; torch.export cannot trace that
    (a data-dependent value), and ostinato bakes such floats into the program anyway. The
    placeholder stays, unused, so the graph's signature does not change."""
    floats = {p.index: p.example for p in placeholders if p.role is Role.FLOAT}
    if not floats:
        return gm
    graph = copy.deepcopy(gm.graph)
    nodes = list(graph.find_nodes(op="placeholder"))
    for index, value in floats.items():
        node = nodes[index]
        for user in list(node.users):
            if user.op == "call_method" and user.target == "item":
                _substitute(user, value)
                graph.erase_node(user)
        _substitute(node, value)
    return torch.fx.GraphModule(gm, graph)


def _substitute(node: torch.fx.Node, value: Any) -> None:
    """Every use of ``node`` reads the constant ``value`` instead."""
    for user in list(node.users):
        user.args = torch.fx.node.map_arg(user.args, lambda n: value if n is node else n)
        user.kwargs = torch.fx.node.map_arg(user.kwargs, lambda n: value if n is node else n)


class DynamoGraph(torch.nn.Module):
    """The Dynamo graph with the model's tensors as attributes; forward takes only the call's inputs
    (one list, in placeholder order of the ARGs) and returns what the graph returns."""

    def __init__(self, gm: torch.fx.GraphModule, placeholders: list[Placeholder]):
        super().__init__()
        self.graph_module = inline_floats(gm, placeholders)
        self.placeholders = placeholders
        arg_pos = {p.index: k for k, p in enumerate(q for q in placeholders if q.role is Role.ARG)}
        # How to build the graph's argument list: ("input", k), ("size", (k, dim)), ("attr", name) or
        # ("value", a float the graph no longer reads).
        self._recipe: list[tuple[str, Any]] = []
        for p in placeholders:
            if p.role is Role.ARG:
                self._recipe.append(("input", arg_pos[p.index]))
            elif p.role is Role.SIZE:
                src, dim = p.derived_from
                self._recipe.append(("size", (arg_pos[src], dim)))
            elif p.role is Role.FLOAT:
                self._recipe.append(("value", p.example))
            else:
                if p.role is Role.WEIGHT:
                    self.register_parameter(p.name, p.example)
                else:
                    self.register_buffer(p.name, p.example)
                self._recipe.append(("attr", p.name))

    def forward(self, inputs: list):
        args = []
        for kind, what in self._recipe:
            if kind == "input":
                args.append(inputs[what])
            elif kind == "size":
                args.append(inputs[what[0]].shape[what[1]])
            elif kind == "attr":
                args.append(getattr(self, what))
            else:
                args.append(what)
        return self.graph_module(*args)


def call_inputs(placeholders: list[Placeholder]) -> list:
    """The example list DynamoGraph.forward takes: the ARGs' example values."""
    return [p.example for p in placeholders if p.role is Role.ARG]


def dynamic_shapes(placeholders: list[Placeholder], only_dim0: bool = False) -> tuple | None:
    """torch.export specs for the ARGs: ``Dim.AUTO`` on each dim Dynamo made symbolic (only dims 0 with
    ``only_dim0``), so torch.export finds the relations between them itself and keeps a dim static only
    where the graph needs it (torch.export raises instead for a named Dim it has to specialize).
    None when nothing is dynamic."""
    specs: list = []
    any_dynamic = False
    for p in placeholders:
        if p.role is not Role.ARG:
            continue
        if isinstance(p.example, torch.Tensor):
            spec = {d: Dim.AUTO for d, sym in enumerate(p.dims) if sym is not None and (d == 0 or not only_dim0)}
            any_dynamic |= bool(spec)
            specs.append(spec or None)
        else:
            specs.append(None)
    return (specs,) if any_dynamic else None
