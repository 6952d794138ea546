"""The decode attention the code generator merges with its cache writes and rotary embedding
(codegen/attention.py): when it merges, what it leaves, and that the result equals eager over several
decode steps (the op's torch reference here; its kernel in Triton's interpreter in test_triton_fused)."""
from __future__ import annotations

import copy
import importlib.util
import os
import sys

import pytest
import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fusion_backend import ReferenceFusionBackend, fused_executable  # noqa: E402
from helpers import assert_same  # noqa: E402

import ostinato  # noqa: E402
from ostinato.codegen.report import launch_table  # noqa: E402

S, HQ, HKV, D, W = 12, 4, 2, 8, 3


def rotate_half(x):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


class Attention(nn.Module):
    """One decode step of grouped-query attention over static caches, in one of several styles:

    - ``rope``: HF's rotate_half on q and k, ``index_copy_`` writes, a position mask;
    - ``slice``: ``cache[:, :, pos] = k`` writes, no rope, no mask;
    - ``k_read``: rope, and the rotated key is also returned (the rope must stay);
    - ``q_only``: only q is rotated (the rope stays; the writes and attention still merge);
    - ``between``: a third buffer written in place between the cache writes and the attention (a state
      write the merge does not move across);
    - ``window``: a sliding-window mask of the last W positions, as Mistral's (boolean: the sdpa pass
      makes it additive, and the merged kernel reads it);
    - ``padding``: an additive float mask given as an input (hidden keys at -inf, the rest biased);
    - ``bshd``: sequence-major [B, S, H, D] caches written by ``index_copy_`` on dim 1, rope in that
      layout (as Meta's Llama reference), the attention reading the caches through a transpose;
    - ``bshd_slice``: sequence-major caches written by ``cache[:, pos] = k``, no rope, no mask;
    - ``bshd_read``: as ``bshd``, and the transposed key cache is also returned (the transpose is read
      by more than the attention: nothing merges).
    """

    def __init__(self, style: str):
        super().__init__()
        self.style = style
        self.q = nn.Linear(HQ * D, HQ * D, bias=False)
        self.kv = nn.Linear(HQ * D, 2 * HKV * D, bias=False)
        shape = (1, S, HKV, D) if style.startswith("bshd") else (1, HKV, S, D)
        self.register_buffer("k_cache", torch.zeros(shape))
        self.register_buffer("v_cache", torch.zeros(shape))
        self.register_buffer("seen", torch.zeros(S))
        self.register_buffer("inv_freq", 1.0 / (10000 ** (torch.arange(0, D, 2).float() / D)))

    def forward(self, x, pos, pad=None):
        if self.style.startswith("bshd"):
            return self.sequence_major(x, pos)
        q = self.q(x).view(1, 1, HQ, D).transpose(1, 2)
        k, v = self.kv(x).view(1, 1, 2 * HKV, D).transpose(1, 2).chunk(2, dim=1)
        extra = None
        if self.style != "slice":
            freqs = pos[:, None].float() * self.inv_freq
            emb = torch.cat((freqs, freqs), dim=-1)
            cos, sin = emb.cos()[None, None], emb.sin()[None, None]
            q = q * cos + rotate_half(q) * sin
            if self.style != "q_only":
                k = k * cos + rotate_half(k) * sin
            if self.style == "k_read":
                extra = k.sum()
        if self.style == "slice":
            self.k_cache[:, :, pos] = k
            self.v_cache[:, :, pos] = v
        else:
            self.k_cache.index_copy_(2, pos, k)
            self.v_cache.index_copy_(2, pos, v)
        if self.style == "between":
            self.seen.index_copy_(0, pos, x.sum().view(1))
        mask = None if self.style == "slice" else (torch.arange(S) <= pos.view(-1, 1)).view(1, 1, 1, S)
        if self.style == "window":
            mask = mask & (torch.arange(S) > pos.view(-1, 1) - W).view(1, 1, 1, S)
        if self.style == "padding":
            mask = pad.masked_fill(~mask, float("-inf"))
        a = F.scaled_dot_product_attention(q, self.k_cache, self.v_cache, attn_mask=mask, enable_gqa=True)
        out = a.transpose(1, 2).reshape(1, 1, HQ * D)
        return out if extra is None else (out, extra)


    def sequence_major(self, x, pos):
        q = self.q(x).view(1, 1, HQ, D)
        k, v = self.kv(x).view(1, 1, 2 * HKV, D).chunk(2, dim=2)
        if self.style != "bshd_slice":
            freqs = pos[:, None].float() * self.inv_freq
            emb = torch.cat((freqs, freqs), dim=-1)
            cos, sin = emb.cos()[None, :, None], emb.sin()[None, :, None]     # [1, 1, 1, D]
            q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
            self.k_cache.index_copy_(1, pos, k)
            self.v_cache.index_copy_(1, pos, v)
        else:
            self.k_cache[:, pos] = k
            self.v_cache[:, pos] = v
        keys = self.k_cache.transpose(1, 2)
        mask = None if self.style == "bshd_slice" else (torch.arange(S) <= pos.view(-1, 1)).view(1, 1, 1, S)
        a = F.scaled_dot_product_attention(q.transpose(1, 2), keys, self.v_cache.transpose(1, 2), attn_mask=mask,
                                           enable_gqa=True)
        out = a.transpose(1, 2).reshape(1, 1, HQ * D)
        return (out, keys.sum()) if self.style == "bshd_read" else out


def decode(model, steps: int):
    """The model exported, then ``steps`` decode steps through fusion's lowering against eager (outputs
    and the caches); returns the program and the executable."""
    torch.manual_seed(0)
    ref = copy.deepcopy(model)
    x0 = torch.randn(1, 1, HQ * D)

    def pad():      # [1, 1, 1, S] additive: two random keys hidden, the rest biased
        bias = torch.randn(1, 1, 1, S)
        bias[..., torch.randperm(S)[:2]] = float("-inf")
        return (bias,) if model.style == "padding" else ()
    prog = ostinato.export(model, (x0, torch.tensor([0]), *pad()))
    exe = fused_executable(prog, ReferenceFusionBackend())
    for step in range(steps):
        args = (torch.randn(1, 1, HQ * D), torch.tensor([step]), *pad())
        with torch.no_grad():
            expected = ref(*args)
        assert_same(exe(*args), expected, msg=f"step {step}:")
    for name in ("k_cache", "v_cache"):
        assert_same(exe.session.state[name], getattr(ref, name), msg=f"{name}:")
        written = getattr(ref, name)[:, :steps] if model.style.startswith("bshd") else getattr(ref, name)[:, :, :steps]
        assert written.abs().sum() > 0
    return prog, exe


@pytest.mark.parametrize("style, merged, ropes_left", [("rope", True, 0), ("slice", True, 0), ("k_read", True, 2),
                                                       ("q_only", True, 1), ("between", False, 2),
                                                       ("window", True, 0), ("padding", True, 0),
                                                       ("bshd", True, 0), ("bshd_slice", True, 0),
                                                       ("bshd_read", False, 2)])
def test_decode_attention_merges_what_it_may(style, merged, ropes_left):
    prog, exe = decode(Attention(style), 5)
    kinds = [r["kind"] for r in launch_table(prog.graph, "cuda")]
    ops = [l.op for l in exe.launches]
    assert kinds.count("ost.decode_attention_") == ops.count("ost.decode_attention_") == int(merged), kinds
    assert kinds.count("ost.rope") == ropes_left, kinds
    if merged:
        assert "ost.kv_update_" not in kinds and "ost.sdpa" not in kinds, kinds
    else:
        writes = 2 if style.startswith("bshd") else 3
        assert kinds.count("ost.kv_update_") == writes and kinds.count("ost.sdpa") == 1, kinds


def test_sequence_major_caches_merge_in_their_layout(monkeypatch):
    """The merged node takes the [B, S, H, D] caches written on dim 1 and q, k, v in that layout (the
    ropes' inputs), not the transposes the attention read."""
    seen, kernel = [], ReferenceFusionBackend.kernel

    def spy(self, op):
        fn = kernel(self, op)
        if op != "ost.decode_attention_":
            return fn

        def run(*args, **kwargs):
            seen.append((args[0].shape, args[2].shape, args[3].shape, args[6], args[8] is not None, args[13]))
            return fn(*args, **kwargs)
        return run
    monkeypatch.setattr(ReferenceFusionBackend, "kernel", spy)
    decode(Attention("bshd"), 3)
    assert seen and set(seen) == {((1, S, HKV, D), (1, 1, HQ, D), (1, 1, HKV, D), 1, True, HQ // HKV)}, seen


def test_merged_node_takes_the_ropes_inputs():
    prog, exe = decode(Attention("rope"), 2)
    (launch,) = [l for l in exe.launches if l.op == "ost.decode_attention_"]
    node = next(n for n in prog.graph.nodes if n.op == "ost.sdpa")
    assert launch.name == node.name
    # args: caches, q, k, v, index, dim, ring, cos, sin, interleaved, q_pos, scale, n_rep, mask
    assert launch.args[6:8] == (2, None) and launch.args[10] is False and launch.args[13] == 2
    assert launch.args[8] is not None and launch.args[9] is not None     # cos and sin
    assert launch.args[14] is None      # the position mask is q_pos, not a mask


def test_merged_node_reads_the_window_mask():
    prog, exe = decode(Attention("window"), 7)      # past W: the window hides the first keys
    (launch,) = [l for l in exe.launches if l.op == "ost.decode_attention_"]
    assert launch.args[14] is not None


def test_attention_switch(monkeypatch):
    monkeypatch.setenv("OSTINATO_FUSE_ATTENTION", "0")
    prog, _ = decode(Attention("rope"), 2)
    kinds = [r["kind"] for r in launch_table(prog.graph, "cuda")]
    assert "ost.decode_attention_" not in kinds and kinds.count("ost.kv_update_") == 2


def _user_models():
    path = os.path.join(os.path.dirname(__file__), "..", "..", "bench", "suite", "user_models.py")
    spec = importlib.util.spec_from_file_location("user_models_for_tests", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _per_layer(rows, layers: int) -> float:
    """Launches per layer: the step's launches less those outside the layers (embedding, final norm,
    head and the position/mask bookkeeping before the first layer's norm)."""
    first = next(i for i, r in enumerate(rows) if r["kind"] == "fused" and any("norm" in o for o in r["ops"]))
    last = max(i for i, r in enumerate(rows) if r["kind"] == "ost.decode_attention_")
    # the last layer's MLP: the two launches after its attention's output projection
    return (last + 4 - first) / layers


@pytest.mark.parametrize("style", ["rms", "ln"])
def test_user_decoders_take_five_launches_per_layer(style):
    """The decoders of bench/suite/user_models.py (fused QKV split in three, a plain RMSNorm or
    LayerNorm, index_copy_ or a ring buffer's slice assignment, a position mask): each layer's decode
    step is 5 launches (norm+QKV, attention, output projection, norm+MLP up, MLP down)."""
    um = _user_models()
    torch.manual_seed(0)
    model = um.UserDecoder(64, 3, style, cache_len=16).eval()
    ref = copy.deepcopy(model)
    prog = ostinato.export(model, (torch.tensor([[1]]), torch.tensor([0])))
    exe = fused_executable(prog, ReferenceFusionBackend())
    for step in (0, 1, 2, 9) + ((17, 18) if style == "ln" else ()):     # past 16: the ring buffer wraps
        ids, pos = torch.randint(0, 1024, (1, 1)), torch.tensor([step])
        with torch.no_grad():
            expected = ref(ids, pos)
        assert_same(exe(ids, pos), expected, tol=1e-4, msg=f"step {step}:")
    rows = launch_table(prog.graph, "cuda")
    kinds = [r["kind"] for r in rows]
    assert kinds.count("ost.decode_attention_") == 3, kinds
    assert _per_layer(rows, 3) == 5, kinds


@pytest.mark.parametrize("family", ["llama", "qwen2", "gemma", "mistral", "phi3", "gemma2", "gpt2", "qwen3", "gemma3",
                                    "gpt_neox", "phi", "olmo2", "falcon", "gptj"])
def test_hf_decoders_take_five_launches_per_layer(family):
    from models.test_hf_decoders import decode_inputs, make_wrapper
    wrapper = make_wrapper(family)
    prog = ostinato.export(wrapper, (), decode_inputs(0, torch.Generator().manual_seed(1)), trace_strict=True)
    layers = sum(1 for n in prog.graph.nodes if n.op == "ost.sdpa")
    rows = launch_table(prog.graph, "cuda")
    kinds = [r["kind"] for r in rows]
    assert kinds.count("ost.decode_attention_") == layers, kinds
    assert "ost.rope" not in kinds and "ost.kv_update_" not in kinds, kinds
    between = {"phi": 4, "olmo2": 5, "falcon": 4, "gptj": 5}
    if family in between:  # launches from one layer's attention to the next's: Phi's attention and MLP side by
        # side over one LayerNorm, 4 (Falcon's too; GPT-J's MLP activation is a prologue of the down
        # projection rather than an epilogue of the up one, 5); OLMo 2 normalizes after them (no norm before the first layer), 5
        at = [i for i, kind in enumerate(kinds) if kind == "ost.decode_attention_"]
        assert [b - a for a, b in zip(at, at[1:])] == [between[family]] * (layers - 1), kinds
    else:
        assert _per_layer(rows, layers) == 5, kinds


@pytest.mark.parametrize("batch", [1, 32])
def test_batched_decode_takes_five_launches_per_layer(batch, monkeypatch):
    """Issue #15: a batch-32 bf16 decode step of a Llama is 5 launches per layer as a batch-1 step is
    (norm + q/k/v, attention, o projection, norm + gate/up + SwiGLU, down projection): past 16 rows the
    matmul groups take the tl.dot kernel (OSTINATO_DOT_ROWS=64). By default (the kernel is off: slower
    than cuBLAS on an H100) the projections stay cuBLAS calls and the norms and the SwiGLU launch on
    their own: 8."""
    from fusion_backend import batched_llama
    monkeypatch.setenv("OSTINATO_DOT_ROWS", "64")
    wrapper, steps = batched_llama(batch, torch.bfloat16)
    prog = ostinato.export(wrapper, (), steps[0], trace_strict=True)
    rows = launch_table(prog.graph, "cuda")
    kinds = [r["kind"] for r in rows]
    assert kinds.count("ost.decode_attention_") == 3, kinds
    assert not {"aten.linear", "ost.multi_linear", "ost.rms_norm", "ost.add_rms_norm", "ost.swiglu"} & set(kinds), kinds
    assert _per_layer(rows, 3) == 5, kinds
    monkeypatch.delenv("OSTINATO_DOT_ROWS")
    kinds = [r["kind"] for r in launch_table(prog.graph, "cuda")]
    attention = [i for i, k in enumerate(kinds) if k == "ost.decode_attention_"]
    assert attention[1] - attention[0] == (5 if batch == 1 else 8), kinds


class _PartialRope(nn.Module):
    """One decode step whose q and k are roped over their first 4 dims: ``cat([rope(x[..., :4]), x[..., 4:end]])``
    (``end`` None: the whole rest of the row, GPT-NeoX's form; 6: a narrower head, not a partial rope)."""

    def __init__(self, end):
        super().__init__()
        self.end = end
        self.q = nn.Linear(HQ * D, HQ * D, bias=False)
        self.kv = nn.Linear(HQ * D, 2 * HKV * D, bias=False)
        width = D if end is None else end
        self.register_buffer("k_cache", torch.zeros(1, HKV, S, width))
        self.register_buffer("v_cache", torch.zeros(1, HKV, S, width))

    def forward(self, x, pos):
        q = self.q(x).view(1, 1, HQ, D).transpose(1, 2)
        k, v = self.kv(x).view(1, 1, 2 * HKV, D).transpose(1, 2).chunk(2, dim=1)
        freqs = pos[:, None].float() * torch.tensor([1.0, 0.1])
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos()[None, None], emb.sin()[None, None]
        q, k = (torch.cat((t[..., :4] * cos + rotate_half(t[..., :4]) * sin, t[..., 4:self.end]), -1) for t in (q, k))
        v = v[..., :self.end]
        self.k_cache.index_copy_(2, pos, k)
        self.v_cache.index_copy_(2, pos, v)
        mask = (torch.arange(S) <= pos.view(-1, 1)).view(1, 1, 1, S)
        return F.scaled_dot_product_attention(q, self.k_cache, self.v_cache, attn_mask=mask, enable_gqa=True)


@pytest.mark.parametrize("end, merged_ropes", [(None, True), (6, False)])
def test_partial_rotary_merges_only_over_the_whole_row(end, merged_ropes):
    """GPT-NeoX's partial rope joins the attention; a cat whose second piece stops short of the row's end is
    a narrower head, not a partial rope: its ropes stay launches (the attention still merges), and both
    equal eager over several steps."""
    torch.manual_seed(0)
    model = _PartialRope(end).eval()
    ref = copy.deepcopy(model)
    prog = ostinato.export(model, (torch.randn(1, 1, HQ * D), torch.tensor([0])))
    exe = fused_executable(prog, ReferenceFusionBackend())
    for step in range(4):
        args = (torch.randn(1, 1, HQ * D), torch.tensor([step]))
        with torch.no_grad():
            expected = ref(*args)
        assert_same(exe(*args), expected, msg=f"step {step}:")
    kinds = [r["kind"] for r in launch_table(prog.graph, "cuda")]
    assert kinds.count("ost.decode_attention_") == 1, kinds
    assert ("ost.rope" not in kinds) == merged_ropes, kinds


class _WholeNorm(nn.Module):
    """One decode step whose q and k projections are RMS-normed whole, every head at once, before the view
    into heads (OLMo 2's): in OLMo 2's form (``(w * h).to(dtype)`` over rows cast to fp32, then a rope in
    fp32 cast back) or, ``plain``, ``x * rsqrt(mean(x^2) + eps) * w`` in the rows' dtype. ``read``: the
    normed q is also returned (the norms must stay); ``sibling``: ``2 * q`` before its norm too (in bf16 a
    node of the q norm's group, which the attention cannot take whole: the group stays)."""

    def __init__(self, plain: bool = False, read: str = "", dtype=torch.float32):
        super().__init__()
        self.plain, self.read = plain, read
        self.qkv = nn.Linear(HQ * D, (HQ + 2 * HKV) * D, bias=False)
        self.q_norm, self.k_norm = nn.Parameter(torch.rand(HQ * D) + 0.5), nn.Parameter(torch.rand(HKV * D) + 0.5)
        self.register_buffer("k_cache", torch.zeros(1, HKV, S, D))
        self.register_buffer("v_cache", torch.zeros(1, HKV, S, D))
        self.register_buffer("inv_freq", 1.0 / (10000 ** (torch.arange(0, D, 2).float() / D)))
        self.to(dtype)

    def norm(self, x, w):
        if self.plain:
            return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w
        h = x.to(torch.float32)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)
        return (w * h).to(x.dtype)

    def forward(self, x, pos):
        q, k, v = self.qkv(x).split([HQ * D, HKV * D, HKV * D], dim=-1)
        extra = q * 2
        q, k = self.norm(q, self.q_norm), self.norm(k, self.k_norm)
        extra = q if self.read == "normed" else extra
        q, k, v = (t.view(1, 1, -1, D).transpose(1, 2) for t in (q, k, v))
        freqs = pos[:, None].float() * self.inv_freq.float()
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos()[None, None], emb.sin()[None, None]
        q, k = ((t * cos + rotate_half(t) * sin).to(t.dtype) for t in (q, k))
        self.k_cache.index_copy_(2, pos, k)
        self.v_cache.index_copy_(2, pos, v)
        mask = (torch.arange(S) <= pos.view(-1, 1)).view(1, 1, 1, S)
        a = F.scaled_dot_product_attention(q, self.k_cache, self.v_cache, attn_mask=mask, enable_gqa=True)
        out = a.transpose(1, 2).reshape(1, 1, HQ * D)
        return (out, extra) if self.read else out


@pytest.mark.parametrize("plain, read, dtype", [(False, "", torch.float32), (True, "", torch.float32),
                                                (False, "", torch.bfloat16), (False, "normed", torch.bfloat16),
                                                (True, "normed", torch.float32), (False, "sibling", torch.bfloat16)])
def test_norms_of_the_whole_projections_join_the_attention(plain, read, dtype, monkeypatch):
    """OLMo 2's RMSNorm of the whole q and k projections (before the view into heads) joins the decode
    attention with the rope, the casts around it (a generated group of its own in bf16: taken whole) and
    the transposes: one launch from the projection to the output projection; equal to eager over several
    steps. A normed q read elsewhere keeps both norms, and so does a q norm's group holding another node
    (the attention still merges)."""
    seen, kernel = [], ReferenceFusionBackend.kernel

    def spy(self, op):
        fn = kernel(self, op)
        if op != "ost.decode_attention_":
            return fn

        def run(*args, **kwargs):     # q, k rows and the norms' weights
            padded = args + (None,) * 18
            seen.append(tuple(None if a is None else tuple(a.shape) for a in (*args[2:4], *padded[16:18])))
            return fn(*args, **kwargs)
        return run
    monkeypatch.setattr(ReferenceFusionBackend, "kernel", spy)
    torch.manual_seed(0)
    model = _WholeNorm(plain, read, dtype).eval()
    ref = copy.deepcopy(model)
    prog = ostinato.export(model, (torch.randn(1, 1, HQ * D, dtype=dtype), torch.tensor([0])))
    exe = fused_executable(prog, ReferenceFusionBackend())
    for step in range(4):
        args = (torch.randn(1, 1, HQ * D, dtype=dtype), torch.tensor([step]))
        with torch.no_grad():
            expected = ref(*args)
        assert_same(exe(*args), expected, msg=f"step {step}:")
    assert_same(exe.session.state["k_cache"], ref.k_cache)
    rows = launch_table(prog.graph, "cuda")
    kinds = [r["kind"] for r in rows]
    assert kinds.count("ost.decode_attention_") == 1, kinds
    at = kinds.index("ost.decode_attention_")
    norms = [r for r in rows[:at] if "ost.rms_norm" in r["ops"]]
    assert len(norms) == (2 if read else 0), rows
    # q and k as the projection's [1, 1, H * D] rows, the norms' weights as wide; else roped [1, H, 1, D] rows
    want = ((1, 1, HQ * D), (1, 1, HKV * D), (HQ * D,), (HKV * D,)) if not read else \
        ((1, HQ, 1, D), (1, HKV, 1, D), None, None)
    assert seen and set(seen) == {want}, seen
