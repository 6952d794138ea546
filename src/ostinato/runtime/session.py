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


def write_state(pairs: list[tuple[torch.Tensor, object]]) -> None:
    """``target.copy_(new)`` for each (target, new) pair whose new value is not the target itself (a
    write done in place needs none). Same-shape, same-dtype tensor pairs on one device go through one
    ``torch._foreach_copy_``: on CUDA one kernel for all of them, where a transformers decode step wrote
    its per-layer cache counters back with one memcpy each (16 graph nodes for a 16-layer Llama). Done
    pair by pair instead when a source shares storage with a target, where the order of the copies
    decides what is read."""
    todo = [(t, n) for t, n in pairs if n is not t]
    if len(todo) > 1 and all(isinstance(n, torch.Tensor) for _, n in todo):
        targets = {t.untyped_storage().data_ptr() for t, _ in todo}
        if not any(n.untyped_storage().data_ptr() in targets for _, n in todo):
            groups: dict[tuple, list] = {}
            for t, n in todo:
                if t.shape == n.shape and t.dtype == n.dtype and t.device == n.device:
                    groups.setdefault((t.device, t.dtype), []).append((t, n))
            batched = set()
            for group in groups.values():
                if len(group) > 1:
                    torch._foreach_copy_([t for t, _ in group], [n for _, n in group])
                    batched.update(id(t) for t, _ in group)
            todo = [(t, n) for t, n in todo if id(t) not in batched]
    for t, n in todo:
        t.copy_(n)
