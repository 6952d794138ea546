"""Turn a list of Launches into one straight-line Python function.

Calling Launches one by one costs a Python call, argument resolution and a loop step per kernel; a
generated function holding every launch as one line (values in local variables, kernels and constant
arguments bound as globals of the function) leaves only the kernels' own dispatch. The same idea as
torch.fx's code generation, applied to an already-lowered plan.
"""
from __future__ import annotations

import math
import re
from typing import Any, Callable, Iterable

from ..backends.base import Launch, _Slot, _SlotList


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


def compile_launches(launches: list[Launch], keep: Iterable[int], name: str = "plan") -> Callable[[list], None]:
    """A function ``run(env)`` equivalent to ``for l in launches: l(env)``, storing into ``env`` only
    the slots in ``keep`` (outputs and values read after the run); every other value produced is
    released after its last use."""
    keep = set(keep)
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

    # Last reader of each slot: values are deleted right after it, so memory is freed (and reused
    # while still in cache) as eager would, instead of living until the plan returns.
    last_use: dict[int, int] = {}
    for i, launch in enumerate(launches):
        for a in (*launch.args, *launch.kwargs.values()):
            for x in (a.items if type(a) is _SlotList else (a,)):
                if type(x) is _Slot:
                    last_use[x.i] = i
    dead_after: dict[int, list[int]] = {}
    for i, launch in enumerate(launches):
        for o in launch.outs:
            if o >= 0 and o not in keep:
                dead_after.setdefault(last_use.get(o, i), []).append(o)

    for index, launch in enumerate(launches):
        fn = bind(launch.fn, "f")
        args = [ref(a) for a in launch.args] + [f"{k}={ref(a)}" for k, a in launch.kwargs.items()]
        call = f"{fn}({', '.join(args)})"
        # Node names come from program files, which are untrusted: only safe characters reach the source.
        note = re.sub(r"[^A-Za-z0-9_.]", "_", launch.name)[:80]
        if launch.unpack:
            targets = ", ".join("_" if i < 0 else f"v{i}" for i in launch.outs)
            body.append(f"    ({targets},) = {call}  # {note}")
        else:
            body.append(f"    v{launch.outs[0]} = {call}  # {note}")
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
