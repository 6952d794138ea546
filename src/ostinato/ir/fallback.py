"""Fallback ops: torch ops ostinato has no kernel for, run through eager torch.

A node whose op ostinato lacks (a custom op from ``torch.library``, an ATen op outside the table in
``aten_ops.py``) is kept as ``fallback.<namespace>.<op>[.<overload>]``. The prefix is how a saved
program says "run this through torch.ops" without a schema change; the op itself is resolved again
through ``torch.ops`` in whatever process loads the program, and registered here on demand.
"""
from __future__ import annotations

import threading

import torch

from ..errors import MissingOpError
from .ops import OpDef, _REGISTRY, aten_name

PREFIX = "fallback."
CATEGORY = "fallback"
_lock = threading.Lock()


def is_fallback(name: str) -> bool:
    return name.startswith(PREFIX)


def fallback_name(overload: torch._ops.OpOverload) -> str:
    """``torch.ops.mylib.scale.default`` → ``fallback.mylib.scale``."""
    return PREFIX + aten_name(overload)


def torch_name(name: str) -> str:
    """``fallback.mylib.scale`` → ``mylib::scale`` (the name torch.library registers)."""
    parts = name[len(PREFIX):].split(".")
    qual = f"{parts[0]}::{parts[1]}" if len(parts) > 1 else parts[0]
    return qual if len(parts) < 3 else f"{qual}.{parts[2]}"


def _lookup(name: str) -> torch._ops.OpOverload | None:
    parts = name[len(PREFIX):].split(".")
    # Names come from program files, which are untrusted: only identifiers, no dunders, and a namespace
    # that is an op namespace (not an attribute of torch.ops itself, such as load_library).
    if len(parts) not in (2, 3) or not all(p.isidentifier() and not p.startswith("__") for p in parts):
        return None
    ns, base = parts[0], parts[1]
    if ns.startswith("_") or hasattr(type(torch.ops), ns):
        return None
    overload = parts[2] if len(parts) == 3 else "default"
    try:
        packet = getattr(getattr(torch.ops, ns), base)
        op = getattr(packet, overload)
    except (AttributeError, RuntimeError):
        return None
    return op if isinstance(op, torch._ops.OpOverload) else None


def _flags(op: torch._ops.OpOverload) -> dict:
    """What passes need: a mutating or aliasing schema is impure (CSE and DCE keep the node). An op
    that writes an argument is in the "inplace" category and one that returns a view of an argument in
    "view", so that the passes tracking aliases of state (reinplace, rewrite) follow it."""
    schema = op._schema
    writes = schema.is_mutable or any(a.alias_info is not None and a.alias_info.is_write
                                      for a in schema.arguments)
    views = any(r.alias_info is not None for r in schema.returns)
    aliasing = writes or views or any(a.alias_info is not None for a in schema.arguments)
    tags = set(getattr(op, "tags", ()))
    return {"pure": not aliasing,
            "random": torch.Tag.nondeterministic_seeded in tags,
            "host_sync": torch.Tag.data_dependent_output in tags,
            "category": "inplace" if writes else "view" if views else CATEGORY}


def register_fallback(overload: torch._ops.OpOverload) -> OpDef:
    """The registry entry for ``overload`` run eagerly, made on first use."""
    return resolve_fallback(fallback_name(overload), overload)


def resolve_fallback(name: str, overload: torch._ops.OpOverload | None = None) -> OpDef | None:
    """The OpDef of a fallback op name, registering it on first use; None when the name is not a
    fallback name or torch has no such op in this process."""
    opdef = _REGISTRY.get(name)
    if opdef is not None or not is_fallback(name):
        return opdef
    op = overload if overload is not None else _lookup(name)
    if op is None:
        return None
    shown = name[len(PREFIX):]
    why = ("an ATen op outside ostinato's op table" if op.namespace == "aten"
           else f"a custom op of the {op.namespace!r} namespace")
    opdef = OpDef(name, op, reason=f"no ostinato kernel for {shown} ({why})", **_flags(op))
    with _lock:
        return _REGISTRY.setdefault(name, opdef)


def require_op(name: str, where: str = "") -> OpDef:
    """``get_op`` that explains itself: MissingOpError naming the op and the fix when it is unknown."""
    opdef = resolve_fallback(name)
    if opdef is not None:
        return opdef
    at = f" ({where})" if where else ""
    if is_fallback(name):
        qual = torch_name(name)
        raise MissingOpError(
            f"the program runs {qual} through eager torch{at}, but no op {qual} is registered in this "
            f"process\nFix: import the module that registers {qual} (its torch.library.custom_op or "
            "torch.library.define) before ostinato.load")
    raise MissingOpError(f"unknown op {name!r}{at}: this ostinato has no such op\nFix: load the program "
                         "with the ostinato version that wrote it, or export the model again")


def require_fallback_ops(graph, where: str = "") -> None:
    """Resolve every fallback op of ``graph`` through torch.ops (MissingOpError for the first one this
    process has not registered, naming its node and the fix)."""
    for node in graph.nodes:
        if is_fallback(node.op):
            src = f", {node.source}" if node.source else ""
            require_op(node.op, f"{where + ': ' if where else ''}node {node.name}{src}")


def fallback_nodes(graph) -> list[tuple[str, str, str, str]]:
    """(op, node name, source line, reason) for every node of ``graph`` that runs through eager torch."""
    rows = []
    for node in graph.nodes:
        if is_fallback(node.op):
            opdef = resolve_fallback(node.op)
            reason = opdef.reason if opdef is not None else \
                f"no ostinato kernel for {node.op[len(PREFIX):]} (and {torch_name(node.op)} is not registered here)"
            rows.append((node.op, node.name, node.source, reason))
    return rows
