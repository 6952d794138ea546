"""Turn a list of Launches into one straight-line Python function (after a plan's first runs, which loop
over the launches: ``_Plan``).

Calling Launches one by one costs a Python call, argument resolution and a loop step per kernel; a
generated function holding every launch as one line (values in local variables, kernels and constant
arguments bound as globals of the function) leaves only the kernels' own dispatch. The same idea as
torch.fx's code generation, applied to an already-lowered plan.
"""
from __future__ import annotations

import math
import re
from typing import Any, Callable, Iterable

from ..backends.base import Launch, _Slot, _SlotList, resolve


def _literal(a: Any) -> str | None:
    """Python source for a constant when it is a plain literal, else None (bind it by name)."""
    if a is None or isinstance(a, bool):
        return repr(a)
    if isinstance(a, int):
        return repr(a)
    if isinstance(a, float) and math.isfinite(a):
        return repr(a)
    if isinstance(a, str):
        return repr(a)
    return None


# A plan runs this many times through the loop of ``_Plan`` before its function is generated: compiling the
# source of a large plan costs more than a few interpreted runs (Mamba-130M's 6651 launches: 0.13 s in
# ``compile`` on the H200 host, against about 10 ms a run of the loop), and a replayed plan runs twice
# (the first call, the capture) before its CUDA graph takes over.
INTERPRETED_RUNS = 2


def compile_launches(launches: list[Launch], keep: Iterable[int], name: str = "plan") -> Callable[[list], None]:
    """A function ``run(env)`` equivalent to ``for l in launches: l(env)``, storing into ``env`` only
    the slots in ``keep`` (outputs and values read after the run); every other value produced is
    released after its last use. Its first INTERPRETED_RUNS runs loop over the launches; later ones call
    the straight-line function generated from them (``source``)."""
    return _Plan(launches, set(keep), name)


def _dead_after(launches: list[Launch], keep: set[int]) -> dict[int, list[int]]:
    """Launch index -> the slots produced and not kept whose last reader it is (or their producer)."""
    # Last reader of each slot: values are deleted right after it, so memory is freed (and reused
    # while still in cache) as eager would, instead of living until the plan returns.
    last_use: dict[int, int] = {}
    for i, launch in enumerate(launches):
        for a in (*launch.args, *launch.kwargs.values()):
            for x in (a.items if type(a) is _SlotList else (a,)):
                if type(x) is _Slot:
                    last_use[x.i] = i
    dead_after: dict[int, list[int]] = {}
    seen: set[int] = set()
    for i, launch in enumerate(launches):
        for o in launch.outs:
            if o >= 0 and o not in keep and o not in seen:      # (a slot written twice: released once)
                seen.add(o)
                dead_after.setdefault(last_use.get(o, i), []).append(o)
    return dead_after


class _Plan:
    """``compile_launches``'s function: a loop over the launches for the first runs, then the generated
    one. Attributes may be set on it as on a function (the executable records ``folded``)."""

    def __init__(self, launches: list[Launch], keep: set[int], name: str):
        self.launches, self.keep, self.name = launches, keep, name
        self.runs = 0
        self._fn: Callable[[list], None] | None = None
        self._dead = _dead_after(launches, keep)
        self._steps = [(launch, tuple(self._dead.get(i, ()))) for i, launch in enumerate(launches)]
        self._kept = sorted(keep & {o for launch in launches for o in launch.outs if o >= 0})

    def __call__(self, env: list) -> None:
        if self._fn is not None:
            return self._fn(env)
        self.runs += 1
        if self.runs > INTERPRETED_RUNS:
            self._fn = _generate(self.launches, self.keep, self.name, self._dead)
            return self._fn(env)
        vals = list(env)
        for launch, dead in self._steps:
            res = launch.fn(*[resolve(a, vals) for a in launch.args],
                            **{k: resolve(a, vals) for k, a in launch.kwargs.items()})
            if launch.unpack:
                for o, r in zip(launch.outs, res, strict=True):   # (the generated unpacking raises too)
                    if o >= 0:
                        vals[o] = r
            elif launch.outs[0] >= 0:
                vals[launch.outs[0]] = res
            del res                              # an unused result is released now, as in the function
            for o in dead:
                vals[o] = None
        for o in self._kept:
            env[o] = vals[o]
        return None

    @property
    def source(self) -> str:
        """The generated function's source (generated now if the plan has not yet run often enough)."""
        if self._fn is None:
            self._fn = _generate(self.launches, self.keep, self.name, self._dead)
        return self._fn.source


def _generate(launches: list[Launch], keep: set[int], name: str,
              dead_after: dict[int, list[int]]) -> Callable[[list], None]:
    """The straight-line function of ``launches`` (see the module); ``dead_after``: ``_dead_after``'s."""
    namespace: dict[str, Any] = {}
    produced: set[int] = set()
    loads: set[int] = set()
    body: list[str] = []

    def bind(obj: Any, prefix: str) -> str:
        key = f"{prefix}{len(namespace)}"
        namespace[key] = obj
        return key

    def ref(a: Any) -> str:
        if type(a) is _Slot:
            if a.i not in produced:
                loads.add(a.i)
            return f"v{a.i}"
        if type(a) is _SlotList:
            return "[" + ", ".join(ref(x) for x in a.items) + "]"
        lit = _literal(a)
        return lit if lit is not None else bind(a, "k")

    for index, launch in enumerate(launches):
        fn = bind(launch.fn, "f")
        args = [ref(a) for a in launch.args] + [f"{k}={ref(a)}" for k, a in launch.kwargs.items()]
        call = f"{fn}({', '.join(args)})"
        # Node names come from program files, which are untrusted: only safe characters reach the source.
        note = re.sub(r"[^A-Za-z0-9_.]", "_", launch.name)[:80]
        if launch.unpack:
            targets = ", ".join("_" if i < 0 else f"v{i}" for i in launch.outs)
            body.append(f"    ({targets},) = {call}  # {note}")
        elif launch.outs[0] >= 0:
            body.append(f"    v{launch.outs[0]} = {call}  # {note}")
        else:
            body.append(f"    {call}  # {note}")
        produced.update(i for i in launch.outs if i >= 0)
        if index in dead_after:
            body.append(f"    del {', '.join(f'v{i}' for i in dead_after[index])}")
    head = [f"def {name}(env):"] + [f"    v{i} = env[{i}]" for i in sorted(loads)]
    tail = [f"    env[{i}] = v{i}" for i in sorted(keep & produced)]
    source = "\n".join(head + body + tail + ["    return None"]) + "\n"
    code = compile(source, f"<ostinato {name}>", "exec")
    exec(code, namespace)  # noqa: S102 - source generated above from launches, no user text
    fn = namespace[name]
    fn.source = source
    return fn
