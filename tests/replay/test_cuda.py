"""Replay on CUDA: the plan captured into a CUDA graph gives eager's results, in fp32 and bf16.

These run on the lent GPU (scripts/gpu_check.py); CI has no GPU and skips them, except the last test,
which checks the error a machine without CUDA gives.
"""
from __future__ import annotations

import copy

import pytest
import torch

import ostinato
from examples.tiny_decoder import TinyDecoder, decode_inputs
from helpers import assert_same, assert_replay_counts

TOL = {torch.float32: 1e-4, torch.float16: 5e-3, torch.bfloat16: 3e-2}


def _model(dtype, layers=6):
    torch.manual_seed(0)
    return TinyDecoder(dim=128, layers=layers).eval().to("cuda", dtype)


def _inputs(step, gen):
    return tuple(t.cuda() for t in decode_inputs(step, generator=gen))


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=["f32", "f16", "bf16"])
def test_decode_replay_equals_plain_and_eager(dtype):
    model = _model(dtype)
    eager = copy.deepcopy(model)
    prog = ostinato.export(copy.deepcopy(model), _inputs(0, torch.Generator().manual_seed(0)))
    plain = ostinato.compile(prog, device="cuda")
    replay = ostinato.compile(prog, device="cuda", replay=True)
    gen = torch.Generator().manual_seed(1)
    for step in range(8):
        args = _inputs(step, gen)
        with torch.no_grad():
            ref = eager(*args)
        assert_same(plain(*args), ref, TOL[dtype], msg=f"plain step {step}:")
        assert_same(replay(*args), ref, TOL[dtype], msg=f"replay step {step}:")
    stats = replay.stats()
    assert_replay_counts(stats, calls=8)
    for name, t in replay.session.state.items():
        assert_same(t, plain.session.state[name], TOL[dtype], msg=f"state {name}:")


@pytest.mark.cuda
def test_explicit_graph_on_cuda_updates_outputs_in_place():
    model = _model(torch.float32, layers=3)
    eager = copy.deepcopy(model)
    prog = ostinato.export(copy.deepcopy(model), _inputs(0, torch.Generator().manual_seed(0)))
    exe = ostinato.compile(prog, device="cuda")
    gen = torch.Generator().manual_seed(2)
    tokens, pos = _inputs(0, gen)
    g = ostinato.Graph()
    with ostinato.graph(g):
        out = exe(tokens, pos)
    with torch.no_grad():
        assert_same(out, eager(tokens, pos), 1e-4, msg="capture:")
    for step in range(1, 6):
        new_tokens, new_pos = _inputs(step, gen)
        tokens.copy_(new_tokens)
        pos.copy_(new_pos)
        again = g.replay()
        assert again is out
        with torch.no_grad():
            assert_same(out, eager(tokens, pos), 1e-4, msg=f"replay {step}:")


@pytest.mark.cuda
def test_sessions_on_cuda_keep_their_own_state():
    model = _model(torch.float32, layers=2)
    prog = ostinato.export(copy.deepcopy(model), _inputs(0, torch.Generator().manual_seed(0)))
    exe = ostinato.compile(prog, device="cuda", replay=True)
    a, b = exe.new_session(), exe.new_session()
    gen = torch.Generator().manual_seed(3)
    steps = [_inputs(s, gen) for s in range(4)]
    outs_a = [a(*x).clone() for x in steps]
    outs_b = [b(*x).clone() for x in steps[:2]]
    for i in range(2):
        assert_same(outs_b[i], outs_a[i], 1e-5)
    assert not torch.equal(a.state["layers.0.k_cache"], b.state["layers.0.k_cache"])


def test_cuda_backend_without_a_gpu_is_a_clear_error():
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    prog = ostinato.export(torch.nn.Linear(4, 4), (torch.randn(2, 4),))
    with pytest.raises(ostinato.errors.BackendError, match="torch sees no CUDA device"):
        ostinato.compile(prog, device="cuda")


@pytest.mark.cuda
@pytest.mark.parametrize("replay", [False, True], ids=["steps", "replay"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("family", ["llama", "qwen2", "gemma", "gpt2"])
def test_hf_decoders_on_cuda(family, dtype, replay):
    """The HF decoder tests of tests/models on CUDA: exported on the CPU, compiled for CUDA (Triton
    kernels for the fused ops), 8 decode steps against eager on CUDA, then the KV caches."""
    from replay_models import hf_decoders
    wrapper = hf_decoders.make_wrapper(family, dtype=dtype)
    ref = hf_decoders.make_wrapper(family, device="cuda", dtype=dtype)
    gen = torch.Generator().manual_seed(1)
    prog = ostinato.export(wrapper, (), hf_decoders.decode_inputs(0, gen), trace_strict=True)
    exe = ostinato.compile(prog, device="cuda", replay=replay)
    for s in range(hf_decoders.STEPS):
        kwargs = {k: v.cuda() for k, v in hf_decoders.decode_inputs(s, gen).items()}
        with torch.no_grad():
            expected = ref(**kwargs)
        assert_same(exe(**kwargs), expected, TOL[dtype], msg=f"{family} {dtype} step {s}")
    ref_buffers = dict(ref.named_buffers())
    for name, t in exe.session.state.items():
        if name in ref_buffers:
            assert_same(t, ref_buffers[name], TOL[dtype], msg=f"{family} state {name}")


@pytest.mark.cuda
@pytest.mark.parametrize("replay", [False, True], ids=["steps", "replay"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
def test_whisper_encoder_and_convnet_on_cuda(dtype, replay):
    """The Whisper encoder (dynamic batch) and the conv net of tests/models on CUDA against eager on CUDA."""
    from replay_models import convnet, whisper
    from torch.export import Dim
    encoder = whisper.make_encoder().to(dtype)
    prog = ostinato.export(encoder, (whisper.features(2).to(dtype),),
                           dynamic_shapes=({0: Dim("batch", min=1, max=8)},))
    exe = ostinato.compile(prog, device="cuda", replay=replay)
    ref = copy.deepcopy(encoder).cuda()
    for b in (2, 3, 1, 3):
        x = whisper.features(b).to(dtype).cuda()
        with torch.no_grad():
            expected = ref(x).last_hidden_state
        assert_same(exe(x).last_hidden_state, expected, TOL[dtype] * 3, msg=f"whisper {dtype} batch {b}")
    torch.manual_seed(0)
    net = convnet.SmallConvNet().eval().to(dtype)
    prog = ostinato.export(net, (torch.randn(2, 3, 32, 32).to(dtype),), dynamic_shapes=({0: Dim("batch", min=1, max=16)},))
    exe = ostinato.compile(prog, device="cuda", replay=replay)
    ref = copy.deepcopy(net).cuda()
    for b in (2, 5, 2):
        x = torch.randn(b, 3, 32, 32).to(dtype).cuda()
        with torch.no_grad():
            expected = ref(x)
        assert_same(exe(x), expected, TOL[dtype] * 3, msg=f"convnet {dtype} batch {b}")
