"""``ostinato.compile``: lower a Program for a device, optionally replaying captured plans."""
from __future__ import annotations

from typing import Any

import torch

from ..errors import OstinatoError
from ..program import Program
from ..runtime import Executable
from ..runtime import compile as lower_program
from .runner import ReplayRunner


def compile(program: Program, device: str | torch.device = "cpu", *, cache: bool = True, replay: bool = False,
            buckets: dict[str, Any] | None = None, strict: bool = False) -> Executable:
    """Lower ``program`` for ``device`` and return an Executable.

    With ``cache`` (the default) the lowered plan is looked up by content in the compile cache
    (``ostinato.cache``: memory, disk, Redis) and stored there on a miss; ``exe.plan_source`` says
    whether it was "compiled", read from the "cache", or reused from this process's "memory".

    With ``replay=True`` the first call of each shape signature runs step by step (its output waits for
    no capture), the second captures the plan (a tape on the CPU, a CUDA graph on CUDA) and later calls
    replay it, copying the inputs into the captured ones (no copy for ``exe.static_inputs()``).
    ``OSTINATO_CAPTURE_CALL=1`` captures on the first call instead. Outputs of a captured or replayed
    call are the captured buffers: valid until the session's next call. ``buckets={"batch": "pow2" |
    [sizes]}`` pads those dynamic dims (batch-like ones only) up to a ladder rung, so one capture serves
    many sizes.

    ``device``: "cpu", "cuda[:N]", or "mlx" (Apple GPUs through MLX; "mlx:cpu" / "mlx:gpu" pick MLX's
    device; on MLX, replay compiles the plan with ``mx.compile``). ``strict=True`` refuses ops the
    backend would run through torch instead of its own kernels (on MLX: ops without a handler).
    """
    if buckets and not replay:
        raise OstinatoError("buckets only apply with replay=True")
    exe = lower_program(program, device, cache=cache, strict=strict)
    if replay:
        exe.runner = ReplayRunner(exe, buckets)
        for method in exe.methods.values():
            method.runner = ReplayRunner(method)
    return exe
