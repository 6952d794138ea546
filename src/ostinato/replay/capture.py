"""One captured call of an Executable: static inputs, static outputs, and what replays it.

On the CPU the replay is a tape (``tape.py``); on CUDA a CUDA graph (``cuda_graph.py``). Either way a
capture *is* a call: its outputs hold that call's results, and its state writes happened once.
Each replay first checks that the buffers it reads are the ones captured (same storage, same shape)
and raises ReplayError naming the input otherwise.

``Captured(..., wait=False)`` on CUDA may raise ``CompilesInFlight`` instead: the warm-up found kernels
still compiling in worker processes, and nothing was captured nor changed (``cuda_graph.py``).
"""
from __future__ import annotations

import time
from typing import Any, Callable

import torch

from ..errors import CaptureError, ReplayError
from ..ir import dtype_name
from ..runtime.memory import MemoryReport


def describe(t: torch.Tensor) -> str:
    return f"{dtype_name(t.dtype)}[{', '.join(map(str, t.shape))}] on {t.device}"


def arena_allocator(holder: dict, device: torch.device) -> Callable[[int], torch.Tensor]:
    """An arena source shared by every capture that uses ``holder``: reused when large enough, else
    replaced by a larger one (earlier captures keep the old one alive through their views). Capturing
    the largest shapes first makes it a single allocation."""
    def arena_for(nbytes: int) -> torch.Tensor:
        arena = holder.get("arena")
        if arena is None or arena.numel() < nbytes:
            arena = holder["arena"] = torch.empty(max(nbytes, 1), dtype=torch.uint8, device=device)
        return arena
    return arena_for


def naive_bytes(exe, bindings: dict[str, int]) -> tuple[int, int]:
    """Bytes and count of every temporary tensor of the program at ``bindings`` (no reuse)."""
    total = count = 0
    for node in exe.program.graph.nodes:
        for v in node.outputs:
            if v is not None and v.is_tensor:
                shape = v.meta.concrete_shape(bindings)
                numel = 1
                for d in shape:
                    numel *= d
                total += numel * v.meta.dtype.itemsize
                count += 1
    return total, count


def _layout(t: torch.Tensor) -> tuple:
    """What a replay relies on of a captured buffer: where it is and how it is laid out."""
    return t.data_ptr(), t.dtype, t.shape, t.stride()


def _address(buf) -> int:
    """Where a state buffer lives: a tensor's data pointer; a backend's own buffer (MLX's cell, whose
    array changes every call) is itself the place."""
    return buf.data_ptr() if isinstance(buf, torch.Tensor) else id(buf)


class CompilesInFlight(Exception):
    """A capture given up (``wait=False``) because its warm-up ran op references while kernels compiled
    in worker processes. Nothing was captured and the session's state is as it was: the caller runs the
    call step by step; its next call of that shape waits for the compiles and captures."""

    def __init__(self, deferred: int):
        super().__init__(f"{deferred} op call(s) of the warm-up ran their references while kernels compiled")
        self.deferred = deferred


class Captured:
    """A captured call. ``replay()`` recomputes ``outputs`` from the static inputs in place.

    ``wait``: on CUDA, wait for kernels compiling in workers before capturing (the default); False raises
    CompilesInFlight instead, with nothing captured and the state untouched."""

    def __init__(self, exe, session, leaves: list, bindings: dict[str, int], holder: dict | None = None,
                 pool=None, *, wait: bool = True):
        t0 = time.perf_counter()
        signature = ",".join(f"{k}={v}" for k, v in sorted(bindings.items()))
        self.executable, self.session, self.signature = exe, session, signature
        names = [s.name for s in exe.program.inputs]
        for pos, slot in exe._input_slots:
            x = leaves[pos]
            if isinstance(x, torch.Tensor) and not x.is_contiguous():
                raise CaptureError(f"input {pos} ({names[pos]}) is not contiguous: a replay reads the very "
                                   "buffer it captured, which must keep the exported layout. Fix: pass "
                                   "x.contiguous() and update that tensor in place between replays")
        from .tape import check_capturable
        check_capturable(exe, exe.launches)     # every backend's capture: an op no replay can repeat
        self.leaves = list(leaves)
        env0 = exe.bind(session, leaves)
        own = None
        if exe.backend.own_capture:
            own = exe.backend.capture(exe, session, leaves, env0, signature)
        if own is not None:
            self._run, senv, self.source = own
            naive, count = naive_bytes(exe, bindings)
            self.report = MemoryReport(signature, naive, naive, count)
        elif exe.device.type == "cuda":
            mutations = exe.mutation_targets(session, leaves)
            from .cuda_graph import capture_cuda_graph
            self._run, senv, peak = capture_cuda_graph(exe, env0, session.state, mutations, pool, wait=wait)
            naive, count = naive_bytes(exe, bindings)
            self.report, self.source = MemoryReport(signature, peak, naive, count), ""
        else:
            from .tape import capture_tape
            mutations = exe.mutation_targets(session, leaves)
            tape, senv = capture_tape(exe, exe.launches, env0, session.state, exe.kept_slots, mutations,
                                      arena_allocator(holder if holder is not None else {}, exe.device),
                                      signature)
            self._run, self.report, self.source = tape.fn, tape.report, tape.source
        self.outputs = exe.outputs(senv)
        # What each replay checks: the captured inputs and state are still the same buffers.
        self._checks: list[tuple[str, torch.Tensor, tuple]] = []
        for pos, slot in exe._input_slots:
            x = leaves[pos]
            if isinstance(x, torch.Tensor):
                self._checks.append((f"input {pos} ({names[pos]})", x, _layout(x)))
        # State buffers belong to the session and only change in place (reset, copy_): checking that
        # each is still the captured tensor at the captured address is enough, and cheap (a decoder has
        # two per layer, checked on every replay).
        self._state = [(name, t, _address(t)) for name, t in session.state.items()]
        self.seconds = time.perf_counter() - t0

    def check(self) -> None:
        """Raise ReplayError when a captured buffer was rebound, resized or reallocated."""
        for what, t, layout in self._checks:
            if _layout(t) != layout:
                ptr, dtype, shape, stride = layout
                raise ReplayError(
                    f"{what}: its storage was reallocated since capture (captured {dtype_name(dtype)}"
                    f"[{', '.join(map(str, shape))}] strides {list(stride)} at {ptr:#x}, now {describe(t)} "
                    f"strides {list(t.stride())} at {t.data_ptr():#x}). A replay reads the captured buffer: "
                    "update it in place with x.copy_(new), never resize or set_ it; capture again for a "
                    "new buffer")
        state = self.session.state
        for name, t, ptr in self._state:
            if state.get(name) is not t or _address(t) != ptr:
                raise ReplayError(f"state buffer {name!r} was replaced or reallocated since capture; a "
                                  "replay writes the captured one. Update state in place (session.reset(), "
                                  "copy_) instead of assigning a new tensor")

    def replay(self) -> Any:
        self.check()
        self._run()
        return self.outputs

    def load_inputs(self, leaves: list) -> None:
        """Copy new input values into the static inputs (ReplayError when one does not fit)."""
        names = [s.name for s in self.executable.program.inputs]
        for pos, (new, old) in enumerate(zip(leaves, self.leaves)):
            if isinstance(old, torch.Tensor):
                if new is old:
                    continue
                if not isinstance(new, torch.Tensor) or new.shape != old.shape or new.dtype != old.dtype \
                        or new.device != old.device:
                    got = describe(new) if isinstance(new, torch.Tensor) else f"{type(new).__name__} {new!r}"
                    raise ReplayError(f"input {pos} ({names[pos]}): captured {describe(old)}, given {got}. "
                                      "A captured graph replays one shape; capture another graph for this "
                                      "one, or compile(..., replay=True), which captures per shape")
                if new.untyped_storage().data_ptr() == old.untyped_storage().data_ptr():
                    new = new.clone()   # a view of the static input itself (old.t(), old.flip(0)): copy first
                old.copy_(new)
            elif new != old:
                raise ReplayError(f"input {pos} ({names[pos]}): captured the value {old!r}, given {new!r}; "
                                  "non-tensor inputs are fixed at capture")

    def memory_report(self) -> MemoryReport:
        return self.report
