"""What replay refuses, with the message it gives: inputs of another shape or dtype, static buffers
resized or rebound, state replaced, non-contiguous inputs at capture, ops that cannot be captured
(random numbers, host syncs: named at capture time), and misuse of ostinato.Graph / ostinato.graph."""
from __future__ import annotations

import re

import pytest
import torch
from torch import nn

import ostinato
from helpers import BACKENDS, assert_same
from ostinato.errors import CaptureError, InputError, OstinatoError, ReplayError
from replay.replay_models import accumulator, eager, row_mlp


def captured(prog, x, device="cpu"):
    exe = ostinato.compile(prog, device=device)
    g = ostinato.Graph()
    with ostinato.graph(g):
        out = exe(x)
    return exe, g, out


# -- inputs of another shape or dtype -------------------------------------------------------------

@pytest.mark.parametrize("device", BACKENDS)
def test_replay_args_of_another_shape_static_program(device):
    _, prog = row_mlp(dynamic=False)
    _, g, _ = captured(prog, torch.randn(4, 8), device)
    with pytest.raises(InputError, match=r"input 0 \(x\): wrong shape; expected f32 tensor of shape \[4, 8\]"):
        g.replay(torch.randn(5, 8))


@pytest.mark.parametrize("device", BACKENDS)
def test_replay_args_on_another_device(device):
    """An input on another device (meta here: this machine has no GPU) is refused, naming the input,
    by the explicit replay and by compile(replay=True), before anything runs."""
    _, prog = row_mlp(dynamic=False)
    _, g, out = captured(prog, torch.randn(4, 8), device)
    kept = out.clone()
    with pytest.raises(InputError, match=r"input 0 \(x\): wrong device; expected a tensor on cpu, got f32 tensor "
                                         r"of shape \[4, 8\] on meta"):
        g.replay(torch.empty(4, 8, device="meta"))
    assert torch.equal(out, kept), "a refused replay must not run"
    exe = ostinato.compile(prog, device=device, replay=True)
    exe(torch.randn(4, 8))
    with pytest.raises(InputError, match=r"input 0 \(x\): wrong device"):
        exe(torch.empty(4, 8, device="meta"))
    assert exe.stats()["replays"] == 0


@pytest.mark.parametrize("device", BACKENDS)
def test_replay_args_of_another_shape_dynamic_program(device):
    """The program accepts batch 4, but the graph captured batch 3: ReplayError, not a silent resize."""
    model, prog = row_mlp(dynamic=True)
    _, g, out = captured(prog, torch.randn(3, 8), device)
    with pytest.raises(ReplayError, match=r"input 0 \(x\): captured f32\[3, 8\] on cpu, given f32\[4, 8\]"):
        g.replay(torch.randn(4, 8))
    # Nothing was copied: a good replay afterwards still works.
    x = torch.randn(3, 8)
    assert_same(g.replay(x), eager(model, x))


@pytest.mark.parametrize("device", BACKENDS)
def test_replay_args_of_another_dtype(device):
    _, prog = row_mlp(dynamic=True)
    _, g, _ = captured(prog, torch.randn(3, 8), device)
    with pytest.raises(InputError, match=r"input 0 \(x\): wrong dtype; expected f32 .* got f64"):
        g.replay(torch.randn(3, 8, dtype=torch.float64))
    with pytest.raises(InputError, match="wrong dtype"):
        g.replay(torch.randn(3, 8).half())


@pytest.mark.parametrize("device", BACKENDS)
def test_replay_args_wrong_count(device):
    _, prog = row_mlp(dynamic=False)
    _, g, _ = captured(prog, torch.randn(4, 8), device)
    with pytest.raises(InputError, match="inputs do not match the exported call"):
        g.replay(torch.randn(4, 8), torch.randn(4, 8))


# -- static buffers resized, rebound, reallocated -------------------------------------------------

@pytest.mark.parametrize("how", ["resize_larger", "resize_same_numel", "set_new_storage"])
@pytest.mark.parametrize("device", BACKENDS)
def test_reallocated_static_input(how, device):
    _, prog = row_mlp(dynamic=False)
    x = torch.randn(4, 8)
    _, g, _ = captured(prog, x, device)
    if how == "resize_larger":
        x.resize_(64, 8)
    elif how == "resize_same_numel":
        x.resize_(8, 4)
    else:
        x.set_(torch.randn(4, 8))
    with pytest.raises(ReplayError, match=r"input 0 \(x\): its storage was reallocated since capture"):
        g.replay()


@pytest.mark.parametrize("device", BACKENDS)
def test_in_place_update_is_not_a_reallocation(device):
    model, prog = row_mlp(dynamic=False)
    x = torch.randn(4, 8)
    _, g, out = captured(prog, x, device)
    x.copy_(torch.randn(4, 8))
    x.mul_(3.0)
    assert_same(g.replay(), eager(model, x))


@pytest.mark.parametrize("device", BACKENDS)
def test_reallocated_static_input_through_static_inputs(device):
    """compile(replay=True): the static inputs handed out by exe.static_inputs() are checked as well."""
    _, prog = row_mlp(dynamic=False)
    exe = ostinato.compile(prog, device=device, replay=True)
    exe(torch.randn(4, 8))
    (static,) = exe.static_inputs()
    static.set_(torch.randn(4, 8))
    with pytest.raises(ReplayError, match="storage was reallocated"):
        exe(static)


@pytest.mark.parametrize("device", BACKENDS)
def test_restrided_static_input_is_detected(device):
    class ViewAndCompute(nn.Module):
        def forward(self, x):
            return x * 2.0 + x.reshape(16)[:4]

    model = ViewAndCompute()
    x = torch.randn(4, 4)
    exe = ostinato.compile(ostinato.export(model, (x,)), device=device)
    g = ostinato.Graph()
    with ostinato.graph(g):
        exe(x)
    # Same storage, same shape, transposed strides: no reallocation, but not the captured buffer layout.
    x.set_(x.untyped_storage(), 0, (4, 4), (1, 4))
    try:
        result = g.replay()
    except ReplayError:
        return   # what the check should do
    assert_same(result, eager(model, x), msg="replay after a stride change:")


@pytest.mark.parametrize("device", BACKENDS)
def test_dtype_changed_in_place_raises_replay_error(device):
    _, prog = row_mlp(dynamic=False)
    x = torch.randn(4, 8)
    _, g, _ = captured(prog, x, device)
    x.data = x.data.view(torch.int32)
    with pytest.raises(ReplayError, match=r"input 0 \(x\)"):
        g.replay()


# -- state --------------------------------------------------------------------------------------

@pytest.mark.parametrize("device", BACKENDS)
def test_replaced_state_buffer_graph_api(device):
    model, prog = accumulator()
    exe, g, _ = captured(prog, torch.ones(2, 3), device)
    original = exe.session.state["total"]
    exe.session.state["total"] = original.clone()
    with pytest.raises(ReplayError, match=r"state buffer 'total' was replaced or reallocated since capture"):
        g.replay()
    # Putting the captured buffer back makes the graph usable again; the failed replay wrote nothing.
    exe.session.state["total"] = original
    assert float(g.replay()) == 12.0


@pytest.mark.parametrize("device", BACKENDS)
def test_replaced_state_buffer_replay_runner(device):
    _, prog = accumulator()
    exe = ostinato.compile(prog, device=device, replay=True)
    assert float(exe(torch.ones(2, 3))) == 6.0
    exe.session.state["total"] = torch.zeros(())
    with pytest.raises(ReplayError, match="state buffer 'total' was replaced"):
        exe(torch.ones(2, 3))


@pytest.mark.parametrize("device", BACKENDS)
def test_state_reset_in_place_is_allowed(device):
    _, prog = accumulator()
    exe = ostinato.compile(prog, device=device, replay=True)
    assert [float(exe(torch.ones(2, 3))) for _ in range(3)] == [6.0, 12.0, 18.0]
    exe.session.reset()
    assert [float(exe(torch.ones(2, 3))) for _ in range(2)] == [6.0, 12.0]
    assert exe.stats()["captures"] == 1


# -- capture-time refusals ----------------------------------------------------------------------

@pytest.mark.parametrize("device", BACKENDS)
def test_non_contiguous_input_at_explicit_capture(device):
    model, prog = row_mlp(dynamic=False)
    exe = ostinato.compile(prog, device=device)
    x = torch.randn(8, 4).t()
    assert not x.is_contiguous()
    g = ostinato.Graph()
    with pytest.raises(CaptureError, match=r"input 0 \(x\) is not contiguous.*x\.contiguous\(\)"):
        with ostinato.graph(g):
            exe(x)
    assert g.captured is None
    # The same Graph captures a contiguous input afterwards.
    y = x.contiguous()
    with ostinato.graph(g):
        out = exe(y)
    assert_same(out, eager(model, x))


@pytest.mark.parametrize("device", BACKENDS)
def test_non_contiguous_input_is_fine_with_replay_runner(device):
    """compile(replay=True) copies inputs into its own contiguous static buffers."""
    model, prog = row_mlp(dynamic=False)
    exe = ostinato.compile(prog, device=device, replay=True)
    for _ in range(2):
        x = torch.randn(8, 4).t()
        assert_same(exe(x), eager(model, x))


class Noisy(nn.Module):
    def forward(self, x):
        noise = torch.rand(x.shape)
        return x + noise


class ItemScaled(nn.Module):
    def forward(self, x):
        scale = x.abs().sum().item()
        return x * scale


class NonZero(nn.Module):
    def forward(self, x):
        return torch.nonzero(x > 0)


UNCAPTURABLE = {
    # model, the op the error must name, the source text it must quote, the reason
    "rand": (Noisy, "aten.rand", "torch.rand(x.shape)", "draws random numbers"),
    "item": (ItemScaled, "aten._local_scalar_dense", ".item()", "reads tensor data on the host"),
    "nonzero": (NonZero, "aten.nonzero", "torch.nonzero(x > 0)", "reads tensor data on the host"),
}


@pytest.fixture(scope="module")
def uncapturable_programs():
    torch.manual_seed(0)
    return {name: ostinato.export(model(), (torch.randn(3, 4),)) for name, (model, *_) in UNCAPTURABLE.items()}


@pytest.mark.parametrize("name", list(UNCAPTURABLE))
@pytest.mark.parametrize("device", BACKENDS)
def test_uncapturable_op_named_at_capture(name, uncapturable_programs, device):
    model_cls, op, source, why = UNCAPTURABLE[name]
    prog = uncapturable_programs[name]
    # torch.export keeps the op: the program holds it.
    assert op in [n.op for n in prog.graph.nodes]
    pattern = rf"cannot capture {op.replace('.', '[.]')} \(node .*{re.escape(source)}.*{why}"
    exe = ostinato.compile(prog, device=device, replay=True)
    x = torch.randn(3, 4)
    with pytest.raises(CaptureError, match=pattern):
        exe(x)
    assert exe.stats()["captures"] == 0 and exe.memory_report() == []
    g = ostinato.Graph()
    with pytest.raises(CaptureError, match=pattern):
        with ostinato.graph(g):
            ostinato.compile(prog, device=device)(x)
    assert g.captured is None
    # Step by step the same program runs.
    step = ostinato.compile(prog, device=device)
    out = step(x)
    if name == "rand":
        noise = out - x
        assert out.shape == x.shape and bool((noise >= 0).all()) and bool((noise < 1).all())
    else:
        assert_same(out, eager(model_cls(), x))


# -- misuse of Graph / graph() ------------------------------------------------------------------

@pytest.mark.parametrize("device", BACKENDS)
def test_replay_before_capture(device):
    g = ostinato.Graph()
    with pytest.raises(CaptureError, match="holds no capture"):
        g.replay()
    with pytest.raises(CaptureError, match="holds no capture"):
        g.replay(torch.randn(4, 8))
    with pytest.raises(CaptureError, match="holds no capture"):
        g.outputs  # noqa: B018


@pytest.mark.parametrize("where", ["same_block", "second_block"])
@pytest.mark.parametrize("device", BACKENDS)
def test_graph_captured_twice(where, device):
    model, prog = row_mlp(dynamic=False)
    exe = ostinato.compile(prog, device=device)
    x = torch.randn(4, 8)
    g = ostinato.Graph()
    if where == "same_block":
        with pytest.raises(CaptureError, match="already holds a capture; use a new Graph"):
            with ostinato.graph(g):
                out = exe(x)
                exe(torch.randn(4, 8))
    else:
        with ostinato.graph(g):
            out = exe(x)
        with pytest.raises(CaptureError, match="already holds a capture; use a new Graph"):
            with ostinato.graph(g):
                exe(torch.randn(4, 8))
    # The first capture is intact: its static input is still x.
    x.copy_(torch.randn(4, 8))
    assert g.replay() is out
    assert_same(out, eager(model, x))


@pytest.mark.parametrize("device", BACKENDS)
def test_nested_graph(device):
    model, prog = row_mlp(dynamic=False)
    exe = ostinato.compile(prog, device=device)
    outer, inner = ostinato.Graph(), ostinato.Graph()
    x = torch.randn(4, 8)
    with pytest.raises(CaptureError, match="already capturing on this thread; captures do not nest"):
        with ostinato.graph(outer):
            with ostinato.graph(inner):
                exe(x)
    assert outer.captured is None and inner.captured is None
    # Nothing is left open: a plain call runs, and a new capture works.
    assert_same(exe(x), eager(model, x))
    with ostinato.graph(inner):
        out = exe(x)
    assert inner.outputs is out


@pytest.mark.parametrize("device", BACKENDS)
def test_graph_needs_a_graph(device):
    with pytest.raises(TypeError, match="takes an ostinato.Graph"):
        with ostinato.graph("not a graph"):
            pass


@pytest.mark.parametrize("device", BACKENDS)
def test_buckets_need_replay(device):
    _, prog = row_mlp(dynamic=True)
    with pytest.raises(OstinatoError, match="buckets only apply with replay=True"):
        ostinato.compile(prog, device=device, buckets={"batch": "pow2"})


@pytest.mark.parametrize("device", BACKENDS)
def test_static_inputs_misuse(device):
    _, prog = row_mlp(dynamic=False)
    with pytest.raises(OstinatoError, match=r"static_inputs\(\) needs an executable compiled with replay=True"):
        ostinato.compile(prog, device=device).static_inputs()
    with pytest.raises(ReplayError, match="no capture yet in this session"):
        ostinato.compile(prog, device=device, replay=True).static_inputs()
