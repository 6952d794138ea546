"""Sessions own program state (KV caches and other mutated buffers); weights stay shared."""
from __future__ import annotations

from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from .executable import Executable


class Session:
    """One independent copy of a program's state. Call it like the executable."""

    def __init__(self, executable: "Executable", state: dict[str, torch.Tensor]):
        self.executable = executable
        self.state = state
        # What replay keeps per session (captures by shape signature, their shared arena or pool);
        # owned by ostinato.replay, opaque here.
        self.replay: dict = {}
        self._methods: dict[str, Session] = {}

    def method(self, name: str) -> "Session":
        """A session of the executable's method ``name`` over this session's state (the same buffers)."""
        s = self._methods.get(name)
        if s is None:
            exe = self.executable.methods.get(name)
            if exe is None:
                from ..errors import OstinatoError
                known = ", ".join(sorted(self.executable.methods)) or "none"
                raise OstinatoError(f"the program has no method {name!r} (its methods: {known})")
            s = self._methods[name] = Session(exe, self.state)
        return s

    def __call__(self, *args, **kwargs):
        return self.executable.run(self, args, kwargs)

    def reset(self) -> None:
        """Restore every state buffer to the program's initial value, in place."""
        for name, init in self.executable.program.state_init.items():
            self.state[name].copy_(init)

    def __repr__(self) -> str:
        return f"<ostinato.Session state={list(self.state)}>"


# dtypes torch's fused foreach copy takes on every version from 2.11 (others go pair by pair)
_BATCHED_DTYPES = frozenset((torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.int8, torch.int16,
                             torch.int32, torch.int64, torch.uint8, torch.bool))


def _storages(tensors) -> list[int] | None:
    """The storage address of each tensor, or None when one has none to read (a wrapper subclass)."""
    try:
        return [t.untyped_storage().data_ptr() for t in tensors]
    except (RuntimeError, NotImplementedError, TypeError):
        return None


def write_state(pairs: list[tuple[torch.Tensor, object]]) -> None:
    """``target.copy_(new)`` for each (target, new) pair whose new value is not the target itself (a
    write done in place needs none). Same-shape, same-dtype tensor pairs on one device go through one
    ``torch._foreach_copy_``: on CUDA one kernel for all of them, where a transformers decode step wrote
    its per-layer cache counters back with one memcpy each (16 graph nodes for a 16-layer Llama). Done
    pair by pair, in order, instead whenever the order of the copies could matter: a source sharing
    storage with a target, two targets sharing storage (or one target twice), or a tensor whose storage
    cannot be read (a wrapper subclass)."""
    todo = [(t, n) for t, n in pairs if n is not t]
    if len(todo) > 1 and all(type(t) is torch.Tensor and type(n) is torch.Tensor for t, n in todo):
        targets = _storages(t for t, _ in todo)
        sources = _storages(n for _, n in todo)
        if targets is not None and sources is not None and len(set(targets)) == len(targets) \
                and not set(targets) & set(sources):
            groups: dict[tuple, list[int]] = {}
            for k, (t, n) in enumerate(todo):
                if t.shape == n.shape and t.dtype == n.dtype and t.device == n.device and t.dtype in _BATCHED_DTYPES:
                    groups.setdefault((t.device, t.dtype), []).append(k)
            batched: set[int] = set()
            for members in groups.values():
                if len(members) > 1:
                    torch._foreach_copy_([todo[k][0] for k in members], [todo[k][1] for k in members])
                    batched.update(members)
            todo = [pair for k, pair in enumerate(todo) if k not in batched]
    for t, n in todo:
        t.copy_(n)
