"""Replay of plans with ops run through eager torch (fallback.*).

On the CPU the tape runs those ops as they are. On CUDA the plan is split into regions at them, each
captured as its own graph; the split and the region-by-region capture are device-agnostic and tested
here on the CPU with a stand-in for a CUDA graph that keeps a graph's contract (results stay in the
tensors the capture stored). The CUDA test itself runs on the lent GPU.
"""
from __future__ import annotations

import copy

import pytest
import torch

import ostinato
from ostinato.ir.fallback import is_fallback
from ostinato.replay.regions import capture_steps, chain, write_back
from ostinato.runtime.segments import run_segments, split_plan
from frontend.fallback_ops import model_and_input
from helpers import assert_same, assert_replay_counts


class Accumulates(torch.nn.Module):
    """State written every call, and a plan that ends with an eager op (the writes get a region)."""

    def __init__(self, dim: int = 8):
        super().__init__()
        self.lin = torch.nn.Linear(dim, dim)
        self.register_buffer("total", torch.zeros(dim))

    def forward(self, x):
        h = torch.ops.ostinato_fb.scale_shift(self.lin(x), 0.25)
        self.total.add_(h.sum(0))
        return torch.ops.ostinato_fb.center_on_host(h * self.total)


def _exported(model, x):
    return ostinato.export(copy.deepcopy(model), (x,))


def test_segments_split_at_fallback_ops_and_run_as_the_plan():
    model, x = model_and_input(seed=5)
    exe = ostinato.compile(_exported(model, x), device="cpu")
    segments = exe.segments
    eager = [s for s in segments if s.eager]
    assert [s.launches[0].op for s in eager] == [l.op for l in exe.launches if is_fallback(l.op)]
    assert len(eager) == 3 and all(len(s.launches) == 1 for s in eager)
    assert [s.eager for s in segments] == [False, True, False, True, False, True, False]
    assert [l for s in segments for l in s.launches] == exe.launches      # order and launches kept
    assert all(s.launches for s in segments)
    assert not any(is_fallback(l.op) for s in segments if not s.eager for l in s.launches)
    for _ in range(3):
        x = torch.randn(3, 16)
        leaves, _ = exe.check_inputs((x,), {})
        whole, split = exe.bind(exe.session, leaves), exe.bind(exe.session, leaves)
        exe._plan(whole)
        run_segments(segments, split)
        assert_same(exe.outputs(split), exe.outputs(whole))
        assert_same(exe.outputs(split), model(x))


def test_a_segment_keeps_only_what_later_segments_or_the_caller_read():
    model, x = model_and_input(seed=6)
    exe = ostinato.compile(_exported(model, x), device="cpu")
    segments = exe.segments
    for i, seg in enumerate(segments):
        later_reads = {a.i for s in segments[i + 1:] for l in s.launches
                       for a in (*l.args, *l.kwargs.values()) if type(a).__name__ == "_Slot"}
        later_reads |= {x.i for s in segments[i + 1:] for l in s.launches
                        for a in (*l.args, *l.kwargs.values()) if type(a).__name__ == "_SlotList"
                        for x in a.items if type(x).__name__ == "_Slot"}
        produced = {o for l in seg.launches for o in l.outs if o >= 0}
        assert seg.keep == produced & (later_reads | exe.kept_slots)
    # No break: one region holding the whole plan.
    whole = split_plan(exe.launches, exe.kept_slots, lambda launch: False)
    assert len(whole) == 1 and not whole[0].eager and whole[0].launches == exe.launches


def cpu_graph_capture(segment, env: list, writes: list):
    """A CUDA graph's contract on the CPU: the region runs now; a replay recomputes it from the buffers
    it read and writes the results into the very tensors this call stored (what later regions read)."""
    before = list(env)
    segment.run(env)
    write_back(env, writes)
    statics = {i: env[i] for i in segment.keep}

    def replay():
        scratch = list(before)
        segment.run(scratch)
        for i, t in statics.items():
            t.copy_(scratch[i])
        write_back(env, writes)
    return replay


@pytest.mark.parametrize("which", ["three_ops", "state_and_trailing_op"])
def test_region_by_region_capture_replays_like_eager(which):
    if which == "three_ops":
        model, x = model_and_input(seed=7)
    else:
        torch.manual_seed(7)
        model, x = Accumulates().eval(), torch.randn(4, 8)
    eager = copy.deepcopy(model)
    exe = ostinato.compile(_exported(model, x), device="cpu")
    session = exe.new_session()
    static_x = x.clone()
    leaves, _ = exe.check_inputs((static_x,), {})
    env = exe.bind(session, leaves)
    writes = exe.mutation_targets(session, leaves)
    steps = capture_steps(exe.segments, env, cpu_graph_capture, writes)
    regions = sum(not s.eager for s in exe.segments) + (exe.segments[-1].eager and bool(writes))
    assert len(steps) == len(exe.segments) + (exe.segments[-1].eager and bool(writes))
    assert regions >= 2
    outputs = exe.outputs(env)                  # the capture is this call
    with torch.no_grad():
        assert_same(outputs, eager(x), msg="capture")
    replay = chain(steps)
    for step in range(4):
        x = torch.randn_like(x) * (step + 2)
        static_x.copy_(x)
        replay()
        with torch.no_grad():
            ref = eager(x)
        assert_same(outputs, ref, msg=f"replay {step}")   # the same tensors, updated in place
    for name, buf in eager.named_buffers():
        assert_same(session.state[name], buf, msg=name)


def test_cpu_tape_runs_fallback_ops_as_they_are():
    torch.manual_seed(8)
    model, x = Accumulates().eval(), torch.randn(4, 8)
    eager = copy.deepcopy(model)
    exe = ostinato.compile(_exported(model, x), device="cpu")
    g = ostinato.Graph()
    static_x = x.clone()
    with ostinato.graph(g):
        out = exe(static_x)
    with torch.no_grad():
        assert_same(out, eager(x))
    fallback_names = [l.name for l in exe.launches if is_fallback(l.op)]
    lines = g.source.splitlines()
    for name in fallback_names:     # on the tape, never frozen; computed as is, then copied in
        line = next(line for line in lines if line.endswith(f"# {name}"))
        assert line.strip().startswith("_r = ") and "out=" not in line
    for step in range(3):
        x = torch.randn(4, 8)
        out = g.replay(x)
        with torch.no_grad():
            assert_same(out, eager(x), msg=f"replay {step}")
    assert_same(exe.session.state["total"], eager.total)


@pytest.mark.cuda
def test_cuda_replay_captures_regions_around_host_work():
    model, x = model_and_input(seed=9)
    model = model.cuda()
    prog = ostinato.export(copy.deepcopy(model), (x.cuda(),))
    exe = ostinato.compile(prog, device="cuda", replay=True)
    assert [s.eager for s in exe.segments] == [False, True, False, True, False, True, False]
    for step in range(5):
        x = torch.randn(3, 16, device="cuda") * (step + 1)
        out = exe(x)
        with torch.no_grad():
            ref = model(x)
        assert_same(out, ref, tol=1e-4, msg=f"step {step}")
    assert_replay_counts(exe.stats(), calls=5)
    torch.manual_seed(10)
    acc = Accumulates().eval().cuda()
    eager = copy.deepcopy(acc)
    x = torch.randn(4, 8, device="cuda")
    exe = ostinato.compile(ostinato.export(copy.deepcopy(acc), (x,)), device="cuda", replay=True)
    for step in range(4):
        x = torch.randn(4, 8, device="cuda")
        out = exe(x)
        with torch.no_grad():
            assert_same(out, eager(x), tol=1e-4, msg=f"accumulate step {step}")
    assert_same(exe.session.state["total"], eager.total, tol=1e-4)
