"""Readable text form of a Graph: one node a line, with output types and the source line."""
from __future__ import annotations

from typing import Any

import torch

from .graph import Graph, Value
from .types import dtype_name


def format_arg(a: Any) -> str:
    if isinstance(a, Value):
        return f"%{a.name}"
    if isinstance(a, (list, tuple)):
        inner = ", ".join(format_arg(x) for x in a)
        return f"[{inner}]"
    if isinstance(a, dict):
        return "{" + ", ".join(f"{k}={format_arg(v)}" for k, v in a.items()) + "}"
    if isinstance(a, torch.dtype):
        return dtype_name(a)
    if isinstance(a, float):
        return repr(a)
    return str(a)


def _decl(v: Value) -> str:
    return f"%{v.name}: {v.meta}"


def format_graph(g: Graph, max_constants: int = 8) -> str:
    lines = []
    syms = ", ".join(str(s) for s in g.symbols.values())
    lines.append(f"graph({syms}):")
    if g.constants:
        shown = ", ".join(_decl(v) for v in g.constants[:max_constants])
        more = f", ... ({len(g.constants) - max_constants} more)" if len(g.constants) > max_constants else ""
        lines.append(f"  constants: {shown}{more}")
    lines.append("  inputs: " + ", ".join(_decl(v) for v in g.inputs))
    if g.state:
        lines.append("  state: " + ", ".join(_decl(v) for v in g.state))
    width = 0
    body = []
    for n in g.nodes:
        outs = [o for o in n.outputs]
        if len(outs) == 1 and outs[0] is not None:
            lhs = _decl(outs[0])
        else:
            lhs = "(" + ", ".join("_" if o is None else _decl(o) for o in outs) + ")"
        args = [format_arg(a) for a in n.args] + [f"{k}={format_arg(v)}" for k, v in n.kwargs.items()]
        text = f"  {lhs} = {n.op}({', '.join(args)})"
        width = max(width, len(text))
        body.append((text, n.source))
    width = min(width, 110)
    for text, src in body:
        lines.append(f"{text:<{width}}  # {src}" if src else text)
    for target, new in g.mutations:
        lines.append(f"  {target!r} <- {new!r}")
    lines.append("  return (" + ", ".join(format_arg(o) for o in g.outputs) + ")")
    return "\n".join(lines)
