import copy

import pytest
import torch
from torch.export import Dim

import ostinato
from examples.tiny_decoder import TinyDecoder, decode_inputs
from helpers import assert_decode_matches, assert_same, export_and_compare
from models.test_hf_decoders import decode_inputs as hf_decode_inputs, make_wrapper

ROTATE_HALF_OPS = {"aten.neg", "aten.cat", "aten.slice.Tensor", "aten.split_with_sizes"}


def rotate_half_slices(x):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def rotate_half_chunk(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=x.dim() - 1)


def rotate_interleaved_stack(x):
    return torch.stack((-x[..., 1::2], x[..., ::2]), dim=-1).flatten(-2)


def rotate_interleaved_cat(x):
    pairs = torch.cat(((-x[..., 1::2]).unsqueeze(-1), x[..., 0::2].unsqueeze(-1)), dim=-1)
    return pairs.reshape(x.shape)


FORMS = {  # name: (x, cos, sin, rotate) -> the rotary embedding, operand order as written
    "x*cos + rot*sin": lambda x, c, s, rot: x * c + rot(x) * s,
    "cos*x + sin*rot": lambda x, c, s, rot: c * x + s * rot(x),
    "rot*sin + x*cos": lambda x, c, s, rot: rot(x) * s + x * c,
    "sin*rot + cos*x": lambda x, c, s, rot: s * rot(x) + c * x,
}


class Rope(torch.nn.Module):
    """A projection into heads, then a rotary embedding with cos/sin given as inputs."""

    def __init__(self, rotate, form="x*cos + rot*sin", heads=3, head_dim=16):
        super().__init__()
        self.proj = torch.nn.Linear(heads * head_dim, heads * head_dim, bias=False)
        self.rotate, self.form, self.heads, self.head_dim = rotate, FORMS[form], heads, head_dim

    def forward(self, h, cos, sin):
        b, t, _ = h.shape
        x = self.proj(h).view(b, t, self.heads, self.head_dim).transpose(1, 2)
        return self.form(x, cos.unsqueeze(1), sin.unsqueeze(1), self.rotate)


def rope_inputs(b=2, t=5, heads=3, head_dim=16, dtype=torch.float32):
    angles = torch.rand(b, t, head_dim) * 6
    return torch.randn(b, t, heads * head_dim, dtype=dtype), angles.cos().to(dtype), angles.sin().to(dtype)


@pytest.mark.parametrize("form", list(FORMS))
@pytest.mark.parametrize("rotate, interleaved", [(rotate_half_slices, False), (rotate_half_chunk, False),
                                                 (rotate_interleaved_stack, True),
                                                 (rotate_interleaved_cat, True)])
def test_rotary_becomes_one_op(rotate, interleaved, form):
    prog, _ = export_and_compare(Rope(rotate, form), rope_inputs(), more_inputs=[rope_inputs()])
    ops = prog.op_counts()
    assert ops.pop("ost.rope") == 1 and ops.pop("aten.linear") == 1
    assert set(ops) <= {"aten.view", "aten.permute", "aten.unsqueeze"}, ops
    (rope,) = [n for n in prog.graph.nodes if n.op == "ost.rope"]
    assert rope.args[3] is interleaved
    assert rope.args[0].producer.op == "aten.permute"  # x is the projected heads, not a slice of them


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_low_precision_with_float32_tables(dtype):
    """x in half precision, cos/sin in float32: the products promote, as in the original."""
    model = Rope(rotate_half_slices).to(dtype)
    h, cos, sin = rope_inputs()
    prog, _ = export_and_compare(model, (h.to(dtype), cos, sin), more_inputs=[(h.to(dtype) * 2, sin, cos)])
    assert prog.op_counts()["ost.rope"] == 1 and "aten.neg" not in prog.op_counts()


@pytest.mark.parametrize("rotate, interleaved", [(rotate_half_slices, False), (rotate_interleaved_stack, True)])
def test_dynamic_batch_and_length(rotate, interleaved):
    b, t = Dim("b", min=2, max=8), Dim("t", min=2, max=32)
    shapes = ({0: b, 1: t}, {0: b, 1: t}, {0: b, 1: t})
    prog, _ = export_and_compare(Rope(rotate), rope_inputs(3, 4), dynamic_shapes=shapes,
                                 more_inputs=[rope_inputs(2, 7), rope_inputs(5, 2)])
    ops = prog.op_counts()
    assert ops["ost.rope"] == 1 and not ROTATE_HALF_OPS & set(ops), ops


class PartialRotary(torch.nn.Module):
    """GPT-NeoX's rotary_pct: only the first ``rot`` dims of each head rotate; the rest pass through."""

    def __init__(self, rot):
        super().__init__()
        self.rot = rot

    def forward(self, x, cos, sin):
        x_rot, x_pass = x[..., : self.rot], x[..., self.rot:]
        return torch.cat((x_rot * cos + rotate_half_slices(x_rot) * sin, x_pass), dim=-1)


@pytest.mark.parametrize("rot", [8, 4])
def test_partial_rotary_ropes_the_rotated_part_only(rot):
    def inputs():
        angles = torch.rand(5, rot) * 6
        return torch.randn(2, 3, 5, 16), angles.cos(), angles.sin()

    prog, _ = export_and_compare(PartialRotary(rot), inputs(), more_inputs=[inputs()])
    ops = prog.op_counts()
    assert ops["ost.rope"] == 1 and ops["aten.cat"] == 1 and "aten.neg" not in ops  # the cat joins x_pass
    (rope,) = [n for n in prog.graph.nodes if n.op == "ost.rope"]
    x = rope.args[0]
    assert x.producer.op == "aten.slice.Tensor" and list(x.meta.shape) == [2, 3, 5, rot]


class NotRotary(torch.nn.Module):
    def __init__(self, case):
        super().__init__()
        self.case = case

    def forward(self, x, y, cos, sin):
        h = x.shape[-1] // 2
        x1, x2 = x[..., :h], x[..., h:]
        if self.case == "rotated read elsewhere":
            rot = torch.cat((-x2, x1), dim=-1)
            return x * cos + rot * sin, rot
        if self.case == "product read elsewhere":
            xc = x * cos
            return xc + torch.cat((-x2, x1), dim=-1) * sin, xc
        if self.case == "negated half read elsewhere":
            n = -x2
            return x * cos + torch.cat((n, x1), dim=-1) * sin, n
        if self.case == "wrong sign order":  # cat((x2, -x1)) rotates the other way
            return x * cos + torch.cat((x2, -x1), dim=-1) * sin
        if self.case == "halves swapped":
            return x * cos + torch.cat((-x1, x2), dim=-1) * sin
        if self.case == "unequal split":
            a, b = x[..., :6], x[..., 6:]
            return x * cos + torch.cat((-b, a), dim=-1) * sin
        if self.case == "other tensor times cos":
            return y * cos + torch.cat((-x2, x1), dim=-1) * sin
        if self.case == "halves of two tensors":
            return x * cos + torch.cat((-y[..., h:], x1), dim=-1) * sin
        if self.case == "subtracted":
            return x * cos - torch.cat((-x2, x1), dim=-1) * sin
        if self.case == "interleaved wrong order":
            return x * cos + torch.stack((-x[..., ::2], x[..., 1::2]), dim=-1).flatten(-2) * sin
        if self.case == "interleaved odd first":
            return x * cos + torch.stack((x[..., 1::2], -x[..., ::2]), dim=-1).flatten(-2) * sin
        if self.case == "interleaved pairs of two tensors":
            return x * cos + torch.stack((-y[..., 1::2], x[..., ::2]), dim=-1).flatten(-2) * sin
        raise AssertionError(self.case)


NOT_ROTARY = ["rotated read elsewhere", "product read elsewhere", "negated half read elsewhere", "wrong sign order",
              "halves swapped", "unequal split", "other tensor times cos", "halves of two tensors",
              "subtracted", "interleaved wrong order",
              "interleaved odd first", "interleaved pairs of two tensors"]


@pytest.mark.parametrize("case", NOT_ROTARY)
def test_not_fused(case):
    def inputs():
        return torch.randn(2, 3, 16), torch.randn(2, 3, 16), torch.randn(3, 16), torch.randn(3, 16)

    prog, _ = export_and_compare(NotRotary(case), inputs(), more_inputs=[inputs()])
    ops = prog.op_counts()
    assert "ost.rope" not in ops and ops["aten.neg"] == 1, ops


class PairsRegrouped(torch.nn.Module):
    """The interleaved pairs viewed back to another shape ([1, 2, d] -> [2, 1, d]): the sum broadcasts."""

    def forward(self, x, cos, sin):
        rot = torch.stack((-x[..., 1::2], x[..., ::2]), dim=-1).flatten(-2).view(2, 1, x.shape[-1])
        return x * cos + rot * sin


def test_interleaved_pairs_must_view_back_to_x():
    def inputs():
        return torch.randn(1, 2, 16), torch.randn(16), torch.randn(16)

    prog, _ = export_and_compare(PairsRegrouped(), inputs(), more_inputs=[inputs()])
    assert "ost.rope" not in prog.op_counts() and prog.op_counts()["aten.neg"] == 1


def test_tiny_decoder_has_one_rope_per_q_and_k(tmp_path):
    torch.manual_seed(0)
    layers = 4
    model = TinyDecoder(dim=32, layers=layers, heads=2, kv_heads=1, vocab=64, max_seq=16).eval()
    ref = copy.deepcopy(model)
    prog = ostinato.export(model, decode_inputs(0, vocab=64))
    ops = prog.op_counts()
    assert ops["ost.rope"] == 2 * layers and not ROTATE_HALF_OPS & set(ops), ops
    ropes = [n for n in prog.graph.nodes if n.op == "ost.rope"]
    # per layer: Q with 2 heads, then K with 1 head, both reading the same position-indexed tables
    assert [n.args[0].meta.shape[1] for n in ropes] == [2, 1] * layers
    assert len({(n.args[1].id, n.args[2].id) for n in ropes}) == 1
    assert all(n.args[3] is False for n in ropes)
    prog.save(tmp_path / "rope.ost")
    exe = ostinato.compile(ostinato.load(tmp_path / "rope.ost"))
    assert_decode_matches(exe, ref, 8)


def test_llama_decode_has_one_rope_per_q_and_k():
    wrapper = make_wrapper("llama")
    ref = copy.deepcopy(wrapper)
    gen = torch.Generator().manual_seed(1)
    prog = ostinato.export(wrapper, (), hf_decode_inputs(0, gen), trace_strict=True)
    ops = prog.op_counts()
    layers = wrapper.model.config.num_hidden_layers
    assert ops["ost.rope"] == 2 * layers and "aten.neg" not in ops and "aten.slice.Tensor" not in ops, ops
    assert ops["aten.cat"] == 1  # cat((freqs, freqs)) building the tables: kept, it is not a rotation
    heads = [n.args[0].meta.shape[1] for n in prog.graph.nodes if n.op == "ost.rope"]
    assert heads == [4, 2] * layers  # Q (4 heads) and K (2 KV heads) of each layer
    exe = ostinato.compile(prog, device="cpu")
    for s in range(8):
        kwargs = hf_decode_inputs(s, gen)
        with torch.no_grad():
            expected = ref(**kwargs)
        assert_same(exe(**kwargs), expected, msg=f"llama step {s}")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_rope_is_eager_bit_for_bit(dtype):
    """x, cos and sin all in half precision (transformers' Llama in bf16): the fused op rounds each product
    to the dtype before the sum, as eager's ``q * cos + rotate_half(q) * sin`` does, so a transformers
    Llama's logits on the CPU are eager's bit for bit (the second product left unrounded was 1 bf16 ulp
    off at the logits' scale)."""
    import transformers

    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, vocab_size=128)
    model = transformers.AutoModelForCausalLM.from_config(cfg).eval().to(dtype)

    class Logits(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.m = model

        def forward(self, ids):
            return self.m(ids, use_cache=False).logits

    wrapper = Logits()
    g = torch.Generator().manual_seed(5)
    prog = ostinato.export(wrapper, (torch.randint(0, 128, (2, 9), generator=g),), cache=False)
    assert prog.op_counts()["ost.rope"] >= 2
    exe = ostinato.compile(prog, cache=False)
    for _ in range(3):
        ids = torch.randint(0, 128, (2, 9), generator=g)
        with torch.no_grad():
            ref = wrapper(ids)
        assert torch.equal(exe(ids), ref), (exe(ids).float() - ref.float()).abs().max()
    # and the op alone, on random tensors of the dtype
    x, cos, sin = (torch.randn(2, 4, 9, 16, generator=g).to(dtype) for _ in range(3))
    x1, x2 = x[..., :8], x[..., 8:]
    from ostinato.ir.fused_ops import rope
    assert torch.equal(rope(x, cos, sin), x * cos + torch.cat((-x2, x1), dim=-1) * sin)
