"""examples/tiny_decoder.TinyDecoder through ostinato: decode steps with a static KV cache as program
state, prefill with a dynamic token count, and independent sessions."""
from __future__ import annotations

import copy

import pytest
import torch
from torch.export import Dim

import ostinato
from examples.tiny_decoder import TinyDecoder, decode_inputs
from helpers import BACKENDS, assert_same, host

DIM, LAYERS, HEADS, KV_HEADS, VOCAB, MAX_SEQ = 64, 4, 4, 2, 128, 32
STEPS = 8


def make_model(batch: int) -> TinyDecoder:
    torch.manual_seed(0)
    model = TinyDecoder(dim=DIM, layers=LAYERS, heads=HEADS, kv_heads=KV_HEADS, vocab=VOCAB,
                        max_seq=MAX_SEQ, batch=batch).eval()
    with torch.no_grad():  # non-trivial norm weights (they start at ones)
        for name, p in model.named_parameters():
            if name.endswith("weight") and p.dim() == 1:
                p.uniform_(0.5, 1.5)
    return model


def cache_buffers(model: TinyDecoder) -> dict[str, torch.Tensor]:
    return {n: b for n, b in model.named_buffers() if n.endswith(("k_cache", "v_cache"))}


def assert_state_matches(state: dict[str, torch.Tensor], ref: TinyDecoder, msg: str = "") -> None:
    caches = cache_buffers(ref)
    assert set(caches) <= set(state), f"{msg} KV caches missing from program state: {sorted(set(caches) - set(state))}"
    for name, buf in caches.items():
        assert_same(host(state[name]), buf, msg=f"{msg} state {name}")


def step(run, ref, args, msg):
    with torch.no_grad():
        expected = ref(*args)
    assert_same(run(*args), expected, msg=msg)
    return expected


@pytest.mark.parametrize("device", BACKENDS)
@pytest.mark.parametrize("batch", [1, 2])
def test_decode_steps_with_state(batch, device):
    model = make_model(batch)
    ref = copy.deepcopy(model)
    gen = torch.Generator().manual_seed(1)
    prog = ostinato.export(model, decode_inputs(0, batch, VOCAB, gen))
    # Every layer's KV cache is mutated, so it must be program state, not a constant.
    assert set(cache_buffers(model)) <= set(prog.state_init)
    exe = ostinato.compile(prog, device=device)
    outs = []
    for s in range(STEPS):
        outs.append(step(exe, ref, decode_inputs(s, batch, VOCAB, gen), f"step {s}"))
    assert_state_matches(exe.session.state, ref, "after decode")
    # The cache really matters: a later step's logits depend on what earlier steps wrote.
    assert not torch.equal(outs[0], outs[-1])
    assert cache_buffers(ref)["layers.0.k_cache"][:, :, :STEPS].abs().sum() > 0


@pytest.mark.parametrize("device", BACKENDS)
def test_prefill_dynamic_then_decode(device):
    """One program with the token count symbolic: a prefill of 5 tokens, then single-token decode steps;
    a second session prefills 7 tokens with the same program."""
    model = make_model(1)
    ref = copy.deepcopy(model)
    torch.manual_seed(2)
    prompt = torch.randint(0, VOCAB, (1, 5))
    positions = torch.arange(5)
    t = Dim("T", min=1, max=MAX_SEQ)
    prog = ostinato.export(model, (prompt, positions), dynamic_shapes=({1: t}, {0: t}))
    assert prog.graph.symbols, "token count did not become a size symbol"
    exe = ostinato.compile(prog, device=device)

    step(exe, ref, (prompt, positions), "prefill 5")
    gen = torch.Generator().manual_seed(3)
    for s in range(5, 5 + STEPS):
        step(exe, ref, decode_inputs(s, 1, VOCAB, gen), f"decode step {s}")
    assert_state_matches(exe.session.state, ref, "after prefill+decode")

    # A second, independent session with a longer prompt.
    ref2 = make_model(1)
    session = exe.new_session()
    prompt2 = torch.randint(0, VOCAB, (1, 7))
    step(session, ref2, (prompt2, torch.arange(7)), "prefill 7")
    for s in range(7, 7 + 3):
        step(session, ref2, decode_inputs(s, 1, VOCAB, gen), f"session 2 decode step {s}")
    assert_state_matches(session.state, ref2, "session 2")
    assert_state_matches(exe.session.state, ref, "default session untouched by session 2")


def test_sessions_keep_independent_state():
    batch = 2
    model = make_model(batch)
    ref_a, ref_b = copy.deepcopy(model), copy.deepcopy(model)
    gen = torch.Generator().manual_seed(4)
    exe = ostinato.compile(ostinato.export(model, decode_inputs(0, batch, VOCAB, gen)), device="cpu")
    a, b = exe.new_session(), exe.new_session()
    initial = {n: t.clone() for n, t in exe.session.state.items()}

    inputs_a = [decode_inputs(s, batch, VOCAB, gen) for s in range(STEPS)]
    inputs_b = [decode_inputs(s, batch, VOCAB, gen) for s in range(STEPS)]
    # Interleave the two sessions step by step with different tokens.
    for s in range(STEPS):
        step(a, ref_a, inputs_a[s], f"session a step {s}")
        step(b, ref_b, inputs_b[s], f"session b step {s}")
    assert_state_matches(a.state, ref_a, "session a")
    assert_state_matches(b.state, ref_b, "session b")
    assert not torch.equal(a.state["layers.0.k_cache"], b.state["layers.0.k_cache"])
    # The executable's own session was never called: still the initial state.
    for name, t in exe.session.state.items():
        assert torch.equal(t, initial[name]), f"default session state {name} changed"
    # State tensors are not shared between sessions.
    for name in a.state:
        assert a.state[name].data_ptr() != b.state[name].data_ptr(), f"{name} shared between sessions"

    # Reset restores the initial state: replaying session a's inputs reproduces its outputs.
    a.reset()
    ref_fresh = make_model(batch)
    for s in range(3):
        step(a, ref_fresh, inputs_a[s], f"session a after reset, step {s}")
    assert_state_matches(b.state, ref_b, "session b untouched by a's reset")
