"""A Plan split into segments at the ops that must run outside a captured region.

A CUDA graph replays kernels only: an op that does host work (a torch.library custom op running
Python, reading a tensor on the host) cannot be inside one. Such ops (``fallback.*``) split the plan
into regions, each captured on its own, with the op run eagerly between them. The split itself is
device-agnostic: running the segments in order over one environment is the unsplit plan.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from ..backends.base import Launch, slot_reads
from .codegen import compile_launches


@dataclass
class Segment:
    """A run of launches: a region (capturable) or one eager launch (``eager``). ``keep`` are the slots
    it stores into the environment: those read by later segments or after the plan."""

    eager: bool
    launches: list[Launch]
    keep: set[int] = field(default_factory=set)
    run: Callable[[list], None] = lambda env: None

    def __repr__(self) -> str:
        kind = "eager" if self.eager else "region"
        return f"Segment({kind}: {', '.join(l.name for l in self.launches[:4])}" \
               f"{', ...' if len(self.launches) > 4 else ''})"


def split_plan(launches: list[Launch], keep: set[int], is_break: Callable[[Launch], bool],
               name: str = "segment") -> list[Segment]:
    """Segments of ``launches``: each launch for which ``is_break`` holds alone in an eager segment,
    the launches between them in regions (empty regions are dropped). Each segment's ``run(env)``
    reads what earlier segments stored and stores what later ones (or the caller, ``keep``) read."""
    groups: list[tuple[bool, list[Launch]]] = []
    for launch in launches:
        if is_break(launch):
            groups.append((True, [launch]))
        elif groups and not groups[-1][0]:
            groups[-1][1].append(launch)
        else:
            groups.append((False, [launch]))
    last_reader: dict[int, int] = {}
    for index, (_, group) in enumerate(groups):
        for launch in group:
            for slot in slot_reads(launch):
                last_reader[slot] = index
    segments = []
    for index, (eager, group) in enumerate(groups):
        produced = {o for launch in group for o in launch.outs if o >= 0}
        seg_keep = {o for o in produced if o in keep or last_reader.get(o, -1) > index}
        run = compile_launches(group, seg_keep, name=f"{name}{index}")
        segments.append(Segment(eager, group, seg_keep, run))
    return segments


def run_segments(segments: list[Segment], env: list) -> None:
    """The plan, segment by segment (equal to running the unsplit plan on ``env``)."""
    for segment in segments:
        segment.run(env)
