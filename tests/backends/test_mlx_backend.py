"""The MLX backend's own contract: device names, the install hint when MLX is missing, strict=True,
ops run through torch (counted), weights shared by sessions, the compiled-plan cache and shapeless
compiles. Model and op coverage live in tests/models, tests/ops and tests/replay (parametrized)."""
from __future__ import annotations

import sys

import pytest
import torch
from torch.export import Dim

import ostinato
from helpers import assert_same, host
from ostinato.errors import BackendError, UnsupportedOpError

pytestmark = pytest.mark.mlx


class AdaptiveMax(torch.nn.Module):
    """aten.adaptive_max_pool2d has no MLX handler (tests/ops/mlx_expected.py): it runs through torch."""

    def forward(self, x):
        return torch.nn.functional.adaptive_max_pool2d(x * 2, 3).sin() + 1


def _mlp():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4)).eval()
    return model, ostinato.export(model, (torch.randn(3, 8),))


@pytest.mark.parametrize("name", ["mlx", "mlx:cpu", "MLX:CPU"])
def test_device_names(name):
    model, prog = _mlp()
    exe = ostinato.compile(prog, device=name)
    assert exe.backend.name == "mlx" and exe.backend.label in ("mlx:cpu", "mlx:gpu")
    x = torch.randn(3, 8)
    out = exe(x)
    assert isinstance(out, torch.Tensor) and out.device.type == "cpu"
    assert_same(out, model(x).detach())


def test_unknown_and_unavailable_mlx_devices():
    _, prog = _mlp()
    with pytest.raises(BackendError, match="not an MLX device"):
        ostinato.compile(prog, device="mlx:tpu")
    import mlx.core as mx
    if not mx.metal.is_available():
        with pytest.raises(BackendError, match="no Metal GPU.*mlx:cpu"):
            ostinato.compile(prog, device="mlx:gpu")


def test_missing_mlx_names_the_install_command(monkeypatch):
    _, prog = _mlp()
    monkeypatch.setitem(sys.modules, "mlx.core", None)     # import mlx.core raises ImportError
    with pytest.raises(BackendError, match=r"pip install 'mlx\[cpu\]'"):
        ostinato.compile(prog, device="mlx")


def test_ops_without_handler_run_through_torch_or_are_refused_when_strict():
    model = AdaptiveMax()
    prog = ostinato.export(model, (torch.randn(1, 2, 7, 7),))
    exe = ostinato.compile(prog, device="mlx")
    assert exe.stats()["torch_bridged"] == 1
    x = torch.randn(1, 2, 7, 7)
    assert_same(exe(x), model(x))
    with pytest.raises(UnsupportedOpError, match="(?s)aten.adaptive_max_pool2d.*strict=True"):
        ostinato.compile(prog, device="mlx", strict=True)


def test_replay_splits_at_ops_through_torch():
    """A plan with an op run through torch replays as compiled parts around it."""
    model = AdaptiveMax()
    exe = ostinato.compile(ostinato.export(model, (torch.randn(1, 2, 7, 7),)), device="mlx", replay=True)
    for _ in range(3):
        x = torch.randn(1, 2, 7, 7)
        assert_same(exe(x), model(x))
    g = ostinato.Graph()
    with ostinato.graph(g):
        exe2 = ostinato.compile(ostinato.export(model, (torch.randn(1, 2, 7, 7),)), device="mlx")
        exe2(torch.randn(1, 2, 7, 7))
    assert "through torch" in g.source and "1 launch(es) through torch" in g.source


def test_sessions_share_the_weights():
    _, prog = _mlp()
    exe = ostinato.compile(prog, device="mlx")
    a, b = exe.new_session(), exe.new_session()
    assert a.executable._template is b.executable._template      # one copy of the weights per executable
    import mlx.core as mx
    assert all(type(w) is mx.array for w in exe._template if w is not None)


def test_compiled_plans_are_cached_and_counted():
    """One mx.compile per (plan, shape signature): a second executable and a second session of the same
    program reuse it (hits in ostinato.cache.stats()["op_graph"])."""
    model, prog = _mlp()
    first = ostinato.compile(prog, device="mlx", replay=True)
    x = torch.randn(3, 8)
    first(x)
    before = ostinato.cache.stats()["op_graph"]
    second = ostinato.compile(prog, device="mlx", replay=True)
    assert_same(second(x), model(x).detach())
    assert_same(second.new_session()(x), model(x).detach())
    after = ostinato.cache.stats()["op_graph"]
    assert after["hits"] >= before["hits"] + 2


def test_shapeless_compile_for_a_dynamic_elementwise_program():
    class Act(torch.nn.Module):
        def forward(self, x):
            return torch.nn.functional.silu(x) * 2 + 1

    prog = ostinato.export(Act(), (torch.randn(4, 8),), dynamic_shapes=({0: Dim("n", min=2, max=64)},))
    exe = ostinato.compile(prog, device="mlx", replay=True)
    for n in (4, 9, 17):
        x = torch.randn(n, 8)
        assert_same(exe(x), Act()(x))
    assert exe.stats()["captures"] == 3       # one capture per size (the session's static buffers)...
    from ostinato.backends.mlx.replay import shapeless_ok
    assert shapeless_ok(exe)                  # ...over one compiled function for every size


def test_state_buffers_are_cells_reset_in_place():
    class Counter(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("n", torch.zeros(2))

        def forward(self, x):
            self.n.add_(x)
            return self.n * 1

    exe = ostinato.compile(ostinato.export(Counter(), (torch.ones(2),)), device="mlx", replay=True)
    cell = exe.session.state["n"]
    for k in range(1, 4):
        assert host(exe(torch.ones(2))).tolist() == [k, k]
    assert exe.session.state["n"] is cell and host(cell).tolist() == [3.0, 3.0]
    exe.session.reset()
    assert host(exe(torch.ones(2))).tolist() == [1.0, 1.0]


@pytest.mark.parametrize("replay", [False, True])
def test_llm_generate_on_mlx_equals_cpu(replay):
    """ostinato.llm's prefill/decode program generates the same greedy tokens on MLX as on the CPU."""
    import transformers

    import ostinato.llm
    torch.manual_seed(0)
    config = transformers.LlamaConfig(num_hidden_layers=2, hidden_size=64, intermediate_size=128,
                                      num_attention_heads=4, num_key_value_heads=2, vocab_size=256)
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    prog = ostinato.llm.export_causal_lm(model, max_cache_len=32)
    ids = torch.tensor([[1, 5, 9]])
    want = ostinato.compile(prog, device="cpu").generate(ids, max_new_tokens=10)
    got = ostinato.compile(prog, device="mlx", replay=replay).generate(ids, max_new_tokens=10)
    assert got.tolist() == want.tolist() and got.shape[1] == 13


@pytest.mark.parametrize("replay", [False, True])
def test_custom_ops_run_through_torch_on_mlx(replay):
    """torch.library custom ops (fallback.* nodes, one with host work, one with two results) run through
    torch between MLX parts, step by step and under replay."""
    from frontend.fallback_ops import model_and_input
    model, x = model_and_input()
    exe = ostinato.compile(ostinato.export(model, (x,)), device="mlx", replay=replay)
    assert exe.stats()["torch_bridged"] >= 2
    for step in range(3):
        inputs = x * (step + 1)
        assert_same(exe(inputs), model(inputs), msg=f"step {step}:")
