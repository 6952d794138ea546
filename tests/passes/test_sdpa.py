import copy

import pytest
import torch
import torch.nn.functional as F
from torch.export import Dim

import ostinato
from examples.tiny_decoder import TinyDecoder, decode_inputs
from helpers import LastHidden, assert_decode_matches, assert_same, export_and_compare
from models.test_hf_decoders import MAX_CACHE, decode_inputs as hf_decode_inputs, make_wrapper

pytestmark = pytest.mark.filterwarnings("ignore:While compiling, we found certain side effects")

# What the pattern absorbs or makes unread: none of it may be left after the pipeline.
GONE = {"aten.scaled_dot_product_attention", "aten.repeat_interleave.self_int", "aten.clone", "aten.expand",
        "aten.le.Tensor", "aten.ge.Tensor"}


def sdpa_nodes(prog):
    return [n for n in prog.graph.nodes if n.op == "ost.sdpa"]


def mask_aranges(prog, length):
    return [n for n in prog.graph.nodes if n.op.startswith("aten.arange")
            and [str(d) for d in n.outputs[0].meta.shape] == [str(length)]]


def test_tiny_decoder_has_one_sdpa_per_layer(tmp_path):
    torch.manual_seed(0)
    model = TinyDecoder(dim=32, layers=4, heads=4, kv_heads=2, vocab=64, max_seq=16).eval()
    ref = copy.deepcopy(model)
    prog = ostinato.export(model, decode_inputs(0, vocab=64))
    ops = prog.op_counts()
    assert ops["ost.sdpa"] == 4 and not GONE & set(ops) and not mask_aranges(prog, 16)
    for n in sdpa_nodes(prog):
        q, k, v, mask, q_pos, scale, n_rep, is_causal = n.args
        assert k.role == v.role == "temp" and str(k.meta) == "f32[1,2,16,8]"  # the cache, not its copy
        assert (mask, scale, n_rep, is_causal) == (None, None, 2, False)
        assert str(q_pos.meta) == "i64[1,1]"
    prog.save(tmp_path / "fused.ost")
    assert_decode_matches(ostinato.compile(ostinato.load(tmp_path / "fused.ost")), ref, 8)


@pytest.mark.parametrize("family, n_rep", [("llama", 2), ("qwen2", 2), ("gemma", 2), ("gpt2", 1)])
def test_hf_decode_has_one_sdpa_per_layer(family, n_rep):
    wrapper = make_wrapper(family)
    ref = copy.deepcopy(wrapper)
    gen = torch.Generator().manual_seed(1)
    prog = ostinato.export(wrapper, (), hf_decode_inputs(0, gen), trace_strict=True)
    ops = prog.op_counts()
    assert ops["ost.sdpa"] == 2 and not GONE & set(ops), ops
    assert not mask_aranges(prog, MAX_CACHE)
    for n in sdpa_nodes(prog):
        q, k, v, mask, q_pos, scale, rep, is_causal = n.args
        assert mask is None and rep == n_rep and is_causal is False and scale == 0.25
        assert str(q_pos.meta) == "i64[1,1,1,1]" and str(k.meta) == f"f32[2,{4 // n_rep},16,16]"
    exe = ostinato.compile(prog)
    for s in range(8):
        kwargs = hf_decode_inputs(s, gen)
        with torch.no_grad():
            expected = ref(**kwargs)
        assert_same(exe(**kwargs), expected, msg=f"{family} step {s}")


class Attention(torch.nn.Module):
    """Projections into q [B, H, T, D] and k, v [B, Hkv, T, D]; ``expand`` picks how KV heads reach H."""

    def __init__(self, expand="repeat_interleave", heads=4, kv_heads=2, head_dim=8, dim=16):
        super().__init__()
        self.q = torch.nn.Linear(dim, heads * head_dim, bias=False)
        self.kv = torch.nn.Linear(dim, 2 * kv_heads * head_dim, bias=False)
        self.expand, self.heads, self.kv_heads, self.head_dim = expand, heads, kv_heads, head_dim

    def project(self, x):
        b, t, _ = x.shape
        q = self.q(x).view(b, t, self.heads, self.head_dim).transpose(1, 2)
        k, v = self.kv(x).view(b, t, 2 * self.kv_heads, self.head_dim).transpose(1, 2).chunk(2, dim=1)
        return q, k, v

    def repeat(self, kv, dim=1):
        rep = self.heads // self.kv_heads
        if self.expand == "repeat_interleave":
            return kv.repeat_interleave(rep, dim=dim)
        b, h, s, d = kv.shape  # HF's repeat_kv, written with reshape on the expanded tensor
        return kv[:, :, None].expand(b, h, rep, s, d).reshape(b, h * rep, s, d)


class Masked(Attention):
    """An explicit mask (an input) passed to sdpa as it is."""

    def forward(self, x, mask):
        q, k, v = self.project(x)
        return F.scaled_dot_product_attention(q, self.repeat(k), self.repeat(v), attn_mask=mask)


@pytest.mark.parametrize("expand", ["repeat_interleave", "repeat_kv"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bool])
def test_explicit_mask_is_passed_through(expand, dtype):
    def inputs():
        x = torch.randn(2, 5, 16)
        m = torch.rand(2, 1, 5, 5) > 0.3 if dtype == torch.bool else torch.randn(2, 1, 5, 5)
        return x, m | torch.eye(5, dtype=torch.bool) if dtype == torch.bool else m

    prog, _ = export_and_compare(Masked(expand), inputs(), more_inputs=[inputs()])
    # a boolean mask reaches the attention as the additive mask torch computes from it
    additive = {"aten.scalar_tensor": 2, "aten.where.self": 1} if dtype == torch.bool else {}
    assert prog.op_counts() == {"ost.multi_linear": 1, "aten.view": 2, "aten.permute": 2,
                                "aten.split_with_sizes": 1, "ost.sdpa": 1, **additive}
    (node,) = sdpa_nodes(prog)
    mask = node.args[3]
    if dtype == torch.bool:
        assert mask.producer.op == "aten.where.self" and mask.meta.dtype == torch.float32
        mask = mask.producer.args[0]
    assert mask is prog.graph.inputs[1] and node.args[4:] == (None, None, 2, False)


class Causal(Attention):
    def forward(self, x):
        q, k, v = self.project(x)
        return F.scaled_dot_product_attention(q, self.repeat(k, -3), self.repeat(v, -3), is_causal=True, scale=0.3)


class SharedMask(torch.nn.Module):
    """Layers of attention reading one boolean mask (a sliding window built once, as Mistral's)."""

    def forward(self, q, k, v, mask):
        for _ in range(3):
            q = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return q


def test_boolean_mask_made_additive_once_for_every_layer():
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 6, 8, generator=g, dtype=torch.bfloat16) for _ in range(3))
    window = torch.arange(6)[:, None] - torch.arange(6)[None, :]
    mask = (window >= 0) & (window < 3)
    prog, _ = export_and_compare(SharedMask(), (q, k, v, mask))
    assert prog.op_counts().get("aten.where.self") == 1 and prog.op_counts().get("ost.sdpa") == 3
    masks = {id(n.args[3]) for n in sdpa_nodes(prog)}
    assert len(masks) == 1 and sdpa_nodes(prog)[0].args[3].meta.dtype == torch.bfloat16


def test_causal_prefill():
    prog, _ = export_and_compare(Causal(), (torch.randn(2, 6, 16),), more_inputs=[(torch.randn(2, 6, 16),)])
    (node,) = sdpa_nodes(prog)
    assert node.args[3:] == (None, None, 0.3, 2, True)
    assert "aten.repeat_interleave.self_int" not in prog.op_counts()


class NativeGQA(Attention):
    def forward(self, x):
        q, k, v = self.project(x)
        return F.scaled_dot_product_attention(q, k, v, enable_gqa=True)


class ExpandedAndNativeGQA(Attention):
    """Keys expanded 2x by hand, then 2x more by sdpa's enable_gqa: n_rep is the product."""

    def __init__(self):
        super().__init__(heads=8, kv_heads=2)

    def forward(self, x):
        q, k, v = self.project(x)
        return F.scaled_dot_product_attention(q, k.repeat_interleave(2, 1), v.repeat_interleave(2, 1),
                                              enable_gqa=True)


@pytest.mark.parametrize("model, n_rep", [(lambda: NativeGQA(heads=6, kv_heads=2), 3),
                                           (lambda: ExpandedAndNativeGQA(), 4)])
def test_enable_gqa(model, n_rep):
    prog, _ = export_and_compare(model(), (torch.randn(2, 5, 16),), more_inputs=[(torch.randn(2, 5, 16),)])
    (node,) = sdpa_nodes(prog)
    assert node.args[3:] == (None, None, None, n_rep, False) and str(node.args[1].meta) == "f32[2,2,5,8]"


class ExpansionReadTwice(Attention):
    """The expanded keys are also returned (or, uneven, v is expanded by another factor): the
    expansions stay and the attention reads them as they are."""

    def __init__(self, expand, uneven=False):
        super().__init__(expand, heads=4, kv_heads=1 if uneven else 2)
        self.uneven = uneven

    def forward(self, x):
        q, k, v = self.project(x)
        keys = self.repeat(k)
        if self.uneven:  # k has 1 head, v 2: 4 heads are 1 x 4 and 2 x 2
            v = torch.cat([v, v + 1], dim=1).repeat_interleave(2, dim=1)
            return F.scaled_dot_product_attention(q, keys, v)
        return F.scaled_dot_product_attention(q, keys, self.repeat(v)), keys


@pytest.mark.parametrize("expand, uneven", [("repeat_interleave", False), ("repeat_kv", False),
                                            ("repeat_interleave", True)])
def test_expansion_with_another_reader_is_kept(expand, uneven):
    prog, _ = export_and_compare(ExpansionReadTwice(expand, uneven), (torch.randn(2, 5, 16),),
                                 more_inputs=[(torch.randn(2, 5, 16),)])
    ops = prog.op_counts()
    (node,) = sdpa_nodes(prog)
    assert node.args[6] == 1 and str(node.args[1].meta) == str(node.args[2].meta) == "f32[2,4,5,8]"
    if expand == "repeat_interleave":
        assert ops["aten.repeat_interleave.self_int"] == 2
    else:
        assert ops["aten.expand"] == 2 and ops["aten.clone"] == 2


class PositionMask(Attention):
    """A cache of length 8 and a mask from positions; ``form`` varies how the mask is written."""

    def __init__(self, form):
        super().__init__()
        self.form = form
        self.register_buffer("k_cache", torch.randn(1, 2, 8, 8))
        self.register_buffer("v_cache", torch.randn(1, 2, 8, 8))

    def forward(self, x, pos):
        q, k, v = self.project(x)
        self.k_cache.index_copy_(2, pos, k)
        self.v_cache.index_copy_(2, pos, v)
        s = self.k_cache.shape[2]
        f = self.form
        if f == "le":          # tiny decoder's form
            mask = torch.arange(s).unsqueeze(0) <= pos.unsqueeze(1)
        elif f == "ge_hf":     # HF's: 4-D positions on both sides, expanded over the batch
            mask = (pos[None, None, :, None] >= torch.arange(s)[None, None, None, :]).expand(1, -1, -1, -1)
        elif f == "viewed":    # a user's: 2-D mask viewed to [1, 1, T, S]
            mask = (torch.arange(s) <= pos.view(-1, 1)).view(1, 1, pos.shape[0], -1)
        elif f == "one_key":   # arange of length 1 (broadcast over keys): not the causal mask
            mask = torch.arange(1).unsqueeze(0) <= pos.unsqueeze(1)
        elif f == "shifted":   # arange from 1 and a strict compare: same values, not this pattern
            mask = torch.arange(1, s + 1).unsqueeze(0) <= pos.unsqueeze(1) + 1
        elif f == "per_key":   # positions laid along the keys ([1, T] with T == S): no q_pos
            mask = torch.arange(s).unsqueeze(0) <= pos.unsqueeze(0)
        return F.scaled_dot_product_attention(q, self.repeat(self.k_cache), self.repeat(self.v_cache),
                                              attn_mask=mask)


@pytest.mark.parametrize("form, fused", [("le", True), ("ge_hf", True), ("viewed", True), ("one_key", False), ("shifted", False),
                                         ("per_key", False)])
def test_position_mask(form, fused):
    t = 8 if form == "per_key" else 2
    steps = [(torch.randn(1, t, 16), torch.randperm(8)[:t]) for _ in range(3)]
    prog, _ = export_and_compare(PositionMask(form), steps[0], more_inputs=steps[1:])
    (node,) = sdpa_nodes(prog)
    mask, q_pos = node.args[3:5]
    assert node.args[6] == 2 and q_pos is None
    # an additive mask: where(visible, 0, -inf)
    assert mask.producer.op == "aten.where.self" and mask.producer.args[0].meta.dtype == torch.bool
    visible = mask.producer.args[0].producer
    if fused:   # the positions read as q_pos; two queries: their mask made again, once, from them
        assert visible.name.endswith("_mask_visible") and visible.args[0].producer.op == "aten.arange"
        assert str(visible.args[1].meta) in ("i64[2,1]", "i64[1,1,2,1]") and len(mask_aranges(prog, 8)) == 1
        assert prog.op_counts()["aten.le.Tensor"] == 1 and "aten.ge.Tensor" not in prog.op_counts()
    else:       # the model's own boolean mask
        assert not visible.name.endswith("_mask_visible")


class ContiguousHeads(Attention):
    """Whisper's and BART's attention: q, k and v made dense after their transposes (``.contiguous()``);
    ``keep`` also returns the dense keys (a reader besides the attention)."""

    def __init__(self, keep=False):
        super().__init__(heads=4, kv_heads=4)
        self.keep = keep

    def forward(self, x):
        q, k, v = (t.contiguous() for t in self.project(x))
        out = F.scaled_dot_product_attention(q, k, v)
        return (out, k * 2) if self.keep else out


@pytest.mark.parametrize("keep", [False, True])
def test_dense_copies_of_heads_are_absorbed(keep):
    """The copies read by the attention alone go; one read elsewhere too stays. Outputs match eager."""
    prog, _ = export_and_compare(ContiguousHeads(keep), (torch.randn(2, 5, 16),), more_inputs=[(torch.randn(2, 5, 16),)])
    (node,) = sdpa_nodes(prog)
    assert prog.op_counts().get("aten.clone", 0) == (1 if keep else 0)
    clones = [a.producer is not None and a.producer.op == "aten.clone" for a in node.args[:3]]
    assert clones == [False, keep, False], clones


class PositionsFromArange(Attention):
    """A causal encoder's mask as CLIP's text tower (and transformers' causal masks without a cache)
    write it: positions ``arange(T)`` compared with ``arange(S)``. ``offset`` starts the queries'
    positions later (not the square causal mask); ``keys`` adds keys past the queries (T < S)."""

    def __init__(self, form="le", offset=0, keys=0):
        super().__init__()
        self.form, self.offset, self.keys = form, offset, keys

    def forward(self, x):
        q, k, v = self.project(x)
        t = x.shape[1]
        if self.keys:
            k, v = torch.cat([k, k[:, :, :self.keys] * 0.5], dim=2), torch.cat([v, v[:, :, :self.keys] + 1], dim=2)
        s = k.shape[2]
        pos = torch.arange(self.offset, self.offset + t)
        if self.form == "le":
            mask = torch.arange(s)[None, :] <= pos[:, None]
        else:       # HF's 4-D form, expanded over the batch
            mask = (pos[None, None, :, None] >= torch.arange(s)[None, None, None, :]).expand(x.shape[0], 1, -1, -1)
        return F.scaled_dot_product_attention(q, self.repeat(k), self.repeat(v), attn_mask=mask)


@pytest.mark.parametrize("form, offset, keys, causal", [("le", 0, 0, True), ("ge_hf", 0, 0, True), ("le", 1, 0, False),
                                                        ("le", 0, 3, False)])
def test_positions_from_arange_are_the_causal_flag(form, offset, keys, causal):
    """Query positions ``arange(0, T)`` over as many keys: the attention is ``is_causal`` with no mask and
    no positions, and nothing of the mask is left; positions starting later, or more keys than queries,
    get the positions' additive mask. Outputs match eager on random inputs either way."""
    prog, _ = export_and_compare(PositionsFromArange(form, offset, keys), (torch.randn(2, 6, 16),),
                                 more_inputs=[(torch.randn(2, 6, 16),)])
    (node,) = sdpa_nodes(prog)
    mask, q_pos, _, n_rep, is_causal = node.args[3:8]
    assert q_pos is None and n_rep == 2 and is_causal is causal and (mask is None) is causal
    if causal:
        assert not any(n.op.startswith("aten.arange") for n in prog.graph.nodes)
    else:       # the positions' mask, additive, made from them once
        assert mask.producer.op == "aten.where.self" and mask.producer.args[0].producer.name.endswith("_mask_visible")


class Prefill(Attention):
    def forward(self, x):
        q, k, v = self.project(x)
        t = x.shape[1]
        pos = torch.arange(t)
        mask = torch.arange(t)[None, :] <= pos[:, None]
        return F.scaled_dot_product_attention(q, self.repeat(k), self.repeat(v), attn_mask=mask)


@pytest.mark.parametrize("expand", ["repeat_kv", "repeat_interleave"])
def test_dynamic_length(expand):
    seq = Dim("seq", min=2, max=32)
    if tuple(int(p) for p in torch.__version__.split(".")[:2]) < (2, 13):
        # torch 2.11's export adds a guard it then cannot prove over the Dim range (for this module
        # "min(8*seq, 16*seq) == 8*seq"); 2.13 proves it. ostinato reports torch's refusal as such.
        with pytest.raises(ostinato.errors.ExportError, match="Constraints violated"):
            ostinato.export(Prefill(expand), (torch.randn(2, 5, 16),), dynamic_shapes=({1: seq},))
        return
    prog, _ = export_and_compare(Prefill(expand), (torch.randn(2, 5, 16),), dynamic_shapes=({1: seq},),
                                 more_inputs=[(torch.randn(2, 9, 16),), (torch.randn(2, 3, 16),)])
    (node,) = sdpa_nodes(prog)
    # positions arange(T) over T keys, T symbolic: the causal flag (positions_from_arange)
    assert node.args[3:5] == (None, None) and node.args[6] == 2 and node.args[7] is True
    assert str(node.args[0].meta.shape[2]) == str(node.args[1].meta.shape[2]) != "5"
    assert not {"aten.le.Tensor", "aten.repeat_interleave.self_int"} & set(prog.op_counts())



class ConstantMask(Attention):
    """A mask built from aranges and literals alone: transformers' traced bidirectional mask
    (``arange(T)[..., None] >= 0`` expanded, all True), a float mask of zeros, or ones that hide keys."""

    def __init__(self, form):
        super().__init__()
        self.form = form

    def forward(self, x):
        q, k, v = self.project(x)
        b, t = x.shape[:2]
        pos = torch.arange(t)
        if self.form == "bidirectional":      # all True, stride 0 on the key dim once expanded
            mask = (pos[None, None, :, None] >= 0).expand(b, -1, t, t)
        elif self.form == "zeros":            # all zero, added to the scores
            mask = torch.zeros(1, 1, 1, t).expand(b, 1, t, t)
        elif self.form == "lt-end":           # all True: every position is below the length
            mask = (pos < t)[None, None, None, :]
        elif self.form == "causal":           # constant, but hides keys: the causal flag
            mask = pos[None, :] <= pos[:, None]
        else:                                 # "shifted": hides the first key from every query: kept
            mask = (pos >= 1)[None, None, None, :].expand(b, 1, t, t)
        return F.scaled_dot_product_attention(q, self.repeat(k), self.repeat(v), attn_mask=mask)


@pytest.mark.parametrize("form, dropped", [("bidirectional", True), ("zeros", True), ("lt-end", True),
                                           ("causal", False), ("shifted", False)])
def test_mask_that_hides_nothing_is_dropped(form, dropped):
    gen = torch.Generator().manual_seed(3)
    inputs = [(torch.randn(2, 6, 16, generator=gen),) for _ in range(3)]
    prog, _ = export_and_compare(ConstantMask(form), inputs[0], more_inputs=inputs[1:])
    (node,) = sdpa_nodes(prog)
    assert (node.args[3] is None and node.args[4] is None) == (dropped or form == "causal"), node.args[3:5]
    assert node.args[7] is (form == "causal")


def test_input_mask_is_never_dropped():
    """An all-True mask given as an input is data: it may change between calls, so it stays."""
    x, m = torch.randn(2, 5, 16), torch.ones(2, 1, 5, 5, dtype=torch.bool)
    prog, _ = export_and_compare(Masked("repeat_kv"), (x, m), more_inputs=[(x, torch.rand(2, 1, 5, 5) > 0.5)])
    (node,) = sdpa_nodes(prog)
    assert node.args[3].producer.op == "aten.where.self" and node.args[3].producer.args[0] is prog.graph.inputs[1]


def test_hf_bert_traced_mask_is_dropped():
    """transformers' BERT, traced, builds an all-True [B, 1, T, T] mask where eager passes none."""
    transformers = pytest.importorskip("transformers")
    config = transformers.BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                     intermediate_size=64, vocab_size=100)
    torch.manual_seed(0)
    model = transformers.BertModel(config).eval()
    gen = torch.Generator().manual_seed(0)
    ids = [torch.randint(0, 100, (3, 12), generator=gen) for _ in range(2)]
    prog, _ = export_and_compare(LastHidden(model, use_cache=None), (ids[0],), more_inputs=[(ids[1],)])
    nodes = sdpa_nodes(prog)
    assert len(nodes) == 2 and all(n.args[3] is None and n.args[4] is None for n in nodes)


class ScaledQuery(Attention):
    """Whisper's, OPT's and BART's attention: the query projection scaled before its views (``c``, a power
    of two for head_dim 64 and 16), the attention at scale 1 (``scale=None``: torch's default); ``dense``
    adds Whisper's ``.contiguous()``; ``divide`` writes the scaling as a division; ``keep`` also returns
    the scaled query (a reader besides the attention)."""

    def __init__(self, c=0.25, scale=1.0, dense=False, divide=False, keep=False):
        super().__init__(heads=4, kv_heads=4, head_dim=16, dim=32)
        self.c, self.scale, self.dense, self.divide, self.keep = c, scale, dense, divide, keep

    def forward(self, x):
        b, t, _ = x.shape
        scaled = self.q(x) / (1 / self.c) if self.divide else self.q(x) * self.c
        q = scaled.view(b, t, self.heads, self.head_dim).transpose(1, 2)
        _, k, v = self.project(x)
        if self.dense:
            q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
        out = F.scaled_dot_product_attention(q, k, v, scale=self.scale, is_causal=True)
        return (out, scaled) if self.keep else out


@pytest.mark.parametrize("c, scale, dense, divide, keep, folded", [
    (0.25, 1.0, False, False, False, True), (0.25, 1.0, True, False, False, True),
    (0.25, None, False, False, False, True), (0.5, 1.0, False, True, False, True),
    (0.3, 1.0, False, False, False, False), (0.25, 1.0, True, False, True, False)])
def test_scaled_query_goes_into_the_scale(c, scale, dense, divide, keep, folded):
    """A power-of-two scaling of the query before its views becomes the attention's scale: no mul or div
    left, the scale multiplied by it. Another factor (it would round differently) or another reader of
    the scaled query keeps it. Outputs match eager on random inputs."""
    model = ScaledQuery(c, scale, dense, divide, keep)
    prog, _ = export_and_compare(model, (torch.randn(2, 5, 32),), more_inputs=[(torch.randn(2, 5, 32),)])
    (node,) = sdpa_nodes(prog)
    ops = prog.op_counts()
    scaling = ops.get("aten.mul.Tensor", 0) + ops.get("aten.div.Tensor", 0)
    want = c * (0.25 if scale is None else scale)     # head_dim 16: torch's default scale is 1/4
    if folded:
        assert scaling == 0 and node.args[5] == pytest.approx(want, rel=0, abs=0), (ops, node.args[5])
        assert node.args[0].producer is None or node.args[0].producer.op != "aten.clone"
    else:
        assert scaling == 1 and node.args[5] == scale, (ops, node.args[5])


class ScaledSelfAttention(torch.nn.Module):
    """One scaled tensor as the queries, keys and values: the scaling is the keys' and values' too, and stays."""

    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(32, 64)

    def forward(self, x):
        b, t, _ = x.shape
        h = (self.proj(x) * 0.25).view(b, t, 4, 16).transpose(1, 2)
        return F.scaled_dot_product_attention(h, h, h)


def test_scaling_shared_with_keys_and_values_stays():
    prog, _ = export_and_compare(ScaledSelfAttention(), (torch.randn(2, 5, 32),))
    (node,) = sdpa_nodes(prog)
    assert prog.op_counts().get("aten.mul.Tensor", 0) == 1 and node.args[5] is None
