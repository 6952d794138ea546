"""Replay equals step-by-step execution and eager PyTorch on whole models, over several calls with fresh
random inputs: the tiny decoder and two Hugging Face decoders (KV caches as session state, compared
too), the Whisper encoder and the conv net (dynamic batch), and static models through the explicit
``ostinato.Graph`` API."""
from __future__ import annotations

import pytest
import torch
from torch.utils import _pytree as pytree

import ostinato
from helpers import BACKENDS, host, assert_same
from replay.replay_models import (TINY_BATCH, conv_net, decode_inputs, eager, fresh, hf_decoder, hf_decoders,
                                  snapshot, tiny, tiny_decoder, whisper, whisper_encoder)

STEPS = 6

# transformers' output capturing is a global dynamo reports as a side effect; harmless here.
pytestmark = pytest.mark.filterwarnings("ignore:While compiling, we found certain side effects")


def assert_states_equal(a: dict, b: dict, msg: str) -> None:
    assert set(a) == set(b), f"{msg}: state names differ"
    for name in a:
        assert_same(host(a[name]), host(b[name]), msg=f"{msg} state {name}")


@pytest.mark.parametrize("device", BACKENDS)
def test_tiny_decoder_replay_matches_step_and_eager(device):
    model, prog = tiny_decoder()
    ref = fresh(model)
    step = ostinato.compile(prog, device=device)
    rep = ostinato.compile(prog, device=device, replay=True)
    gen = torch.Generator().manual_seed(11)
    logits = []
    for s in range(STEPS):
        args = decode_inputs(s, TINY_BATCH, tiny.VOCAB, gen)
        expected = eager(ref, *args)
        out_step, out_rep = step(*args), rep(*args)
        assert_same(out_step, expected, msg=f"step-by-step, decode step {s}:")
        assert_same(out_rep, expected, msg=f"replay, decode step {s}:")
        # The KV caches evolve identically after every step, not only at the end.
        assert_states_equal(rep.session.state, step.session.state, f"decode step {s}")
        logits.append(expected)
    tiny.assert_state_matches(rep.session.state, ref, "replay")
    tiny.assert_state_matches(step.session.state, ref, "step-by-step")
    assert tiny.cache_buffers(ref)["layers.0.k_cache"][:, :, :STEPS].abs().sum() > 0
    assert not torch.equal(logits[0], logits[-1])
    stats = rep.stats()
    assert (stats["captures"], stats["replays"], stats["plan_misses"]) == (1, STEPS - 1, 1)


@pytest.mark.parametrize("family", ["llama", "qwen2", "gemma", "gpt2"])
@pytest.mark.parametrize("device", BACKENDS)
def test_hf_decoder_replay_matches_step_and_eager(family, device):
    wrapper, prog = hf_decoder(family)
    ref = fresh(wrapper)
    step = ostinato.compile(prog, device=device)
    rep = ostinato.compile(prog, device=device, replay=True)
    gen = torch.Generator().manual_seed(5)
    for s in range(STEPS):
        kwargs = hf_decoders.decode_inputs(s, gen)
        expected = eager(ref, **kwargs)
        assert_same(step(**kwargs), expected, msg=f"{family} step-by-step, step {s}:")
        assert_same(rep(**kwargs), expected, msg=f"{family} replay, step {s}:")
        assert_states_equal(rep.session.state, step.session.state, f"{family} step {s}")
    ref_buffers = dict(ref.named_buffers())
    caches = [n for n in ref_buffers if n.startswith(("key_cache", "value_cache"))]
    assert caches and set(caches) <= set(rep.session.state)
    for name in caches:
        assert_same(host(rep.session.state[name]), ref_buffers[name], msg=f"{family} replay state {name}")
        assert ref_buffers[name][:, :, :STEPS].abs().sum() > 0, f"{name} was never written"
    assert rep.stats()["captures"] == 1 and rep.stats()["replays"] == STEPS - 1


@pytest.mark.parametrize("device", BACKENDS)
def test_whisper_encoder_replay_per_batch_size(device):
    encoder, prog = whisper_encoder()
    step = ostinato.compile(prog, device=device)
    rep = ostinato.compile(prog, device=device, replay=True)
    torch.manual_seed(3)
    for b in (2, 2, 3, 3, 2):
        x = whisper.features(b)
        expected = eager(encoder, x).last_hidden_state
        assert_same(step(x).last_hidden_state, expected, msg=f"step-by-step, batch {b}:")
        out = rep(x).last_hidden_state
        assert_same(out, expected, msg=f"replay, batch {b}:")
        assert out.shape == (b, whisper.SOURCE_POSITIONS, 64)
    stats = rep.stats()
    assert (stats["captures"], stats["replays"]) == (2, 3)


@pytest.mark.parametrize("buckets", [None, {"batch": "pow2"}], ids=["exact", "pow2"])
@pytest.mark.parametrize("device", BACKENDS)
def test_conv_net_replay(buckets, device):
    net, prog = conv_net(dynamic=True)
    step = ostinato.compile(prog, device=device)
    rep = ostinato.compile(prog, device=device, replay=True, buckets=buckets)
    torch.manual_seed(4)
    for b in (2, 3, 4, 3, 2):
        x = torch.randn(b, 3, 32, 32)
        expected = eager(net, x)
        assert_same(step(x), expected, msg=f"step-by-step, batch {b}:")
        out = rep(x)
        assert_same(out, expected, msg=f"replay, batch {b}:")
        assert out[0].shape == (b, 10) and out[1].shape == (b, 16, 16, 16)
    # Exact: one capture per size (2, 3, 4). pow2: 3 pads to 4, so sizes 2 and 4 only.
    assert rep.stats()["captures"] == (3 if buckets is None else 2)


@pytest.mark.parametrize("device", BACKENDS)
def test_static_conv_net_through_graph_api(device):
    """Capture once; then update the static input in place and replay: out is updated in place and
    stays the very same objects."""
    net, prog = conv_net(dynamic=False)
    exe = ostinato.compile(prog, device=device)
    torch.manual_seed(6)
    x = torch.randn(2, 3, 32, 32)
    g = ostinato.Graph()
    with ostinato.graph(g):
        out = exe(x)
    assert_same(out, eager(net, x), msg="the capture call:")
    leaves = pytree.tree_leaves(out)
    previous = snapshot(out)
    for i in range(4):
        new = torch.randn(2, 3, 32, 32)
        x.copy_(new)
        result = g.replay()
        assert result is out
        assert all(a is b for a, b in zip(pytree.tree_leaves(result), leaves))
        assert_same(out, eager(net, new), msg=f"replay {i}:")
        assert not torch.equal(out[0], previous[0]), "replay left the outputs unchanged"
        previous = snapshot(out)
    assert g.replays == 4


@pytest.mark.parametrize("device", BACKENDS)
def test_tiny_decoder_through_graph_api(device):
    """The explicit API on a stateful model: the capture is the first decode step; replays (new inputs
    copied in by ``replay(*args)`` or by hand) advance the session's KV caches as eager does."""
    model, prog = tiny_decoder()
    ref = fresh(model)
    exe = ostinato.compile(prog, device=device)
    gen = torch.Generator().manual_seed(8)
    tokens, pos = decode_inputs(0, TINY_BATCH, tiny.VOCAB, gen)
    g = ostinato.Graph()
    with ostinato.graph(g):
        out = exe(tokens, pos)
    assert_same(out, eager(ref, tokens, pos), msg="capture (step 0):")
    for s in range(1, STEPS):
        args = decode_inputs(s, TINY_BATCH, tiny.VOCAB, gen)
        if s % 2:
            result = g.replay(*args)
        else:
            tokens.copy_(args[0])
            pos.copy_(args[1])
            result = g.replay()
        assert result is out
        assert_same(out, eager(ref, *args), msg=f"replay, decode step {s}:")
        assert torch.equal(tokens, args[0]) and torch.equal(pos, args[1])
    tiny.assert_state_matches(exe.session.state, ref, "after Graph replays")


@pytest.mark.parametrize("device", BACKENDS)
def test_replay_outputs_are_the_captured_buffers(device):
    """compile(replay=True): calls of one signature return the same output tensor, rewritten per call
    (documented: valid until the session's next call)."""
    net, prog = conv_net(dynamic=False)
    rep = ostinato.compile(prog, device=device, replay=True)
    torch.manual_seed(9)
    x1, x2 = torch.randn(2, 3, 32, 32), torch.randn(2, 3, 32, 32)
    out1 = rep(x1)
    first = snapshot(out1)
    out2 = rep(x2)
    assert out2[0] is out1[0] and out2[1] is out1[1]
    assert_same(out2, eager(net, x2))
    assert_same(first, eager(net, x1))
