"""passes/fold_norms.py: a batched step's RMSNorms folded into the projections they feed (fp32 products, a row
scale after them, residual adds accumulated in place), and where it must not fold. The folded programs run
on the CPU (the ops' references) against eager on random inputs."""
from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import ostinato
from ostinato.passes import DEFAULT_PIPELINE
from ostinato.passes.fold_norms import fold_norms
from ostinato.passes.manager import default_pipeline

H, I, V = 64, 96, 50


def _rms(x, w, eps=1e-6):
    h = x.float()
    return w * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


class Stack(nn.Module):
    """Two pre-norm gated-MLP blocks over embedded tokens ([B, 1, H] rows), separate gate and up
    projections, a final norm and a head. ``keep``: the embedding is returned too (read after the first
    residual add: it cannot be accumulated into); ``peek``: the first norm's output is also returned."""

    def __init__(self, keep: bool = False, peek: bool = False):
        super().__init__()
        self.keep, self.peek = keep, peek
        self.embed = nn.Embedding(V, H)
        self.norms = nn.ParameterList([nn.Parameter(torch.rand(H) + 0.5) for _ in range(3)])
        self.gate = nn.ModuleList([nn.Linear(H, I, bias=False) for _ in range(2)])
        self.up = nn.ModuleList([nn.Linear(H, I, bias=False) for _ in range(2)])
        self.down = nn.ModuleList([nn.Linear(I, H, bias=False) for _ in range(2)])
        self.head = nn.Linear(H, V, bias=False)

    def forward(self, ids):
        x0 = x = self.embed(ids)
        first = None
        for k in range(2):
            h = _rms(x, self.norms[k])
            first = h if first is None else first
            x = x + self.down[k](F.silu(self.gate[k](h)) * self.up[k](h))
        out = self.head(_rms(x, self.norms[2]))
        return (out, x0) if self.keep else (out, first) if self.peek else out


def _export(model, batch: int, dtype=torch.bfloat16):
    torch.manual_seed(0)
    model = model.to(dtype).eval()
    ids = torch.randint(0, V, (batch, 1), generator=torch.Generator().manual_seed(batch))
    return model, ids, ostinato.export(copy.deepcopy(model), (ids,), passes=DEFAULT_PIPELINE, cache=False)


def _matches_eager(model, ids, prog, tol: float = 3e-2):
    with torch.no_grad():
        want = model(ids)
    got = ostinato.compile(prog)(ids)
    for g, w in zip(*(x if isinstance(x, tuple) else (x,) for x in (got, want))):
        assert g.dtype == w.dtype and g.shape == w.shape
        err = (g.float() - w.float()).abs().max().item()
        assert err <= tol * w.float().abs().max().item(), (err, w.float().abs().max().item())


def _matches_eager_on_mlx(model, ids, prog, tol: float = 3e-2):
    pytest.importorskip("mlx.core")
    got = ostinato.compile(prog, device="mlx")(ids)
    with torch.no_grad():
        want = model(ids)
    assert (got.float() - want.float()).abs().max().item() <= tol * want.float().abs().max().item()


def test_folds_norms_and_accumulates_the_residual_in_place():
    """32 rows: both blocks' norms fold (the first over the embedding, the second's residual add into the
    embedding's buffer, which nothing reads after it); the final norm stays (the head's logits are the
    graph's: its row scale would launch alone). The result equals eager's within bf16's rounding."""
    model, ids, prog = _export(Stack(), 32)
    ops = prog.op_counts()
    assert ops.get("ost.fold_weights") == 2 and ops.get("ost.linear_out") == 2, ops
    assert ops.get("ost.row_scale") == 4 and ops.get("ost.linear_acc_") == 1, ops
    assert ops.get("ost.add_rms_norm") == 1 and "ost.rms_norm" not in ops, ops
    acc = next(n for n in prog.graph.nodes if n.op == "ost.linear_acc_")
    assert acc.args[0].producer.op == "aten.embedding"
    _matches_eager(model, ids, prog)


def test_no_fold_where_the_matmul_groups_take_the_rows():
    """16 rows: the matmul groups take the norms as prologues; nothing folds."""
    _, _, prog = _export(Stack(), 16)
    assert not {"ost.fold_weights", "ost.linear_out", "ost.row_scale", "ost.linear_acc_"} & set(prog.op_counts())


def test_a_residual_read_later_is_not_accumulated_into():
    """The embedding is also returned: the second norm's add cannot write into it, so that norm stays (its
    add would otherwise be a launch of its own); the first still folds (it only reads the embedding)."""
    model, ids, prog = _export(Stack(keep=True), 32)
    ops = prog.op_counts()
    assert "ost.linear_acc_" not in ops and ops.get("ost.add_rms_norm") == 2 and ops.get("ost.fold_weights") == 1, ops
    _matches_eager(model, ids, prog)


def test_a_norm_read_by_more_than_projections_stays():
    """The first norm's output is returned as well: it is not folded (it must still be computed)."""
    model, ids, prog = _export(Stack(peek=True), 32)
    ops = prog.op_counts()
    assert ops.get("ost.rms_norm") == 1 and ops.get("ost.fold_weights") == 1, ops
    _matches_eager(model, ids, prog)


def test_float32_and_the_switch():
    """fp32 rows fold nothing (the fold is for half-precision cuBLAS products); OSTINATO_FOLD_NORMS=0 leaves
    the pass out of the default pipeline and makes it a no-op."""
    _, _, prog = _export(Stack(), 32, torch.float32)
    assert "ost.fold_weights" not in prog.op_counts()
    cuda_like = torch.zeros(1, device="meta")
    assert "fold_norms" in [n for n, _ in default_pipeline((cuda_like,))]
    assert "fold_norms" not in [n for n, _ in default_pipeline((torch.zeros(1),))]     # a CPU export
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("OSTINATO_FOLD_NORMS", "0")
        assert "fold_norms" not in [n for n, _ in default_pipeline((cuda_like,))]
        model, ids, prog = _export(Stack(), 32)
        assert "ost.fold_weights" not in prog.op_counts()
        g = prog.graph
        assert fold_norms(g) is g and "ost.fold_weights" not in prog.op_counts()


@pytest.mark.parametrize("rows", [17, 40])
def test_random_rows_match_eager(rows):
    """Rows of varied scale (each token's embedding scaled), just past the matmul groups' limit and more."""
    model, ids, prog = _export(Stack(), rows)
    with torch.no_grad():
        model.embed.weight.mul_(torch.rand(V, 1, generator=torch.Generator().manual_seed(rows)) * 8)
    prog = ostinato.export(copy.deepcopy(model), (ids,), passes=DEFAULT_PIPELINE, cache=False)
    assert prog.op_counts().get("ost.linear_acc_") == 1
    _matches_eager(model, ids, prog)


def test_a_folded_program_saves_and_loads(tmp_path):
    """The fold's ops (their lists of weights and splits, dtypes, the in-place accumulation) go through the
    .ost file: the loaded program has them and gives the same outputs."""
    model, ids, prog = _export(Stack(), 24)
    path = tmp_path / "folded.ost"
    prog.save(str(path))
    loaded = ostinato.load(str(path))
    assert loaded.op_counts() == prog.op_counts()
    assert torch.equal(ostinato.compile(loaded)(ids), ostinato.compile(prog)(ids))
    _matches_eager(model, ids, loaded)


class _SelfResidual(nn.Module):
    """``x = x + lin0(x)`` before a normed block: the projection reads the residual itself."""

    def __init__(self, view_read: bool = False):
        super().__init__()
        self.view_read = view_read
        self.embed = nn.Embedding(V, 128)
        self.lin0 = nn.Linear(128 // (2 if view_read else 1), 128, bias=False)
        self.n1, self.n2 = nn.Parameter(torch.rand(128) + 0.5), nn.Parameter(torch.rand(128) + 0.5)
        self.gate, self.up = nn.Linear(128, I, bias=False), nn.Linear(128, I, bias=False)
        self.down, self.head = nn.Linear(I, 128, bias=False), nn.Linear(128, V, bias=False)

    def forward(self, ids):
        x = self.embed(ids)
        if self.view_read:      # a view of the residual, read before the add and after it
            v = x.view(x.shape[0], 1, 2, 64)
            x = x + self.lin0(F.silu(v).sum(2))
        else:
            x = x + self.lin0(x)
        h = _rms(x, self.n1)
        x = x + self.down(F.silu(self.gate(h)) * self.up(h))
        out = self.head(_rms(x, self.n2))
        return (out, v.sum(-1)) if self.view_read else out


@pytest.mark.parametrize("view_read", [False, True], ids=["product-reads-residual", "view-read-after"])
def test_no_accumulation_into_a_buffer_read_through_an_alias(view_read):
    """The residual is the accumulating projection's own input, or a view of it is read after the add: the
    add is not accumulated in place (it would overwrite what is read), so that norm stays."""
    model, ids, prog = _export(_SelfResidual(view_read), 32)
    assert "ost.linear_acc_" not in prog.op_counts(), prog.op_counts()
    _matches_eager(model, ids, prog)


def test_replayed_on_the_cpu():
    """A folded program (a CUDA export, say) replayed through the CPU's tape: the in-place accumulation writes
    a temporary the tape checked its static run against; three calls equal eager's."""
    model, ids, prog = _export(Stack(), 32)
    exe = ostinato.compile(prog, replay=True)
    with torch.no_grad():
        want = model(ids)
    for _ in range(3):
        got = exe(ids)
        assert (got.float() - want.float()).abs().max().item() <= 3e-2 * want.float().abs().max().item()


def test_the_export_cache_tells_the_switches_apart(monkeypatch):
    """A program exported (and cached) with the fold is not what a cached export gives under
    OSTINATO_FOLD_NORMS=0 (same pipeline names) nor under OSTINATO_DOT_ROWS=64 (the matmul groups then take
    32 rows): the fold's switches are part of the export cache's key."""
    torch.manual_seed(0)
    model = Stack().to(torch.bfloat16).eval()
    ids = torch.randint(0, V, (32, 1), generator=torch.Generator().manual_seed(3))

    def folds() -> int:
        prog = ostinato.export(copy.deepcopy(model), (ids,), passes=DEFAULT_PIPELINE, cache=True)
        return prog.op_counts().get("ost.fold_weights", 0)
    assert folds() == 2 and folds() == 2       # (the second from the cache)
    monkeypatch.setenv("OSTINATO_FOLD_NORMS", "0")
    assert folds() == 0
    monkeypatch.delenv("OSTINATO_FOLD_NORMS")
    monkeypatch.setenv("OSTINATO_DOT_ROWS", "64")
    assert folds() == 0
    monkeypatch.delenv("OSTINATO_DOT_ROWS")
    assert folds() == 2


def test_folded_weights_replace_the_originals():
    """After compile, the gate and up weights live only in their folded copy (runtime/folding.py drops each
    as soon as the fold that read it last has run); the down projections and the head keep theirs."""
    _, _, prog = _export(Stack(), 32)
    exe = ostinato.compile(prog)
    live = {v.name for v in prog.graph.constants if exe._template[v.slot] is not None}
    assert not {n for n in live if "gate" in n or "up." in n}, live
    assert {"down.0.weight", "down.1.weight", "head.weight"} <= {n.split("model.")[-1] for n in live}, live


class _Constants(nn.Module):
    """A weight-only value returned (kept per call), an arange (a creation op: folded), a weight's exp read
    by the step (folded)."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(8))

    def forward(self, x):
        return x + torch.arange(8) * 0.5 + self.w.exp(), self.w * 2


def test_the_launch_table_leaves_out_what_compile_folds():
    """ostinato inspect's launch table leaves out the launches compile-time folding runs once (a folded
    norm's weights, a creation op and what it makes), as the runtime decides, and keeps a weight-only
    value the graph returns (the runtime keeps it per call)."""
    from ostinato.codegen.report import launch_table
    prog = ostinato.export(_Constants().eval(), (torch.randn(8),), cache=False)
    table = [r["kind"] for r in launch_table(prog.graph, "cpu")]
    exe = ostinato.compile(prog)
    from ostinato.ir.ops import does_device_work
    assert table == [l.op for l in exe.launches if does_device_work(l.op)], table
    assert "aten.arange.start_step" not in table and "aten.mul.Tensor" in table
    _, _, folded = _export(Stack(), 32)
    assert "ost.fold_weights" not in [r["kind"] for r in launch_table(folded.graph, "cuda")]


@pytest.mark.mlx
def test_a_folded_program_runs_on_mlx():
    """A folded program (a CUDA export) compiled for MLX: the fold's ops have MLX handlers (the accumulation
    as a new array), and the result equals eager's."""
    model, ids, prog = _export(Stack(), 32)
    got = ostinato.compile(prog, device="mlx")(ids)
    with torch.no_grad():
        want = model(ids)
    assert (got.float() - want.float()).abs().max().item() <= 3e-2 * want.float().abs().max().item()


class _BiasedQKV(nn.Module):
    """A pre-norm block whose q, k and v projections have biases (Qwen 2's), read as [B, 1, heads, D] rows;
    ``packed``: one biased projection cut into the three, by ``split`` ("split") or by slices ("slice");
    ``k_bias``: False leaves k's projection without one (Whisper's)."""

    def __init__(self, packed: str | None = None, k_bias: bool = True):
        super().__init__()
        self.packed = packed
        self.embed = nn.Embedding(V, H)
        self.norm = nn.Parameter(torch.rand(H) + 0.5)
        if packed:
            self.qkv = nn.Linear(H, 3 * H)
        else:
            self.q, self.k, self.v = nn.Linear(H, H), nn.Linear(H, H, bias=k_bias), nn.Linear(H, H)
        self.o, self.head = nn.Linear(H, H, bias=False), nn.Linear(H, V, bias=False)

    def forward(self, ids):
        x = self.embed(ids)
        h = _rms(x, self.norm)
        if self.packed == "split":
            q, k, v = self.qkv(h).split(H, -1)
        elif self.packed == "slice":
            t = self.qkv(h)
            q, k, v = t[..., :H], t[..., H:2 * H], t[..., 2 * H:]
        else:
            q, k, v = self.q(h), self.k(h), self.v(h)
        b = ids.shape[0]
        q, k, v = (t.view(b, 1, 4, H // 4) for t in (q, k, v))
        a = torch.softmax((q * k).sum(-1, keepdim=True), dim=2) * v
        return self.head(x + self.o(a.reshape(b, 1, H)))


def test_biased_projections_fold_with_their_bias_after_the_scale():
    """q, k and v with biases: one folded product, and each row scale adds its projection's bias (5 args)
    after the scale. The result equals eager's within bf16's rounding."""
    model, ids, prog = _export(_BiasedQKV(), 32)
    ops = prog.op_counts()
    assert ops.get("ost.fold_weights") == 1 and ops.get("ost.linear_out") == 1, ops
    scales = [n for n in prog.graph.nodes if n.op == "ost.row_scale"]
    assert len(scales) == 3 and all(len(n.args) == 5 and n.args[4].role == "constant" for n in scales)
    assert sorted(tuple(n.args[4].meta.shape) for n in scales) == [(H,)] * 3
    _matches_eager(model, ids, prog)
    got = ostinato.compile(prog, device="mlx")(ids)     # MLX's row scale adds the bias too
    with torch.no_grad():
        want = model(ids)
    assert (got.float() - want.float()).abs().max().item() <= 3e-2 * want.float().abs().max().item()


@pytest.mark.parametrize("packed", ["slice", "split"])
def test_a_packed_biased_projection_cut_into_parts_folds_with_each_parts_bias(packed):
    """One biased projection cut into q, k and v, by slices or by a split (GPT-2's): each part's row scale
    adds its range of the bias (a slice of it), after the views that keep each row's elements in order."""
    model, ids, prog = _export(_BiasedQKV(packed=packed), 32)
    scales = [n for n in prog.graph.nodes if n.op == "ost.row_scale"]
    assert len(scales) == 3 and all(tuple(n.args[4].meta.shape) == (H,) for n in scales), prog.op_counts()
    cuts = sorted(tuple(n.args[4].producer.args[2:4]) for n in scales)
    assert cuts == [(0, H), (H, 2 * H), (2 * H, 3 * H)], cuts
    _matches_eager(model, ids, prog)


def test_a_bias_a_slice_would_cut_out_of_order_is_not_folded():
    """A slice of the heads' dim of [B, 1, 3, H] rows whose middle dim is not the first past the rows'
    (here [B, 1, 3, H] sliced along dim 3: each part is H / 2 elements of every third of the row, not one
    range): the bias cannot follow, so the norm stays."""
    class Strided(_BiasedQKV):
        def forward(self, ids):
            b = ids.shape[0]
            x = self.embed(ids)
            t = self.qkv(_rms(x, self.norm)).view(b, 1, 3, H)
            z = torch.cat([t[..., : H // 2].reshape(b, 1, -1), t[..., H // 2:].reshape(b, 1, -1)], -1)
            return self.head(x + self.o(z[..., :H]))

    model, ids, prog = _export(Strided(packed="slice"), 32)
    assert "ost.fold_weights" not in prog.op_counts(), prog.op_counts()
    _matches_eager(model, ids, prog)


def test_some_biased_some_not_folds_with_a_zero_bias():
    """q and v biased, k not: the attention kernel adds the three biases or none, so k's row scale adds zeros
    (``ost.fold_bias`` of neither a shift nor a bias: an fp32 constant once folded), and the three row scales
    stay alike for the attention to take. The result equals eager's within bf16's rounding."""
    model, ids, prog = _export(_BiasedQKV(k_bias=False), 32)
    ops = prog.op_counts()
    assert ops.get("ost.fold_weights") == 2 and ops.get("ost.fold_bias") == 1, ops
    scales = [n for n in prog.graph.nodes if n.op == "ost.row_scale"][:3]
    assert all(len(n.args) == 5 for n in scales)
    zero = [n.args[4] for n in scales if n.args[4].role != "constant"]
    assert len(zero) == 1 and zero[0].producer.op == "ost.fold_bias" and zero[0].meta.dtype == torch.float32
    assert zero[0].producer.args[1:] == (None, None)
    _matches_eager(model, ids, prog)


@pytest.mark.parametrize("lag", [False, True], ids=["plain", "lagging"])
def test_the_mlx_attention_takes_row_scaled_biased_rows(lag):
    """MLX's merged decode attention with q, k and v as row-scaled fp32 products and their biases (the caches'
    dtype an MLX dtype there) equals the reference's; ``lag``: LayerNorm's statistic of a lagging stream plus
    its shift, and q's, k's and v's pre-scale biases (a result the shift changes)."""
    import mlx.core as mx
    import numpy as np

    from ostinato.backends.mlx.ops_fused import decode_attention
    from ostinato.ir.fused_ops import decode_attention_
    g = torch.Generator().manual_seed(0)
    kc, vc = torch.randn(2, 2, 8, 4, generator=g).half(), torch.randn(2, 2, 8, 4, generator=g).half()
    q, k, v = (torch.randn(2, 1, n, 4, generator=g) * 3 for n in (4, 2, 2))
    x, index = torch.randn(2, 1, 12, generator=g).half(), torch.tensor([3])
    biases = [torch.randn(n, generator=g).half() for n in (16, 8, 8)]
    extra = {}
    if lag:
        extra = dict(row_center=True, row_shift=torch.randn(12, generator=g) * 3,
                     row_pre=[torch.randn(n, generator=g) * 2 for n in (16, 8, 8)])
    want = decode_attention_(kc.clone(), vc.clone(), q, k, v, index, 2, n_rep=2, row_x=x, row_eps=1e-5,
                             row_bias=biases, **extra)
    if lag:
        plain = decode_attention_(kc.clone(), vc.clone(), q, k, v, index, 2, n_rep=2, row_x=x, row_eps=1e-5,
                                  row_bias=biases, row_center=True)
        assert (plain[0].float() - want[0].float()).abs().max() > 1e-2
    m = lambda t: mx.array(t.float().numpy()).astype(mx.float16 if t.dtype == torch.float16 else mx.float32)  # noqa: E731
    mlx_extra = {name: ([m(t) for t in val] if isinstance(val, list) else m(val) if isinstance(val, torch.Tensor)
                        else val) for name, val in extra.items()}
    got = decode_attention(m(kc), m(vc), m(q), m(k), m(v), mx.array(index.numpy()), 2, n_rep=2, row_x=m(x),
                           row_eps=1e-5, row_bias=[m(b) for b in biases], **mlx_extra)
    for a, b in zip(got, want):
        assert np.allclose(np.array(a.astype(mx.float32)), b.float().numpy(), atol=2e-3), (a, b)


class _LayerStack(nn.Module):
    """Two pre-norm blocks as LayerNorm models write them: ``style`` "affine" (nn.LayerNorm with a weight and a
    shift, StableLM's; biased up projection) or "plain" (OLMo's: F.layer_norm without either, over the rows
    cast to fp32, cast back); each block's residual add before the next norm (``x = x + down(...)``), the
    embedding offset so the rows' mean is about 2 against a spread of about 1."""

    def __init__(self, style: str = "affine"):
        super().__init__()
        self.style = style
        self.embed = nn.Embedding(V, H)
        self.norms = nn.ModuleList([nn.LayerNorm(H) for _ in range(3)])
        with torch.no_grad():
            self.embed.weight.add_(2.0)
            for n in self.norms:
                n.weight.uniform_(0.5, 1.5)
                n.bias.uniform_(-0.5, 0.5)
        self.up = nn.ModuleList([nn.Linear(H, I, bias=style != "plain") for _ in range(2)])
        self.down = nn.ModuleList([nn.Linear(I, H, bias=False) for _ in range(2)])
        self.head = nn.Linear(H, V, bias=False)

    def norm(self, k, x):
        if self.style == "affine":
            return self.norms[k](x)
        return F.layer_norm(x.float(), (H,), None, None, 1e-5).to(x.dtype)

    def forward(self, ids):
        x = self.embed(ids)
        for k in range(2):
            if self.style == "reshaped":    # OPT's: the rows flattened, the sum of the flat rows viewed back
                flat = x.reshape(-1, H)
                x = (flat + self.down[k](F.gelu(self.up[k](self.norms[k](flat))))).view(x.shape)
            else:
                x = x + self.down[k](F.gelu(self.up[k](self.norm(k, x))))
        return self.head(self.norm(2, x))


def test_a_layer_norm_after_a_reshaped_sum_folds_through_the_views():
    """OPT's form: the second norm reads a sum of flattened rows (a view of the embedding, and a projection),
    viewed back. The accumulation goes into the buffer under the view (the embedding, which nothing reads
    after the add), so both blocks' norms fold and no add is left a launch; the final norm (the head's)
    stays. The result equals eager's."""
    from ostinato.codegen.report import launch_table
    model, ids, prog = _export(_LayerStack("reshaped"), 32)
    ops = prog.op_counts()
    assert ops.get("ost.fold_weights") == 2 and ops.get("ost.layer_norm") == 1, ops
    acc = next(n for n in prog.graph.nodes if n.op == "ost.linear_acc_")
    assert acc.args[0].producer.op == "aten.embedding"
    kinds = [r["kind"] for r in launch_table(prog.graph, "cuda")]
    assert kinds.count("ost.linear_acc_") == 1 and "aten.add.Tensor" not in kinds, kinds
    _matches_eager(model, ids, prog)


@pytest.mark.parametrize("style", ["affine", "plain"])
def test_layer_norms_fold_with_centered_weights(style):
    """32 rows: both blocks' LayerNorms fold (centered weights, the row scales with LayerNorm's statistic,
    ``center``), the first block's residual add (an aten.add before the second norm) becomes the down
    projection's accumulation (the second's feeds the final norm, which stays); with a shift (and the up projection's own bias), each row scale adds ``W @ shift + bias``
    from ost.fold_bias; without either, no bias. The final norm feeds the head's logits and stays. The
    result equals eager's within bf16's rounding, on the CPU and on MLX."""
    model, ids, prog = _export(_LayerStack(style), 32)
    ops = prog.op_counts()
    assert ops.get("ost.fold_weights") == 2 and ops.get("ost.linear_acc_") == 1, ops
    assert ops.get("ost.layer_norm") == 1 and ops.get("aten.add.Tensor") == 1, ops     # (the final norm's)
    folds = [n for n in prog.graph.nodes if n.op == "ost.fold_weights"]
    assert all(n.args[3:] == (True,) and (n.args[1] is None) == (style == "plain") for n in folds)
    scales = [n for n in prog.graph.nodes if n.op == "ost.row_scale"]
    assert len(scales) == 2 and all(len(n.args) == 6 and n.args[5] is True for n in scales)
    if style != "plain":
        assert all(n.args[4].producer.op == "ost.fold_bias" and n.args[4].meta.dtype == torch.float32
                   for n in scales), ops
    else:
        assert all(n.args[4] is None for n in scales) and "ost.fold_bias" not in ops
    _matches_eager(model, ids, prog)
    _matches_eager_on_mlx(model, ids, prog)


def test_a_layer_norm_in_fp16_compute_is_not_folded():
    """ost.layer_norm computing in a half dtype (not what torch's kernels do for a half LayerNorm): the fold's
    statistic is fp32's, so the norm stays."""
    from ostinato.ir import Graph, Node, TensorMeta
    g = Graph()
    x = g.new_value("x", TensorMeta(torch.bfloat16, (32, 1, H)), "input")
    w = g.new_value("w", TensorMeta(torch.bfloat16, (I, H)), "constant")
    norm = Node("ost.layer_norm", (x, None, None, 1e-5, torch.float16), {}, "norm", "")
    y = g.new_value("y", TensorMeta(torch.bfloat16, (32, 1, H)), "temp", norm)
    norm.outputs = [y]
    lin = Node("aten.linear", (y, w), {}, "lin", "")
    lin.outputs = [g.new_value("h", TensorMeta(torch.bfloat16, (32, 1, I)), "temp", lin)]
    act = Node("aten.relu", (lin.outputs[0],), {}, "act", "")
    act.outputs = [g.new_value("out", TensorMeta(torch.bfloat16, (32, 1, I)), "temp", act)]
    g.nodes = [norm, lin, act]
    g.outputs = [act.outputs[0]]
    assert [n.op for n in fold_norms(g).nodes] == ["ost.layer_norm", "aten.linear", "aten.relu"]
    norm.args = (x, None, None, 1e-5, torch.float32)
    assert "ost.fold_weights" in [n.op for n in fold_norms(g).nodes]


def test_centered_fold_rounding_keeps_row_sums_near_zero():
    """fold_weights with ``center``: every element within one ulp of the exact centered value (2^-7 relative
    in bf16, 2^-10 in fp16, or one subnormal step), and each row's sum far below plain rounding's (random
    rows of 2048 and 4096; fp16 weights small enough that a tenth are subnormal)."""
    from ostinato.ir.fold_ops import fold_weights
    g = torch.Generator().manual_seed(7)
    for n, k, dt, scale in ((96, 2048, torch.bfloat16, 1.0), (40, 4096, torch.bfloat16, 1.0),
                            (64, 4096, torch.float16, 0.03)):
        W = (torch.randn(n, k, generator=g) / k ** 0.5 * scale).to(dt)
        w = (torch.rand(k, generator=g) + 0.5).to(dt)
        v = W.float() * w.float()
        exact = v - v.mean(-1, keepdim=True)
        got = fold_weights([W], w, 0.0, True)
        assert got.dtype == dt and got.shape == W.shape
        bits = {torch.bfloat16: 8, torch.float16: 11}[dt]     # (significand bits)
        ulp = (exact.abs() * 2.0 ** (1 - bits)).clamp_min(torch.finfo(dt).smallest_normal * 2.0 ** (1 - bits))
        assert ((got.float() - exact).abs() <= ulp).all()
        plain = (exact.bfloat16().double() - exact.double()).sum(-1).abs()
        ours = (got.double() - exact.double()).sum(-1).abs()
        assert ours.max() < plain.mean() / 50, (ours.max().item(), plain.mean().item())


def test_folds_run_at_compile_in_a_program_with_methods(monkeypatch):
    """A program with other entry points keeps the original weights beside the folded copies, and the folds
    still run once at compile whatever their size (with compile-time folding's total cap at 0 here): left
    to run, each would read and write every weight it folds at every step, a LayerNorm's with its rounding
    search. The result equals eager's."""
    from ostinato.runtime import folding
    model, ids, prog = _export(_LayerStack("affine"), 32)
    monkeypatch.setattr(folding, "_TOTAL_LIMIT", 0)
    prog.methods = {"twin": copy.deepcopy(prog)}
    exe = ostinato.compile(prog)
    assert not [l.op for l in exe.launches if l.op in ("ost.fold_weights", "ost.fold_bias")]
    _matches_eager(model, ids, prog)


def test_a_fold_left_to_run_syncs_nothing(monkeypatch):
    """With compile-time folding off, the LayerNorm's centered fold runs every step: its rounding search is a
    fixed number of rounds, with no tensor read on the host (no Tensor.__bool__), so a CUDA graph can
    capture it. The result equals eager's."""
    from torch.overrides import TorchFunctionMode
    monkeypatch.setenv("OSTINATO_FOLD_CONSTANTS", "0")
    model, ids, prog = _export(_LayerStack("affine"), 32)
    exe = ostinato.compile(prog)
    assert "ost.fold_weights" in [l.op for l in exe.launches]
    exe(ids)

    class Reads(TorchFunctionMode):
        calls = 0

        def __torch_function__(self, func, types, args=(), kwargs=None):
            if func in (torch.Tensor.__bool__, torch.Tensor.item):
                Reads.calls += 1
            return func(*args, **(kwargs or {}))
    with Reads():
        exe(ids)
    assert Reads.calls == 0
    _matches_eager(model, ids, prog)


class _BiasedStack(nn.Module):
    """Three pre-norm blocks whose output projections have biases (OPT's, StarCoder 2's, GPT-2's): the
    residual add before each next norm sums a biased product. ``style``: "layer" (nn.LayerNorm, a biased up
    projection), "reshaped" (OPT's: the sum of flattened rows viewed back), "rms" (an RMSNorm). Biases of
    about 2 against rows of spread 1, so a stream that forgot one would be far off."""

    def __init__(self, style: str = "layer"):
        super().__init__()
        self.style = style
        self.embed = nn.Embedding(V, H)
        self.norms = nn.ModuleList([nn.LayerNorm(H) for _ in range(4)])
        with torch.no_grad():
            for n in self.norms:
                n.weight.uniform_(0.5, 1.5)
                n.bias.uniform_(-0.5, 0.5)
        self.up = nn.ModuleList([nn.Linear(H, I) for _ in range(3)])
        self.down = nn.ModuleList([nn.Linear(I, H) for _ in range(3)])
        with torch.no_grad():
            for d in self.down:
                d.bias.normal_(0.0, 2.0)
        self.head = nn.Linear(H, V, bias=False)

    def norm(self, k, x):
        return _rms(x, self.norms[k].weight) if self.style == "rms" else self.norms[k](x)

    def forward(self, ids):
        x = self.embed(ids)
        for k in range(3):
            if self.style == "reshaped":
                flat = x.reshape(-1, H)
                x = (flat + self.down[k](F.relu(self.up[k](self.norm(k, flat))))).view(x.shape)
            else:
                x = x + self.down[k](F.gelu(self.up[k](self.norm(k, x))))
        return self.head(self.norm(3, x))


@pytest.mark.parametrize("style", ["layer", "reshaped", "rms"])
def test_biased_output_projections_accumulate_into_a_lagging_stream(style):
    """32 rows: every block's norm folds although the sums before them add biased products. Each product
    accumulates into the stream without its bias, and the stream then lags the true sum by the biases so far
    (``ost.fold_offset``, fp32, made at compile). The folded norms take the statistic of the stream plus that
    offset (row_scale's ``shift``), and their products add the offset through their weights (row_scale's
    ``pre``, before the scale). The final norm (the head's) reads the stream plus the offset, one generated kernel with the add.
    Each block is then three launches: the product, the row-scaled activation, the accumulation. The result
    equals eager's on the CPU and on MLX."""
    from ostinato.codegen.report import launch_table
    model, ids, prog = _export(_BiasedStack(style), 32)
    ops = prog.op_counts()
    assert ops.get("ost.fold_weights") == 3 and ops.get("ost.linear_acc_") == 2, ops
    scales = [n for n in prog.graph.nodes if n.op == "ost.row_scale"]
    assert len(scales) == 3 and [len(n.args) for n in scales] == [5 if style == "rms" else 6] + [8, 8], scales
    shifts = [n.args[6] for n in scales[1:]]
    assert all(t.producer.op == "ost.fold_offset" and t.meta.dtype == torch.float32 for t in shifts)
    assert len(shifts[1].producer.args[0]) == 2         # (the second lags by both biases so far)
    # the shift through the folded weights, added before the scale (a plain product: no bias copy kernel)
    assert all(n.args[7].producer.op == "ost.fold_bias" and n.args[7].meta.dtype == torch.float32
               for n in scales[1:])
    assert all(len(n.args) == 4 for n in prog.graph.nodes if n.op == "ost.linear_out")
    kinds = [r["kind"] for r in launch_table(prog.graph, "cuda")]
    assert kinds.count("ost.linear_acc_") == 2 and "aten.add.Tensor" not in kinds, kinds
    # the embedding, two folded blocks, the last (its product, its row-scaled activation, its down projection:
    # the final norm stays), the final sum with its norm, the head; OPT's form adds the lagging stream's
    # offset in a kernel of its own before the final sum's view
    assert len(kinds) == 1 + 3 + 3 + 3 + 1 + 1 + (style == "reshaped"), kinds
    _matches_eager(model, ids, prog)
    _matches_eager_on_mlx(model, ids, prog)


def test_a_lagging_stream_read_elsewhere_is_made_whole_for_that_reader():
    """The sum after the first block is also read by a reduction the graph returns: the second norm still
    folds (its product accumulates into the embedding), and the reduction reads the lagging stream plus its
    offset, rounded once, as eager's sum; the third norm stays (its sum's operand is read after the add, so
    it cannot be accumulated into). Everything equals eager's."""
    class Peek(_BiasedStack):
        def forward(self, ids):
            x = self.embed(ids)
            seen = []
            for k in range(3):
                x = x + self.down[k](F.gelu(self.up[k](self.norm(k, x))))
                seen.append(x)
            return self.head(self.norm(3, x)), seen[0].float().mean(-1)

    model, ids, prog = _export(Peek(), 32)
    ops = prog.op_counts()
    assert ops.get("ost.fold_weights") == 2 and ops.get("ost.linear_acc_") == 1, ops
    assert ops.get("ost.fold_offset") == 1 and ops.get("ost.layer_norm") == 2, ops
    _matches_eager(model, ids, prog)


@pytest.mark.parametrize("rows", [17, 48])
def test_lagging_streams_match_eager_on_random_rows(rows):
    """Rows of varied scale and large output biases, just past the matmul groups' limit and more."""
    torch.manual_seed(rows)
    model = _BiasedStack("layer")
    with torch.no_grad():
        model.embed.weight.mul_(torch.rand(V, 1, generator=torch.Generator().manual_seed(rows)) * 8)
        for d in model.down:
            d.bias.mul_(3.0)
    model, ids, prog = _export(model, rows)
    assert prog.op_counts().get("ost.linear_acc_") == 2
    _matches_eager(model, ids, prog)


class _Conv1DStack(nn.Module):
    """GPT-2's form: [in, out] weights used as ``addmm(bias, x, w)`` (transformers' Conv1D), two LayerNorm
    blocks, the second reading the sum of the first's biased output."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(V, H)
        self.norms = nn.ModuleList([nn.LayerNorm(H) for _ in range(3)])
        self.up_w = nn.ParameterList([nn.Parameter(torch.randn(H, I) * 0.1) for _ in range(2)])
        self.up_b = nn.ParameterList([nn.Parameter(torch.randn(I) * 0.1) for _ in range(2)])
        self.down_w = nn.ParameterList([nn.Parameter(torch.randn(I, H) * 0.1) for _ in range(2)])
        self.down_b = nn.ParameterList([nn.Parameter(torch.randn(H)) for _ in range(2)])
        self.head = nn.Linear(H, V, bias=False)

    @staticmethod
    def conv1d(x, w, b):
        return torch.addmm(b, x.reshape(-1, x.shape[-1]), w).view(*x.shape[:-1], w.shape[1])

    def forward(self, ids):
        x = self.embed(ids)
        for k in range(2):
            h = F.gelu(self.conv1d(self.norms[k](x), self.up_w[k], self.up_b[k]), approximate="tanh")
            x = x + self.conv1d(h, self.down_w[k], self.down_b[k])
        return self.head(self.norms[2](x))


def test_conv1d_weights_fold_through_a_transposed_view_and_leave_the_constants():
    """[in, out] weights fold (read through a transposed view) and accumulate (the second block's sum into
    the first's stream, lagging by the first's output bias); after compile the up weights live only in
    their folded copies, even though the folds read them through views. The result equals eager's."""
    model, ids, prog = _export(_Conv1DStack(), 32)
    ops = prog.op_counts()
    assert ops.get("ost.fold_weights") == 2 and ops.get("ost.linear_acc_") == 1, ops
    _matches_eager(model, ids, prog)
    exe = ostinato.compile(prog)
    live = {v.name for v in prog.graph.constants if exe._template[v.slot] is not None}
    assert not {n for n in live if n.startswith("up_w")}, live
    assert {"down_w.0", "down_w.1", "head.weight"} <= live, live


class _SharedReshape(nn.Module):
    """The reviewer's cases around a lagging stream: ``case`` "peek" (the stream after a biased block,
    flattened, read both by the next sum and by a reduction the graph returns), "returned" (the lagging
    sum returned and read by nothing else), "mixed" (OPT's flattened block without biases, then plain ones),
    "narrow" (a buffer whose rows are two embeddings of half the width: its last dim is not the sum's)."""

    def __init__(self, case: str):
        super().__init__()
        self.case = case
        self.embed = nn.Embedding(V, H // 2 if case == "narrow" else H)
        self.norms = nn.ModuleList([nn.LayerNorm(H) for _ in range(4)])
        self.up = nn.ModuleList([nn.Linear(H, I) for _ in range(3)])
        self.down = nn.ModuleList([nn.Linear(I, H, bias=case != "mixed") for _ in range(3)])
        with torch.no_grad():
            for d in self.down:
                if d.bias is not None:
                    d.bias.normal_(0.0, 2.0)
        self.head = nn.Linear(H, V, bias=False)

    def norm(self, k, x):       # ("returned": RMSNorms, whose sum is ost.add_rms_norm's own output)
        return _rms(x, self.norms[k].weight) if self.case == "returned" else self.norms[k](x)

    def block(self, k, x):
        return self.down[k](F.relu(self.up[k](self.norm(k, x))))

    def forward(self, ids):
        if self.case == "narrow":
            x = self.embed(torch.cat([ids, ids + 1], 1)).reshape(ids.shape[0], 1, H)
        else:
            x = self.embed(ids)
        if self.case == "mixed":
            flat = x.reshape(-1, H)
            x = (flat + self.block(0, flat)).view(x.shape)
        else:
            x = x + self.block(0, x)
        extra = ()
        if self.case == "peek":
            flat = x.reshape(-1, H)
            extra = (flat.float().mean(-1),)
            x = flat + self.block(1, x).reshape(-1, H)
        else:
            x = x + self.block(1, x)
        x = x + self.block(2, x)
        if self.case == "returned":
            return self.head(self.norm(3, x)).float().mean(-1), x
        return (self.head(self.norm(3, x)), *extra)


@pytest.mark.parametrize("case", ["peek", "returned", "mixed", "narrow"])
@pytest.mark.parametrize("stop", [False, True], ids=["pipeline", "up-to-fold"])
def test_lagging_streams_never_leave_a_reader_of_a_dropped_value(case, stop):
    """A lagging stream (or a reshape of a buffer) another node still reads is not taken apart; a lagging
    sum the graph returns is made whole; a buffer whose last dim is not the sum's is not accumulated into.
    The program equals eager's through the whole pipeline and with the pipeline stopped right after the
    fold (no later pass to tidy up after it)."""
    passes = DEFAULT_PIPELINE
    if stop:
        names = [n for n, _ in DEFAULT_PIPELINE]
        passes = DEFAULT_PIPELINE[:names.index("fold_norms") + 1]
    torch.manual_seed(0)
    model = _SharedReshape(case).to(torch.bfloat16).eval()
    ids = torch.randint(0, V, (32, 1), generator=torch.Generator().manual_seed(32))
    prog = ostinato.export(copy.deepcopy(model), (ids,), passes=passes, cache=False)
    assert prog.op_counts().get("ost.fold_weights", 0) >= 2, prog.op_counts()
    _matches_eager(model, ids, prog)


class _CatCache(nn.Module):
    """A pre-norm block whose keys and values join a past cache by concatenation (no ost.kv_update_, so no
    decode attention takes q's, k's and v's row scales), then a plain MLP block."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(V, H)
        self.norms = nn.ParameterList([nn.Parameter(torch.rand(H) + 0.5) for _ in range(3)])
        self.q, self.k, self.v = (nn.Linear(H, H, bias=False) for _ in range(3))
        self.o = nn.Linear(H, H, bias=False)
        self.up, self.down = nn.Linear(H, I, bias=False), nn.Linear(I, H, bias=False)
        self.head = nn.Linear(H, V, bias=False)
        self.register_buffer("past", torch.randn(32, 4, 3, H // 4))

    def forward(self, ids):
        x = self.embed(ids)
        h = _rms(x, self.norms[0])
        b = ids.shape[0]
        q, k, v = (p(h).view(b, 1, 4, H // 4).transpose(1, 2) for p in (self.q, self.k, self.v))
        k = torch.cat([self.past.to(k.dtype), k], 2)
        v = torch.cat([self.past.to(v.dtype), v], 2)
        a = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, 1, H)
        x = x + self.o(a)
        x = x + self.down(F.silu(self.up(_rms(x, self.norms[1]))))
        return self.head(_rms(x, self.norms[2]))


def test_no_fold_where_the_keys_join_a_cache_by_concatenation():
    """q, k and v whose keys and values are concatenated to a past cache: their norm stays (each row scale
    would launch alone, three kernels for one), the MLP's folds. The result equals eager's."""
    model, ids, prog = _export(_CatCache(), 32)
    ops = prog.op_counts()
    assert ops.get("ost.fold_weights") == 1 and ops.get("ost.row_scale") == 1, ops
    _matches_eager(model, ids, prog)


class _StridedAfterLag(nn.Module):
    """A biased output projection (a lagging stream), then an RMSNorm whose packed q/k/v (no biases) are
    cut along the head dim of [B, 1, 4, 48] rows (each part is no one range of the row)."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(V, H)
        self.norms = nn.ParameterList([nn.Parameter(torch.rand(H) + 0.5) for _ in range(3)])
        self.up, self.down = nn.Linear(H, I, bias=False), nn.Linear(I, H)
        with torch.no_grad():
            self.down.bias.normal_(0.0, 2.0)
        self.qkv, self.o = nn.Linear(H, 3 * H, bias=False), nn.Linear(H, H, bias=False)
        self.head = nn.Linear(H, V, bias=False)

    def forward(self, ids):
        x = self.embed(ids)
        x = x + self.down(F.relu(self.up(_rms(x, self.norms[0]))))
        b = ids.shape[0]
        t = self.qkv(_rms(x, self.norms[1])).view(b, 1, 4, 48)
        q, k, v = t[..., :16], t[..., 16:32], t[..., 32:]
        x = x + self.o((q * k + v).reshape(b, 1, H))
        return self.head(_rms(x, self.norms[2]))


def test_a_lag_over_parts_that_are_no_one_range_keeps_the_norm():
    """The second norm's sum lags by the first block's bias, and its products' parts are no one range of the
    row: the pre-scale bias could not be cut to them, so that norm stays (the first still folds). The
    result equals eager's."""
    model, ids, prog = _export(_StridedAfterLag(), 32)
    ops = prog.op_counts()
    assert ops.get("ost.fold_weights") == 1 and "ost.fold_offset" not in ops, ops
    _matches_eager(model, ids, prog)
