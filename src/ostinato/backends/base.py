"""The backend contract: turn IR nodes into Launches, place tensors, synchronize.

A Launch is a kernel with its arguments pre-bound: constants stay in place, Values become slot
indices into the runtime's environment list. Running one resolves slots and calls the kernel; no IR
is consulted.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, Callable

import torch

from ..ir import Node, Value


class _Slot:
    __slots__ = ("i",)

    def __init__(self, i: int):
        self.i = i


class _SlotList:
    """A list argument some of whose items are Values (``cat``'s tensors, ``index``'s indices)."""

    __slots__ = ("items",)

    def __init__(self, items: list):
        self.items = items


def _bind(a: Any) -> Any:
    if isinstance(a, Value):
        return _Slot(a.slot)
    if isinstance(a, (list, tuple)) and any(isinstance(x, Value) for x in a):
        return _SlotList([_bind(x) for x in a])
    return a


def _resolve(a: Any, env: list) -> Any:
    t = type(a)
    if t is _Slot:
        return env[a.i]
    if t is _SlotList:
        return [env[x.i] if type(x) is _Slot else x for x in a.items]
    return a


class Launch:
    """One kernel call: ``fn(*args, **kwargs)`` with slots resolved, results stored into ``outs``."""

    __slots__ = ("fn", "args", "kwargs", "outs", "unpack", "name", "op", "_static")

    def __init__(self, fn: Callable, node: Node, args: tuple, kwargs: dict, unpack: bool):
        self.fn = fn
        self.name = node.name
        self.op = node.op
        self.args = tuple(_bind(a) for a in args)
        self.kwargs = {k: _bind(a) for k, a in kwargs.items()}
        self.outs = tuple(-1 if o is None else o.slot for o in node.outputs)
        self.unpack = unpack
        # Fast path: when every argument is a plain slot or constant, resolve without type dispatch.
        self._static = not any(type(a) is _SlotList for a in self.args) and not any(
            type(a) in (_Slot, _SlotList) for a in self.kwargs.values())

    def __call__(self, env: list) -> None:
        if self._static:
            res = self.fn(*[env[a.i] if type(a) is _Slot else a for a in self.args], **self.kwargs)
        else:
            res = self.fn(*[_resolve(a, env) for a in self.args],
                          **{k: _resolve(a, env) for k, a in self.kwargs.items()})
        if self.unpack:
            for i, r in zip(self.outs, res):
                if i >= 0:
                    env[i] = r
        else:
            env[self.outs[0]] = res

    def __repr__(self) -> str:
        return f"Launch({self.name}: {self.op})"


class Backend(ABC):
    """What a device needs to provide to run ostinato programs."""

    name: str = ""

    def __init__(self, device: torch.device):
        self.device = device

    @abstractmethod
    def lower(self, node: Node) -> Launch:
        """A Launch running ``node``; raises BackendError naming the op when it cannot."""

    def place(self, tensor: torch.Tensor) -> torch.Tensor:
        """The tensor on this backend's device; no copy when it already lives there."""
        return tensor if tensor.device == self.device else tensor.to(self.device)

    def synchronize(self) -> None:
        """Wait for every launch issued so far."""
