"""Which blocks of a model repeat (regional export's kinds), and what regional export records of each
call of one: the data regional.py traces with and inline.py instantiates from."""
from __future__ import annotations

import dataclasses
import itertools
from typing import Any

import torch
from torch import nn
from torch.utils import _pytree as pytree

# A kind is only worth an opaque call when it repeats.
MIN_INSTANCES = 2


class _TensorSlot:
    """Where a tensor goes in a call's flattened arguments or outputs (None is a value there)."""

    def __repr__(self) -> str:
        return "<tensor>"


TENSOR = _TensorSlot()


class Fallback(Exception):
    """Internal: a kind cannot be traced once; ``kind`` is traced inline instead, for ``reason``."""

    def __init__(self, kind: "Kind", reason: str):
        super().__init__(reason)
        self.kind, self.reason = kind, reason


@dataclasses.dataclass
class Kind:
    """Instances of one block: same class, same parameter/buffer names, shapes and dtypes."""

    index: int
    cls: str
    instances: list[tuple[str, nn.Module]]
    reads: set[tuple[str, str]] | None = None        # (submodule path, attribute) the forward read
    representative: str = ""                         # path of the instance that was fake-run first
    depth: int = 0                                   # how many times its instances were split

    @property
    def name(self) -> str:
        return f"{self.cls}x{len(self.instances)}"


@dataclasses.dataclass
class CallRecord:
    """One call of a block during the outer trace."""

    call_id: int
    kind: Kind
    path: str
    module: nn.Module
    in_spec: pytree.TreeSpec
    leaves: list[Any]                 # the call's flattened (args, kwargs); tensors as TENSOR
    signature: tuple                  # kind, spec, constants, tensor dtypes and ranks
    fake_inputs: list[torch.Tensor] | None = None    # as the outer trace saw them (sizes may be symbols)
    out: "OutInfo | None" = None


@dataclasses.dataclass
class OutInfo:
    """What a block call returns: the pytree, its non-tensor leaves, and the buffers it mutates."""

    out_spec: pytree.TreeSpec
    leaves: list[Any]                 # TENSOR where a tensor goes
    n_tensors: int
    mutated: list[str]                # buffer names relative to the block, in the op's output order
    metas: list[tuple]                # (shape, stride, dtype, device) of every op output


def _qualname(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def structure_signature(module: nn.Module) -> tuple:
    """Class tree and parameter/buffer names, shapes, dtypes and devices of ``module``."""
    tree = tuple((n, _qualname(type(m))) for n, m in module.named_modules(remove_duplicate=False))
    tensors = tuple((k, tuple(t.shape), str(t.dtype), t.device.type)
                    for k, t in itertools.chain(module.named_parameters(remove_duplicate=False),
                                                module.named_buffers(remove_duplicate=False)))
    return tree, tensors


def _has_hooks(m: nn.Module) -> bool:
    return bool(m._forward_hooks or m._forward_pre_hooks or m._backward_hooks
                or getattr(m, "_backward_pre_hooks", None))


def _worth_a_kind(m: nn.Module) -> bool:
    """A block worth tracing once: it holds parameters and more than one module (an activation or a
    lone norm costs less to trace inline than an opaque call and a trace of its own)."""
    return next(m.parameters(), None) is not None and next(iter(m.children()), None) is not None


def find_kinds(model: nn.Module) -> tuple[list[Kind], list[str]]:
    """Repeated blocks (outermost first) and, for candidates refused up front, why."""
    groups: dict[tuple, list[tuple[str, nn.Module]]] = {}
    taken: list[str] = []

    def inside(path: str) -> bool:
        return any(path == p or path.startswith(p + ".") for p in taken)

    by_sig: dict[int, tuple] = {}
    for path, m in model.named_modules():
        if not path or type(m).__module__.startswith("torch.") or not _worth_a_kind(m):
            continue
        by_sig[id(m)] = (type(m), structure_signature(m))
        groups.setdefault(by_sig[id(m)], []).append((path, m))
    # Outermost repeating modules: a group whose members lie inside an earlier (outer) group is skipped.
    kinds, why = [], []
    for path, m in model.named_modules():
        sig = by_sig.get(id(m))
        if sig is None or inside(path):
            continue
        members = [(p, x) for p, x in groups[sig] if not inside(p)]
        if len(members) < MIN_INSTANCES or members[0][0] != path:
            continue
        taken.extend(p for p, _ in members)
        kinds.append(Kind(len(kinds), _qualname(type(m)), members))
    if not kinds:
        return [], []
    from torch.nn.modules import module as nn_module
    if any(getattr(nn_module, h, None) for h in ("_global_forward_hooks", "_global_forward_pre_hooks",
                                                  "_global_forward_hooks_with_kwargs")):
        return [], [f"{k.cls}: global module hooks are registered, which run in eager only" for k in kinds]
    # Refused up front: hooks anywhere in an instance; tensors an instance shares with another module.
    owners: dict[int, set[str]] = {}
    for name, t in itertools.chain(model.named_parameters(remove_duplicate=False),
                                   model.named_buffers(remove_duplicate=False)):
        owners.setdefault(id(t), set()).add(name)
    ok = []
    for kind in kinds:
        reason = None
        for path, inst in kind.instances:
            if any(_has_hooks(s) for s in inst.modules()):
                reason = f"{path} has hooks, which run in eager only"
                break
            for name, t in itertools.chain(inst.named_parameters(remove_duplicate=False),
                                           inst.named_buffers(remove_duplicate=False)):
                names = owners.get(id(t), set())
                if len(names) > 1:
                    others = sorted(names - {f"{path}.{name}"})
                    reason = f"{path}.{name} is shared with {others[0]}"
                    break
            if reason:
                break
        if reason:
            why.append(f"{kind.cls}: {reason}")
        else:
            ok.append(kind)
    return ok, why
