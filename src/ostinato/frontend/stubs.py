"""What stands in for a block while regional export traces its caller, and what watches the block.

A stub takes an instance's place in the model's tree during the outer trace (no parameters, the
block's buffers at their paths, other reads forwarded to the instance); a dispatch mode records the
storages an op writes in place; a class swap records which plain attributes a forward reads; and
``same_value`` says whether two instances' attributes are interchangeable for tracing.
"""
from __future__ import annotations

import enum
import functools
import types
from typing import Any

import torch
import torch.utils._python_dispatch
from torch import nn

# nn.Module's own bookkeeping in an instance's __dict__: not state the forward branches on.
_MODULE_INTERNALS = frozenset({
    "_parameters", "_buffers", "_modules", "_non_persistent_buffers_set", "_backward_pre_hooks",
    "_backward_hooks", "_is_full_backward_hook", "_forward_hooks", "_forward_hooks_with_kwargs",
    "_forward_hooks_always_called", "_forward_pre_hooks", "_forward_pre_hooks_with_kwargs",
    "_state_dict_hooks", "_state_dict_pre_hooks", "_load_state_dict_pre_hooks",
    "_load_state_dict_post_hooks", "forward", "__class__"})
_PLAIN = (type(None), bool, int, float, str, torch.dtype, torch.device, enum.Enum)
_HEAPTYPE = 1 << 9      # Py_TPFLAGS_HEAPTYPE: a class defined in Python


class _Mirror(nn.Module):
    """Holds a block's buffers at their paths while the block is out of the model's tree; reads of
    anything else go to the real submodule."""

    def __init__(self, inner: nn.Module):
        super().__init__()
        self.__dict__["_ost_inner"] = inner

    def __getattr__(self, name):
        try:
            return nn.Module.__getattr__(self, name)
        except AttributeError:
            return getattr(self.__dict__["_ost_inner"], name)


def _stub_getattr(self, name):
    try:
        return nn.Module.__getattr__(self, name)
    except AttributeError:
        return getattr(self.__dict__["_ost_inner"], name)


def _stub_forward(self, *args, **kwargs):
    return self.__dict__["_ost_call"](args, kwargs)


_STUB_CLASSES: dict[type, type] = {}


def _stub(inst: nn.Module, call) -> nn.Module:
    """What stands in the model for a block instance during the outer trace: an instance of a subclass
    of its class (isinstance holds; class attributes and methods are there) with no parameters, so
    torch.export lifts none of the block's weights, and with the block's buffers at their paths, so a
    mutated buffer is still the model's. Other attribute reads go to the instance."""
    cls = type(inst)
    sub = _STUB_CLASSES.get(cls)
    if sub is None:
        sub = _STUB_CLASSES[cls] = type(cls.__name__, (cls,), {
            "__getattr__": _stub_getattr, "forward": _stub_forward, "__qualname__": cls.__qualname__,
            "__module__": cls.__module__})
    stub = sub.__new__(sub)
    nn.Module.__init__(stub)
    stub.__dict__["_ost_inner"] = inst
    stub.__dict__["_ost_call"] = call
    stub.training = inst.training
    for name, buf in inst.named_buffers(remove_duplicate=False):
        *parts, leaf = name.split(".")
        holder, owner = stub, inst
        for part in parts:
            owner = owner.get_submodule(part)
            child = holder._modules.get(part)
            if child is None:
                child = holder._modules[part] = _Mirror(owner)
            holder = child
        # Not register_buffer: it refuses a name the stub already answers (through the instance).
        holder._buffers[leaf] = buf
        if leaf in owner._non_persistent_buffers_set:
            holder._non_persistent_buffers_set.add(leaf)
    return stub


def _storage(t: torch.Tensor) -> int:
    return t.untyped_storage()._cdata


class _WriteWatch(torch.utils._python_dispatch.TorchDispatchMode):
    """Records the storage of every tensor an op writes in place (views write their base's storage)."""

    def __init__(self):
        super().__init__()
        self.written: set[int] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        schema = getattr(func, "_schema", None)
        if schema is not None:
            for i, a in enumerate(schema.arguments):
                if a.alias_info is not None and a.alias_info.is_write:
                    x = args[i] if i < len(args) else kwargs.get(a.name)
                    for t in (x if isinstance(x, (list, tuple)) else (x,)):
                        if isinstance(t, torch.Tensor):
                            self.written.add(_storage(t))
        return func(*args, **(kwargs or {}))


def _record_reads(modules: dict[str, nn.Module], reads: set) -> list:
    """Swap each module's class for a subclass that records reads of its plain attributes."""
    swapped = []
    for rel, m in modules.items():
        cls = type(m)
        if isinstance(m, nn.modules.dropout._DropoutNd) and not m.training:
            continue   # evaluation: p does not reach the graph (EfficientNet's drop rates differ per block)

        def getattribute(self, name, _rel=rel, _cls=cls):
            d = object.__getattribute__(self, "__dict__")
            if name in d and name not in _MODULE_INTERNALS:
                reads.add((_rel, name))
            return _cls.__getattribute__(self, name)

        sub = type(cls.__name__, (cls,), {"__getattribute__": getattribute, "__qualname__": cls.__qualname__,
                                          "__module__": cls.__module__})
        m.__class__ = sub
        swapped.append((m, cls))
    return swapped


def same_value(a: Any, b: Any, depth: int = 0, held: bool = False) -> bool:
    """Equal for the purpose of tracing: the same object, or equal plain data. ``held``: inside a helper
    object, whose tensors are no module's weights (nothing maps them per instance): the same tensor only."""
    if a is b:
        return True
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        # weights: mapped per instance
        return not held and isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)
    if type(a) is not type(b) or depth > 4:
        return False
    if isinstance(a, _PLAIN):
        return a == b
    if isinstance(a, (tuple, list)):
        return len(a) == len(b) and all(same_value(x, y, depth + 1, held) for x, y in zip(a, b))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same_value(a[k], b[k], depth + 1, held) for k in a)
    if isinstance(a, functools.partial):
        return same_value(a.func, b.func, depth + 1, held) and same_value(a.args, b.args, depth + 1, held) \
            and same_value(a.keywords, b.keywords, depth + 1, held)
    if _helper_object(a):
        # a plain Python helper of one class whose attributes are equal plain data (diffusers gives each
        # Attention its own AttnProcessor2_0, which holds nothing): instances behave alike
        return same_value(vars(a), vars(b), depth + 1, held=True)
    return False


def _helper_object(x: Any) -> bool:
    """An instance of a Python class (not a module, tensor, type or function) that keeps its state in its
    ``__dict__`` alone: no ``__slots__`` and no C-level base other than ``object``."""
    cls = type(x)
    if isinstance(x, (nn.Module, type, types.FunctionType, types.MethodType)) or not hasattr(x, "__dict__"):
        return False
    return all(k is object or ("__slots__" not in vars(k) and k.__dictoffset__ != 0 and
                               k.__flags__ & _HEAPTYPE) for k in cls.__mro__)
