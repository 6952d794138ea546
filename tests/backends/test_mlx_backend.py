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


# -- RoPE through mx.fast.rope (backends/mlx/rope.py) --------------------------------------------------
@pytest.fixture
def fast_rope_calls(monkeypatch):
    """How many times mx.fast.rope ran (counted through the attribute the handler calls)."""
    import mlx.core as mx
    calls = [0]
    real = mx.fast.rope

    def counting(*args, **kwargs):
        calls[0] += 1
        return real(*args, **kwargs)
    monkeypatch.setattr(mx.fast, "rope", counting)
    return calls


def _fast_ropes(exe) -> int:
    """ost.rope launches that lowering proved mx.fast.rope-able."""
    return sum(1 for l in exe.launches if l.op == "ost.rope" and "inv_freq" in l.kwargs)


@pytest.mark.parametrize("replay", [False, True])
@pytest.mark.parametrize("family", ["llama", "qwen2", "gemma"])
def test_hf_decoders_rope_through_mx_fast_rope(family, replay, fast_rope_calls):
    """transformers' Llama/Qwen2/Gemma (from_config, random weights): every ost.rope runs mx.fast.rope,
    over a prefill and 8 decode steps with the static cache as state, equal to eager (fp32, 1e-5)."""
    import copy
    sys.path.insert(0, str(__import__("pathlib").Path(__file__).parents[1] / "models"))
    from test_hf_decoders import VOCAB, decode_inputs, make_wrapper
    wrapper = make_wrapper(family)
    gen = torch.Generator().manual_seed(3)
    ref = copy.deepcopy(wrapper)
    prefill = {"input_ids": torch.randint(0, VOCAB, (2, 5), generator=gen), "cache_position": torch.arange(5)}
    exe_prefill = ostinato.compile(ostinato.export(copy.deepcopy(wrapper), (), prefill, trace_strict=True),
                                   device="mlx", replay=replay)
    exe = ostinato.compile(ostinato.export(wrapper, (), decode_inputs(0, gen), trace_strict=True),
                           device="mlx", replay=replay)
    n_layers = 2
    assert _fast_ropes(exe) == _fast_ropes(exe_prefill) == 2 * n_layers   # q and k of each layer

    with torch.no_grad():
        expected = copy.deepcopy(ref)(**prefill)
    assert_same(exe_prefill(**prefill), expected, msg=f"{family} prefill")
    for s in range(8):
        kwargs = decode_inputs(s, gen)
        with torch.no_grad():
            expected = ref(**kwargs)
        assert_same(exe(**kwargs), expected, msg=f"{family} step {s}")
    if not replay:   # under replay, compiled functions may come from the cache (no trace to count)
        assert fast_rope_calls[0] == 2 * n_layers * (1 + 8)


class _HFRope(torch.nn.Module):
    """transformers' LlamaRotaryEmbedding + apply_rotary_pos_emb on q, k ([B, H, L, D]); positions
    are ``offset + arange(L)`` (contiguous) or the ``position_ids`` input (anything)."""

    def __init__(self, contiguous: bool, theta: float = 10000.0):
        super().__init__()
        import transformers
        from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding
        config = transformers.LlamaConfig(hidden_size=128, num_attention_heads=4, rope_theta=theta,
                                          max_position_embeddings=8192)
        self.rotary = LlamaRotaryEmbedding(config)
        self.contiguous = contiguous

    def forward(self, q, k, positions):
        from transformers.models.llama.modeling_llama import apply_rotary_pos_emb
        if self.contiguous:           # positions: the offset, a 0-d tensor
            positions = (torch.arange(q.shape[-2]) + positions)[None]
        cos, sin = self.rotary(q, positions)
        return apply_rotary_pos_emb(q, k, cos, sin)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("replay", [False, True])
def test_rope_with_contiguous_positions_uses_mx_fast_rope(dtype, replay, fast_rope_calls):
    """Contiguous positions at large offsets (angles in the thousands): mx.fast.rope, equal to eager
    within DESIGN.md's tolerance for the dtype. The float16 model's inv_freq is a float16 buffer (widened
    in the graph); the bfloat16 one keeps a float32 inv_freq, since this table rounded to bfloat16 has
    an entry no float32 reciprocal gives back (0.056152344: that rope would stay elementwise)."""
    model = _HFRope(contiguous=True)
    inv = model.rotary.inv_freq.clone()
    model = model.to(dtype)
    if dtype == torch.bfloat16:
        model.rotary.register_buffer("inv_freq", inv, persistent=False)
    gen = torch.Generator().manual_seed(0)
    q, k = (torch.randn(2, 4, 7, 32, generator=gen).to(dtype) for _ in range(2))
    prog = ostinato.export(model, (q, k, torch.tensor(0)))
    exe = ostinato.compile(prog, device="mlx", replay=replay)
    assert _fast_ropes(exe) == 2
    for offset in (0, 1, 1000, 4093):
        with torch.no_grad():
            expected = model(q, k, torch.tensor(offset))
        assert_same(exe(q, k, torch.tensor(offset)), expected, msg=f"offset {offset}")
    if not replay:
        assert fast_rope_calls[0] == 8


@pytest.mark.parametrize("replay", [False, True])
def test_rope_with_arbitrary_position_ids_stays_elementwise(replay, fast_rope_calls):
    """position_ids as a model input (not provably contiguous: here shuffled, repeated, per batch
    row): no mx.fast.rope, and the outputs equal eager's."""
    model = _HFRope(contiguous=False)
    gen = torch.Generator().manual_seed(1)
    q, k = torch.randn(2, 4, 6, 32, generator=gen), torch.randn(2, 4, 6, 32, generator=gen)
    positions = torch.tensor([[5, 3, 3, 900, 0, 17], [2, 40, 41, 7, 7, 1]])
    exe = ostinato.compile(ostinato.export(model, (q, k, positions)), device="mlx", replay=replay)
    assert _fast_ropes(exe) == 0
    for pos in (positions, torch.arange(6).expand(2, 6) + 11, positions.flip(-1)):
        with torch.no_grad():
            expected = model(q, k, pos)
        assert_same(exe(q, k, pos), expected)
    assert fast_rope_calls[0] == 0


class _Interleaved(torch.nn.Module):
    """GPT-J style: pairs (x[2i], x[2i+1]) rotated, tables by repeat_interleave; ``layout`` "bhld"
    ([B, H, L, D]) or "blhd" ([B, L, H, D], the tables unsqueezed at the head axis)."""

    def __init__(self, d: int = 16, layout: str = "bhld", inv_freq: torch.Tensor | None = None):
        super().__init__()
        if inv_freq is None:
            inv_freq = 1.0 / (10000 ** (torch.arange(0, d, 2).float() / d))
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        self.layout = layout

    def forward(self, x, offset):
        seq = -2 if self.layout == "bhld" else -3
        pos = torch.arange(x.shape[seq]) + offset
        emb = torch.repeat_interleave(pos[:, None].float() * self.inv_freq, 2, dim=-1)
        cos, sin = emb.cos().to(x.dtype), emb.sin().to(x.dtype)
        if self.layout == "blhd":
            cos, sin = cos[:, None], sin[:, None]
        rot = torch.stack([-x[..., 1::2], x[..., ::2]], -1).flatten(-2)
        return x * cos + rot * sin


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("layout", ["bhld", "blhd"])
def test_interleaved_rope_uses_mx_fast_rope_traditional(layout, dtype, fast_rope_calls):
    """x[..., ::2]/x[..., 1::2] pairs (ost.rope interleaved=True) through mx.fast.rope(traditional=True),
    for x as [B, H, L, D] and as [B, L, H, D] (the sequence axis swapped to -2 around the call)."""
    model = _Interleaved(layout=layout)
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(2, 5, 3, 16, generator=gen).to(dtype)
    prog = ostinato.export(model, (x, torch.tensor(0)))
    assert prog.op_counts().get("ost.rope") == 1      # the rope pass made one interleaved ost.rope
    exe = ostinato.compile(prog, device="mlx")
    assert [l.args[3] for l in exe.launches if l.op == "ost.rope"] == [True] and _fast_ropes(exe) == 1
    for offset in (0, 3, 2000):
        with torch.no_grad():
            expected = model(x, torch.tensor(offset))
        assert_same(exe(x, torch.tensor(offset)), expected, msg=f"offset {offset}")
    assert fast_rope_calls[0] == 3


def test_rope_frequencies_without_an_exact_reciprocal_stay_elementwise(fast_rope_calls):
    """mx.fast.rope takes 1/inv_freq and inverts it back: an inv_freq no float32 reciprocal gives back
    exactly would change the angles, so that rope stays elementwise (and still equals eager)."""
    import numpy as np
    candidates = np.arange(np.float32(0.999), np.float32(0.99999), np.float32(1e-7), dtype=np.float32)
    reachable = set((np.float32(1) / (np.float32(1) / candidates.astype(np.float64)).astype(np.float32)
                     ).tolist())
    for delta in (-1, 0, 1):
        reachable |= set((np.float32(1) / ((np.float32(1) / candidates).view(np.int32) + delta)
                          .view(np.float32)).tolist())
    lonely = next(float(c) for c in candidates if float(c) not in reachable)
    inv = 1.0 / (10000 ** (torch.arange(0, 16, 2).float() / 16))
    inv[1] = lonely
    model = _Interleaved(inv_freq=inv)
    x = torch.randn(2, 3, 5, 16, generator=torch.Generator().manual_seed(4))
    exe = ostinato.compile(ostinato.export(model, (x, torch.tensor(0))), device="mlx")
    assert _fast_ropes(exe) == 1        # the graph is the recipe; the values are what refuse it
    for offset in (0, 3000):
        with torch.no_grad():
            expected = model(x, torch.tensor(offset))
        assert_same(exe(x, torch.tensor(offset)), expected)
    assert fast_rope_calls[0] == 0


@pytest.mark.parametrize("replay", [False, True])
def test_llm_prefill_and_decode_rope_through_mx_fast_rope(replay, fast_rope_calls):
    """ostinato.llm's program (positions ``pos + arange(L)``, ``pos`` a [1] input): both methods' ropes
    are proven, and generate() gives the CPU's greedy tokens."""
    import transformers

    import ostinato.llm
    torch.manual_seed(0)
    config = transformers.Qwen2Config(num_hidden_layers=2, hidden_size=64, intermediate_size=128,
                                      num_attention_heads=4, num_key_value_heads=2, vocab_size=256)
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    prog = ostinato.llm.export_causal_lm(model, max_cache_len=32)
    exe = ostinato.compile(prog, device="mlx", replay=replay)
    assert _fast_ropes(exe) == _fast_ropes(exe.methods["prefill"]) == 4
    ids = torch.tensor([[1, 5, 9, 30, 2]])
    want = ostinato.compile(prog, device="cpu").generate(ids, max_new_tokens=8)
    assert exe.generate(ids, max_new_tokens=8).tolist() == want.tolist()
    if not replay:
        assert fast_rope_calls[0] >= 4 * 8


def test_rope_with_attention_scaling_uses_mx_fast_rope(fast_rope_calls):
    """YaRN scaling: a changed inv_freq (still a constant) and cos/sin times attention_scaling (1.14):
    the scaling multiplies mx.fast.rope's result."""
    import transformers
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding
    model = _HFRope(contiguous=True)
    model.rotary = LlamaRotaryEmbedding(transformers.LlamaConfig(
        hidden_size=128, num_attention_heads=4, max_position_embeddings=8192,
        rope_scaling={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 2048}))
    assert model.rotary.attention_scaling != 1.0
    gen = torch.Generator().manual_seed(5)
    q, k = torch.randn(2, 4, 7, 32, generator=gen), torch.randn(2, 4, 7, 32, generator=gen)
    exe = ostinato.compile(ostinato.export(model, (q, k, torch.tensor(0))), device="mlx")
    assert [l.kwargs.get("scaling") for l in exe.launches if l.op == "ost.rope"] == \
        [pytest.approx(model.rotary.attention_scaling)] * 2
    for offset in (0, 3000):
        with torch.no_grad():
            expected = model(q, k, torch.tensor(offset))
        assert_same(exe(q, k, torch.tensor(offset)), expected)
    assert fast_rope_calls[0] == 4


@pytest.mark.parametrize("layout", ["head_major", "sequence_major", "partial_rotary", "head_norms", "wide_rope",
                                    "whole_norms"])
def test_decode_attention_handler_matches_the_reference(layout):
    """ost.decode_attention_ (made by the CUDA code generator; an .ost lowered for CUDA may reach MLX) on
    [B, H, S, D] caches written on dim 2 and on [B, S, H, D] caches written on dim 1, with rope and GQA,
    with a partial rotary embedding, with the heads' norms over [B, 1, H, D] rows and with OLMo 2's norms
    of [B, 1, H * D] rows: the attention and both written caches equal the torch reference's."""
    import mlx.core as mx

    from ostinato.backends.mlx.convert import to_mx, to_torch
    from ostinato.backends.mlx.ops import HANDLERS
    from ostinato.ir.fused_ops import decode_attention_
    g = torch.Generator().manual_seed(3)
    major = layout == "sequence_major"
    cache, row = ((2, 12, 2, 8), (2, 1, 2, 8)) if major else ((2, 2, 12, 8), (2, 2, 1, 8))
    q = torch.randn(*((2, 1, 4, 8) if major else (2, 4, 1, 8)), generator=g)
    caches = [torch.randn(*cache, generator=g) for _ in range(2)]
    k, v = torch.randn(*row, generator=g), torch.randn(*row, generator=g)
    width = 4 if layout == "partial_rotary" else 8
    cos, sin = torch.randn(1, 1, 1, width, generator=g), torch.randn(1, 1, 1, width, generator=g)
    index, pos = torch.tensor([5]), torch.tensor([[5]])
    if layout in ("head_norms", "whole_norms"):      # Qwen 3's rows, before the transpose
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
    if layout == "whole_norms":     # OLMo 2's: q and k as the projections' rows, normed whole
        q, k = q.reshape(2, 1, 32), k.reshape(2, 1, 16)
    args = (q, k, v, index, 1 if major else 2, None, cos, sin, False, pos, None, 2)
    if layout == "partial_rotary":
        args += (None, None, None, None, 0.0, None, 0.0, False, 4)
    elif layout == "head_norms":
        args += (None, None, torch.rand(8, generator=g) + 0.5, torch.rand(8, generator=g) + 0.5, 1e-6, torch.float32)
    elif layout == "whole_norms":
        args += (None, None, torch.rand(32, generator=g) + 0.5, torch.rand(16, generator=g) + 0.5, 1e-6,
                 torch.float32, 0.0, True)
    elif layout == "wide_rope":     # half rows and caches, an fp32 cos: the rope in fp32, cast back
        caches = [c.half() for c in caches]
        args = (q.half(), k.half(), v.half(), *args[3:], None, None, None, None, 0.0, None, 0.0, False, None, True)
    expected = decode_attention_(*[c.clone() for c in caches], *args)
    got = HANDLERS["ost.decode_attention_"](*[to_mx(c) for c in caches],
                                             *[to_mx(a) if isinstance(a, torch.Tensor) else a for a in args])
    mx.eval(*got)
    for name, e, r in zip(("attention", "k_cache", "v_cache"), expected, got):
        assert_same(to_torch(r), e, tol=1e-3 if layout == "wide_rope" else 1e-5, msg=f"{layout} {name}:")
