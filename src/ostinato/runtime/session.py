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

    def __call__(self, *args, **kwargs):
        return self.executable.run(self, args, kwargs)

    def reset(self) -> None:
        """Restore every state buffer to the program's initial value, in place."""
        for name, init in self.executable.program.state_init.items():
            self.state[name].copy_(init)

    def __repr__(self) -> str:
        return f"<ostinato.Session state={list(self.state)}>"
