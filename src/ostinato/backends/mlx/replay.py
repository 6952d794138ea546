"""Replay on MLX: the plan compiled with ``mx.compile``, once per shape signature.

A capture runs the plan once (that call's outputs are the capture's), then splits it at the launches
that run through torch (they read data on the host, which a compiled MLX function cannot); each run
between them becomes one function ``f(arrays) -> arrays`` compiled with ``mx.compile``: its inputs
are the weights, the call's inputs and state and the values earlier parts made, so a compiled function
holds no weights and serves every executable of the same plan and every session. Compiled functions
live in the op-level graph cache (``ostinato.cache.stats()["op_graph"]``: hits and misses), keyed by
the plan, the part and the shape signature; a program whose sizes are symbolic and whose every op is
elementwise, a reduction or a norm compiles shapeless (one function for all sizes). Sizes the plan
computes (ints) are fixed per signature and baked in.

A replay copies the static inputs into MLX arrays, calls the compiled parts, stores the new state in
the session's cells, evaluates once, and copies the outputs into the captured output tensors, which
the caller holds (updated in place, as on the other backends).
"""
from __future__ import annotations

import hashlib
import itertools
import threading
from typing import Callable

import numpy as np
import torch

import mlx.core as mx

from ...cache.op_cache import op_graph_cache
from ...ir import Value, get_op
from ..base import _Slot, slot_reads
from .convert import to_mx, to_torch

_TOKENS = itertools.count()
_TOKEN_LOCK = threading.Lock()

# Categories whose handlers never read a size into Python: a plan of only these (and no size values)
# traces the same for every shape.
_SHAPELESS = {"elementwise", "reduction", "norm", "matmul"}
_SHAPELESS_FUSED = {"ost.rms_norm", "ost.add_rms_norm", "ost.swiglu", "ost.geglu", "ost.layer_norm", "ost.linear"}


def plan_token(plan: Callable) -> int:
    """A number naming a plan function for as long as it lives (ids are reused; this is not)."""
    token = getattr(plan, "mlx_token", None)
    if token is None:
        with _TOKEN_LOCK:
            token = getattr(plan, "mlx_token", None)
            if token is None:
                token = plan.mlx_token = next(_TOKENS)
    return token


def shapeless_ok(exe) -> bool:
    """Whether one compiled function serves every size of this program."""
    g = exe.program.graph
    if not g.symbols:
        return False
    for node in g.nodes:
        op = get_op(node.op)
        if node.op not in _SHAPELESS_FUSED and (op is None or op.category not in _SHAPELESS):
            return False
        if any(isinstance(v, Value) and not v.is_tensor for v in node.inputs):
            return False
    return True


class _Part:
    """A run of launches compiled as one MLX function, or one launch run through torch (``eager``)."""

    def __init__(self, segment, ins: list[int], outs: list[int]):
        self.segment, self.ins, self.outs = segment, ins, outs
        self.eager = segment.eager
        self.fn: Callable | None = None


def _compile_part(part: _Part, baked: list, shapeless: bool) -> Callable:
    run, ins, outs = part.segment.run, part.ins, part.outs

    def region(arrays: list) -> list:
        env = list(baked)
        for slot, a in zip(ins, arrays):
            env[slot] = a
        run(env)
        return [env[s] for s in outs]
    return mx.compile(region, shapeless=shapeless)


def capture_compiled(backend, exe, session, leaves: list, env: list, signature: str):
    """The MLX capture of one call: ``(replay, static_env, source)`` for replay.capture.Captured."""
    from ...runtime.segments import split_plan     # the runtime sits beside backends; used on capture only
    from .backend import runs_through_torch

    nodes = {n.name: n for n in exe.program.graph.nodes}
    torch_launches = {l.name for l in exe.launches if l.name in nodes and runs_through_torch(nodes[l.name])}
    # RoPE frequencies are baked into the compiled functions (constants, not arguments): mx.fast.rope
    # needs their values to prove its angles exact (rope.exact_freqs), which a traced argument hides.
    # Their bytes join the compiled functions' key, so plans over other weights do not share them.
    rope_slots = sorted({l.kwargs["inv_freq"].i for l in exe.launches
                         if l.op == "ost.rope" and type(l.kwargs.get("inv_freq")) is _Slot})
    segments = split_plan(exe.launches, exe.kept_slots, lambda l: l.name in torch_launches,
                          name="mlx_part_")
    # The capture's own call, part by part, recording what each part reads and what it leaves.
    scope = backend.run_scope()
    run_env = list(env)
    parts: list[_Part] = []
    for seg in segments:
        produced = {o for l in seg.launches for o in l.outs if o >= 0}
        reads = sorted({s for l in seg.launches for s in slot_reads(l)} - produced)
        ins = [s for s in reads if type(run_env[s]) is mx.array and s not in rope_slots]
        if scope is None:
            seg.run(run_env)
        else:
            with scope:
                seg.run(run_env)
        outs = [s for s in sorted(seg.keep) if type(run_env[s]) is mx.array]
        parts.append(_Part(seg, ins, outs))
    mutations = exe._mutations
    news = [run_env[m[3]] for m in mutations]
    out_slots = [x for is_slot, x in exe._outputs if is_slot]
    mx.eval([run_env[s] for s in out_slots if type(run_env[s]) is mx.array] + [a for a in news if type(a) is mx.array])

    # Values fixed for this signature: everything the plan made or read that is not an array (and the
    # RoPE frequencies, above).
    baked = [None if type(v) is mx.array else v for v in run_env]
    for s in rope_slots:
        baked[s] = run_env[s]
    shapeless = shapeless_ok(exe)
    token = plan_token(exe._plan)
    sig = "*" if shapeless else signature + "|" + repr([leaves[p] for p, s in enumerate(exe.program.inputs)
                                                        if s.kind == "scalar"])
    if rope_slots:
        freqs = b"".join(np.array(run_env[s].astype(mx.float32)).tobytes() for s in rope_slots)
        sig += "|rope:" + hashlib.sha256(freqs).hexdigest()
    for index, part in enumerate(parts):
        if not part.eager:
            part.fn = op_graph_cache.get(("mlx.plan", token, index, sig, backend.kind),
                                         lambda p=part: _compile_part(p, baked, shapeless))

    # The captured call's results: state written, outputs copied into tensors the caller keeps.
    state = session.state
    for (role, target, name, _), new in zip(mutations, news):
        if role == "state":
            state[name].copy_(new)
        else:
            leaves[exe._input_pos_by_slot[target]].copy_(to_torch(new))
    senv = list(run_env)
    statics: list[tuple[int, torch.Tensor]] = []
    for s in out_slots:
        v = run_env[s]
        if type(v) is mx.array:
            t = to_torch(v).clone()
            senv[s] = t
            statics.append((s, t))

    template = exe._template
    input_slots = [(pos, slot) for pos, slot in exe._input_slots if isinstance(leaves[pos], torch.Tensor)]
    state_slots = exe._state_slots
    cells = [state[name] for _, name in state_slots]
    static_leaves = list(leaves)

    def replay() -> None:
        if scope is None:
            run_parts()
        else:
            with backend.run_scope():
                run_parts()

    def run_parts() -> None:
        e = list(template)
        for pos, slot in input_slots:
            e[slot] = to_mx(static_leaves[pos], borrowed=True)
        for (slot, _), cell in zip(state_slots, cells):
            e[slot] = cell.array
        for part in parts:
            if part.eager:
                part.segment.run(e)
            else:
                for slot, a in zip(part.outs, part.fn([e[s] for s in part.ins])):
                    e[slot] = a
        new = [e[m[3]] for m in mutations]
        mx.eval([e[s] for s, _ in statics] + new)
        for (role, target, name, _), a in zip(mutations, new):
            if role == "state":
                cell = state[name]
                if cell.mirror is None and type(a) is mx.array:
                    cell.array = a
                else:
                    cell.copy_(a)
            else:
                static_leaves[exe._input_pos_by_slot[target]].copy_(to_torch(a))
        for slot, t in statics:
            t.copy_(to_torch(e[slot]))

    compiled = sum(1 for p in parts if not p.eager)
    source = (f"# MLX replay of {exe.program.info.get('model', 'program')} ({signature or 'static'}): "
              f"{compiled} part(s) compiled with mx.compile (shapeless={shapeless}), "
              f"{len(parts) - compiled} launch(es) through torch between them\n")
    for index, part in enumerate(parts):
        kind = "torch" if part.eager else "mx.compile"
        source += f"# part {index} ({kind}): " + ", ".join(l.name for l in part.segment.launches[:8]) + \
            (" ..." if len(part.segment.launches) > 8 else "") + "\n"
    return replay, senv, source



