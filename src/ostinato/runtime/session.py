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
