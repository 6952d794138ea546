"""torch.compile(backend="ostinato") on the model tests' models, against eager PyTorch.

Every test asserts, through ostinato.dynamo.stats(), that ostinato really ran the graphs (an eager
fallback would also match eager). Models keep their state (KV caches) in buffers: after the steps,
the compiled model's buffers must equal the eager copy's, since the backend writes the model's own.
"""
from __future__ import annotations

import copy
import logging

import pytest
import torch
import torch._dynamo

import ostinato.dynamo as od

from examples.tiny_decoder import decode_inputs as tiny_decode_inputs
from helpers import assert_same
from models.test_convnet import SmallConvNet
from models.test_hf_decoders import CONFIGS, decode_inputs as hf_decode_inputs, make_wrapper
from models.test_tiny_decoder import cache_buffers, make_model as make_tiny_decoder
from models.test_whisper_encoder import features, make_encoder

STRICT = {"eager_fallback": False}   # a graph ostinato cannot take fails the test instead of running eagerly


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    od.reset_stats()
    yield
    torch._dynamo.reset()

pytestmark = pytest.mark.filterwarnings("ignore:While compiling, we found certain side effects")



def assert_on_ostinato(graphs: int = 1, calls: int | None = None) -> dict:
    s = od.stats()
    assert s["eager"] == 0 and s["eager_calls"] == 0, f"graphs ran eagerly: {s['fallbacks']}"
    assert s["graphs"] == graphs and s["compiled"] == graphs, s
    if calls is not None:
        assert s["calls"] == calls, s
    return s


def test_entry_point_resolves():
    assert "ostinato" in torch._dynamo.list_backends()
    assert torch._dynamo.lookup_backend("ostinato") is od.ostinato_backend


@pytest.mark.parametrize("replay", [False, True])
def test_tiny_decoder_decode_steps(replay):
    model = make_tiny_decoder(batch=2)
    ref = copy.deepcopy(model)
    compiled = torch.compile(model, backend="ostinato", options={**STRICT, "replay": replay})
    gen = torch.Generator().manual_seed(1)
    steps = 6
    outs = []
    with torch.no_grad():
        for s in range(steps):
            tokens, pos = tiny_decode_inputs(s, 2, 128, gen)
            outs.append(compiled(tokens, pos))
            assert_same(outs[-1], ref(tokens, pos), msg=f"step {s}")
    assert_on_ostinato(graphs=1, calls=steps)
    # The KV caches are written where the model keeps them, as eager writes them.
    for name, buf in cache_buffers(model).items():
        assert_same(buf, cache_buffers(ref)[name], msg=f"buffer {name}")
    assert cache_buffers(model)["layers.0.k_cache"][:, :, :steps].abs().sum() > 0
    assert not torch.equal(outs[0], outs[-1])
    (graph,) = od.compiled_graphs()
    assert graph.replay is replay
    # Parameters are program weights and the caches program state, whose tensors are the model's own:
    # the program's only inputs are the tokens and positions, nothing is copied in per call.
    state = graph.executable.session.state
    assert set(state) == {name.replace(".", "_") for name in cache_buffers(model)}
    for name, buf in cache_buffers(model).items():
        assert state[name.replace(".", "_")] is buf
    assert len(graph.program.inputs) == 2


@pytest.mark.parametrize("family", list(CONFIGS))
def test_hf_decoder_static_cache(family):
    wrapper = make_wrapper(family)
    ref = copy.deepcopy(wrapper)
    compiled = torch.compile(wrapper, backend="ostinato", options=STRICT)
    gen = torch.Generator().manual_seed(1)
    steps = 4
    with torch.no_grad():
        for s in range(steps):
            kwargs = hf_decode_inputs(s, gen)
            assert_same(compiled(**kwargs), ref(**kwargs), msg=f"{family} step {s}")
    assert_on_ostinato(graphs=1, calls=steps)
    ref_buffers = dict(ref.named_buffers())
    caches = [n for n, _ in wrapper.named_buffers() if n.startswith(("key_cache", "value_cache"))]
    assert caches
    for name, buf in wrapper.named_buffers():
        if name in caches:
            assert_same(buf, ref_buffers[name], msg=f"{family} cache {name}")
            assert buf[:, :, :steps].abs().sum() > 0, f"{name} was never written"


def test_whisper_encoder():
    encoder = make_encoder()
    compiled = torch.compile(encoder, backend="ostinato", options=STRICT)
    torch.manual_seed(1)
    with torch.no_grad():
        for call in range(2):
            x = features(2)
            out = compiled(x)
            assert_same(out.last_hidden_state, encoder(x).last_hidden_state, msg=f"call {call}")
    assert_on_ostinato(graphs=1, calls=2)


def test_convnet_dynamic_batch_one_export():
    """mark_dynamic on the batch: Dynamo makes it a symbol, ostinato a symbolic dim; three batch sizes
    run on the one program (no re-export, no per-size program)."""
    torch.manual_seed(0)
    model = SmallConvNet().eval()
    compiled = torch.compile(model, backend="ostinato", options=STRICT)
    with torch.no_grad():
        for b in (2, 5, 3):
            x = torch.randn(b, 3, 32, 32)
            torch._dynamo.mark_dynamic(x, 0)
            assert_same(compiled(x), model(x), msg=f"batch {b}")
    s = assert_on_ostinato(graphs=1, calls=3)
    assert s["exports"] == 1 and s["specializations"] == 0, s
    (graph,) = od.compiled_graphs()
    assert graph.program.graph.symbols, "the batch did not become a symbolic dim"


def test_dynamic_true_falls_back_to_batch_dims():
    """dynamic=True makes batch, height and width symbolic; torch.export cannot solve the conv net's
    pooled-then-upsampled heights, so the backend keeps the batch symbolic and fixes the rest."""
    torch.manual_seed(0)
    model = SmallConvNet().eval()
    compiled = torch.compile(model, backend="ostinato", dynamic=True, options=STRICT)
    with torch.no_grad():
        for b in (2, 4, 3):
            x = torch.randn(b, 3, 32, 32)
            assert_same(compiled(x), model(x), msg=f"batch {b}")
    s = assert_on_ostinato(graphs=1, calls=3)
    assert s["specializations"] == 0 and s["static_exports"] == 0, s


def test_tiny_decoder_dynamic_prefill_lengths():
    """A prefill whose token count Dynamo marks dynamic: one program serves prompts of 5 and 7 tokens."""
    model = make_tiny_decoder(batch=1)
    ref = copy.deepcopy(model)
    compiled = torch.compile(model, backend="ostinato", options=STRICT)
    torch.manual_seed(2)
    with torch.no_grad():
        for start, n in ((0, 5), (5, 7)):
            tokens, pos = torch.randint(0, 128, (1, n)), torch.arange(start, start + n)
            torch._dynamo.mark_dynamic(tokens, 1)
            torch._dynamo.mark_dynamic(pos, 0)
            assert_same(compiled(tokens, pos), ref(tokens, pos), msg=f"prefill of {n}")
    s = assert_on_ostinato(graphs=1, calls=2)
    assert s["exports"] == 1 and s["specializations"] == 0, s
    for name, buf in cache_buffers(model).items():
        assert_same(buf, cache_buffers(ref)[name], msg=f"buffer {name}")


class TwoHalves(torch.nn.Module):
    """A graph break between two halves, each writing its own buffer (a running sum of its input)."""

    def __init__(self, dim: int = 16):
        super().__init__()
        self.a, self.b = torch.nn.Linear(dim, dim), torch.nn.Linear(dim, dim)
        self.register_buffer("seen_a", torch.zeros(dim))
        self.register_buffer("seen_b", torch.zeros(dim))

    def forward(self, x):
        h = torch.tanh(self.a(x))
        self.seen_a.add_(h.sum(0))
        torch._dynamo.graph_break()
        y = self.b(h) + self.seen_a
        self.seen_b.add_(y.sum(0))
        return y * 2, self.seen_b.clone()


def test_graph_break_two_graphs():
    torch.manual_seed(0)
    model = TwoHalves().eval()
    ref = copy.deepcopy(model)
    compiled = torch.compile(model, backend="ostinato", options=STRICT)
    with torch.no_grad():
        for call in range(3):
            x = torch.randn(4, 16)
            assert_same(compiled(x), ref(x), msg=f"call {call}")
    assert_on_ostinato(graphs=2, calls=6)
    assert_same(model.seen_a, ref.seen_a, msg="buffer of the first graph")
    assert_same(model.seen_b, ref.seen_b, msg="buffer of the second graph")
    assert model.seen_b.abs().sum() > 0


def test_replaced_buffer_is_read_after_rebuild():
    """The graph holds the model's buffers; one replaced by another tensor makes it export again (Dynamo
    passes the new tensor without recompiling), and the new tensor is used and written."""
    torch.manual_seed(0)
    model = TwoHalves().eval()
    ref = copy.deepcopy(model)
    compiled = torch.compile(model, backend="ostinato", options=STRICT)
    x = torch.randn(4, 16)
    with torch.no_grad():
        assert_same(compiled(x), ref(x), msg="before")
        new = torch.randn(16)
        model.seen_a = new.clone()
        ref.seen_a = new.clone()
        for call in range(2):
            assert_same(compiled(x), ref(x), msg=f"after replacing, call {call}")
    s = assert_on_ostinato(graphs=2)
    assert s["rebuilds"] == 2, s   # both graphs hold seen_a (the first writes it, the second reads it)
    assert s["exports"] == 4, s
    assert_same(model.seen_a, ref.seen_a, msg="the replacement buffer")


class Scaled(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)
        self.scale = 0.5

    def forward(self, x):
        return self.lin(x) * self.scale + 1.0


def test_changed_float_is_read_after_rebuild():
    """With dynamic=True Dynamo passes a module's float (here ``scale``) as a 0-d tensor; the program
    bakes its value in, so the backend's callable exports again when it is given another value.
    (torch 2.13's Dynamo also guards the value and recompiles; the check is the backend's own.)"""
    torch.manual_seed(0)
    model = Scaled().eval()
    made = []

    def capturing_backend(gm, example_inputs):
        fn = od.ostinato_backend(gm, example_inputs, options=STRICT)
        made.append((fn, gm, [x.node.hint if isinstance(x, torch.SymInt) else x for x in example_inputs]))
        return fn

    with torch.no_grad():
        torch.compile(model, backend=capturing_backend, dynamic=True)(torch.randn(3, 8))
        ((fn, gm, args),), (graph,) = made, od.compiled_graphs()
        (pos,) = [p.index for p in graph.placeholders if p.role.value == "float"]
        assert_same(fn(*args), gm(*args), msg="example inputs")
        changed = list(args)
        changed[pos] = torch.tensor(2.0, dtype=torch.float64)
        expected = gm(*changed)
        assert not torch.allclose(expected[0], gm(*args)[0])
        assert_same(fn(*changed), expected, msg="another scale")
    assert od.stats()["rebuilds"] == 1


def test_export_failure_runs_eagerly(monkeypatch, caplog):
    """A graph ostinato cannot export runs eagerly, with a warning naming the reason; with
    eager_fallback=False the error reaches the caller."""
    import ostinato.dynamo.compiled_graph as compiled_graph
    from ostinato.errors import ExportError

    def refuse(*args, **kwargs):
        raise ExportError("no export for this test")
    monkeypatch.setattr(compiled_graph, "export", refuse)
    torch.manual_seed(0)
    model = SmallConvNet().eval()
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad(), caplog.at_level(logging.WARNING, logger="ostinato"):
        assert_same(torch.compile(model, backend="ostinato")(x), model(x))
    s = od.stats()
    assert s["eager"] == 1 and s["compiled"] == 0 and s["eager_calls"] == 1, s
    assert "no export for this test" in s["fallbacks"][0][1]
    assert any("runs eagerly" in r.getMessage() and "no export for this test" in r.getMessage()
               for r in caplog.records)
    torch._dynamo.reset()
    with torch.no_grad(), pytest.raises(Exception, match="no export for this test"):
        torch.compile(model, backend="ostinato", options=STRICT)(x)


def test_options_and_modes():
    assert od.settings_from(None, "reduce-overhead").replay is True
    assert od.settings_from({"replay": False, "cache": False}, None).cache is False
    with pytest.raises(Exception, match="unknown option.*replya"):
        od.settings_from({"replya": True}, None)
    with pytest.raises(Exception, match="max-autotune"):
        od.settings_from(None, "max-autotune")
    # Through torch.compile: Dynamo passes options to the backend, which refuses a bad key.
    model = torch.nn.Linear(4, 4)
    with torch.no_grad(), pytest.raises(Exception, match="replya"):
        torch.compile(model, backend="ostinato", options={"replya": True})(torch.randn(2, 4))


def test_custom_op_runs_through_the_fallback():
    """A torch.library custom op ostinato has no kernel for: the graph still runs on ostinato, the op
    as a fallback node through eager torch, and matches eager."""
    from frontend.fallback_ops import FALLBACK_OPS, model_and_input
    model, x = model_and_input(seed=3)
    compiled = torch.compile(model, backend="ostinato", options=STRICT)
    with torch.no_grad():
        for call in range(2):
            x = torch.randn_like(x)
            assert_same(compiled(x), model(x), msg=f"call {call}")
    assert_on_ostinato(graphs=1, calls=2)
    (graph,) = od.compiled_graphs()
    assert {n.op for n in graph.program.graph.nodes} >= FALLBACK_OPS


@pytest.mark.mlx
@pytest.mark.parametrize("replay", [False, True])
def test_device_option_mlx_decodes_like_eager(replay):
    """options={"device": "mlx"}: the graph runs on MLX; the KV caches the graph writes are the model's
    own buffers (written through), so eager code around the graph sees them."""
    import copy

    from examples.tiny_decoder import TinyDecoder, decode_inputs
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = TinyDecoder(dim=64, layers=2, heads=4, kv_heads=2, vocab=128, max_seq=32, batch=1).eval()
    ref = copy.deepcopy(model)
    compiled = torch.compile(model, backend="ostinato",
                             options={"device": "mlx", "replay": replay, "eager_fallback": False})
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for s in range(4):
            args = decode_inputs(s, 1, 128, gen)
            torch.testing.assert_close(compiled(*args), ref(*args), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(model.layers[0].k_cache, ref.layers[0].k_cache, rtol=1e-5, atol=1e-5)
    assert od.compiled_graphs()[-1].executable.backend.name == "mlx"
