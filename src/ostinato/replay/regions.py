"""Capturing a plan region by region, with the ops run through eager torch between the regions.

Device-agnostic: ``capture_region(segment, env, writes)`` is the device's way to capture one region
(a CUDA graph on CUDA). It must run the region on ``env`` now (this call's results, at buffers every
replay rewrites in place) and return its replay. Each region runs right after its capture, so an eager
op between two regions reads real data at capture too, not a region that was only recorded.
"""
from __future__ import annotations

from typing import Any, Callable

import torch

from ..backends.base import Launch
from ..errors import ReplayError
from ..runtime.segments import Segment
from ..runtime.session import write_state
from .tape import resolve

RegionCapture = Callable[[Segment, list, list], Callable[[], None]]


def write_back(env: list, writes: list[tuple[torch.Tensor, int]]) -> None:
    """State and input writes a plan leaves to its caller: each target takes its slot's value."""
    write_state([(target, env[slot]) for target, slot in writes])


def _results(launch: Launch, res: Any) -> tuple:
    return tuple(res) if launch.unpack else (res,)


def eager_step(launch: Launch, env: list) -> Callable[[], None]:
    """Run ``launch`` now on ``env`` (storing its results there) and return its replay: run it again on
    the same static arguments and copy each result into the tensor this run stored, which the
    regions after it read."""
    args = tuple(resolve(a, env) for a in launch.args)
    kwargs = {k: resolve(a, env) for k, a in launch.kwargs.items()}
    first = _results(launch, launch.fn(*args, **kwargs))
    for slot, r in zip(launch.outs, first):
        if slot >= 0:
            env[slot] = r
    kept = [(k, r) for k, (slot, r) in enumerate(zip(launch.outs, first)) if slot >= 0]
    fn, op, name = launch.fn, launch.op, launch.name

    def step() -> None:
        got = _results(launch, fn(*args, **kwargs))
        for k, static in kept:
            new = got[k]
            if isinstance(static, torch.Tensor):
                if new is static:
                    continue
                if not isinstance(new, torch.Tensor) or new.shape != static.shape or new.dtype != static.dtype:
                    raise ReplayError(f"{op} (node {name}, run through eager torch) gave {_describe(new)} "
                                      f"where the capture gave {_describe(static)}; the captured regions "
                                      "after it read one fixed buffer. Fix: compile without replay")
                static.copy_(new)
            elif new != static:
                raise ReplayError(f"{op} (node {name}, run through eager torch) gave {new!r} where the "
                                  f"capture gave {static!r}; the captured regions froze that value. "
                                  "Fix: compile without replay")
    return step


def _describe(x: Any) -> str:
    if isinstance(x, torch.Tensor):
        return f"{str(x.dtype).replace('torch.', '')}{list(x.shape)}"
    return repr(x)


def capture_steps(segments: list[Segment], env: list, capture_region: RegionCapture,
                  writes: list[tuple[torch.Tensor, int]]) -> list[Callable[[], None]]:
    """Run this call segment by segment over ``env``, capturing each region; the returned steps, run
    in order, replay it. The state and input ``writes`` go into the last region (a region of their
    own when the plan ends with an eager op)."""
    steps = []
    for index, segment in enumerate(segments):
        if segment.eager:
            steps.append(eager_step(segment.launches[0], env))
        else:
            last = index == len(segments) - 1
            steps.append(capture_region(segment, env, writes if last else []))
    if (not segments or segments[-1].eager) and writes:
        steps.append(capture_region(Segment(False, []), env, writes))
    return steps


def chain(steps: list[Callable[[], None]]) -> Callable[[], None]:
    """One replay function for the steps (the step itself when there is one: no extra frame)."""
    if len(steps) == 1:
        return steps[0]

    def replay() -> None:
        for step in steps:
            step()
    return replay
