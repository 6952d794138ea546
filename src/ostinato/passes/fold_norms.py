"""Fold an RMSNorm or a LayerNorm into the projections it feeds, for a batched decode step's cuBLAS products.

A decode step of more rows than codegen/linear.py's matmul groups take (``max_rows``: 16, unless
OSTINATO_DOT_ROWS asks for its tl.dot kernel) keeps its projections on cuBLAS, and cuBLAS takes no norm
before it: a Llama layer is then 8 launches, two of them
the add + RMSNorm kernels between the products. Since ``rstd`` is one number per row,

    rms_norm(x, w) @ W^T  =  rstd(x) * (x @ (W * w)^T)

so the projection can read ``x`` itself, with ``W * w`` a constant (``ost.fold_weights``, folded once at
compile), its product kept in fp32 (``ost.linear_out``) and scaled by ``rstd`` in the kernel that reads it
anyway (``ost.row_scale``): the attention kernel takes the row scale of q, k and v (codegen/attention.py),
a pointwise group (SwiGLU) computes it from ``x``'s row (codegen/expand_rows.py, a reduction over the
product's row that reads ``x`` masked past its width); any other runs a kernel of its own
(backends/cuda/kernels/norms.row_scale). The residual add before the norm becomes the
beta=1 accumulation of the product that made one of its operands, in place (``ost.linear_acc_``: one
cuBLAS call), so no kernel is left for the add or the norm: q/k/v, attention, o (+= x), gate/up,
SwiGLU, down (+= x), 6 launches. Accuracy (bench/fold_numerics.py): with the fp32 product, no worse than
eager's bf16 path.

A LayerNorm folds the same way, its centering being linear too: ``(x - mean(x)) @ V^T = x @ (V - mean_k
V)^T``, so

    layer_norm(x, w, s) @ W^T + b  =  rstd(x) * (x @ C^T) + (W @ s + b),   C = rows of W * w less their means

``ost.fold_weights(..., center=True)`` makes ``C`` (rounded so that each row's sum stays near 0: the
product subtracts the mean only as well as ``C``'s rows sum to 0, bench/fold_numerics.py --layer),
``ost.fold_bias`` the fp32 vector ``W @ s + b``, and the row scale (``center``) takes LayerNorm's statistic,
``rsqrt(var(x) + eps)``. OLMo's LayerNorm without weights folds with ``w`` and ``s`` left out; StableLM's,
with both and its q/k/v biases, takes one fp32 bias per projection.

A norm is folded when

- it is an ``ost.rms_norm``, ``ost.add_rms_norm`` (any algebraic form the rms_norm pattern recognises) with
  a constant 1-d weight, or an ``ost.layer_norm`` (computed in its rows' dtype or fp32, as torch's kernels
  do) with a constant weight and shift or none, over fp16/bf16 rows of static shape [B, 1, ..., H], B more
  than the matmul groups take (a decode step's tokens along dim 0);
- its normalized output is read only by projections (``aten.linear``, ``ost.multi_linear``, ``ost.linear``,
  whose activation then runs after the row scale, and whose [in, out] weights (GPT-2's Conv1D) the folds
  read through a transposed view) of constant weights. A constant bias is added by the row scale after its
  scale (``rstd * p + b``: Qwen 2's q, k and v, which the attention kernel then takes with their biases),
  where each end of the views between the product and the row scale holds one range of a row's elements in
  order (reshapes; slices or splits of the last dims: GPT-2's q/k/v split, each part's range of the bias),
  and no packed gating reads it; a projection without one beside biased ones adds zeros (the attention
  kernel adds q's, k's and v's or none);
- the sum before it can be the in-place accumulation of the projection that made one of its operands
  (fold_residual.py's conditions). Otherwise the norm stays (folding it would leave the add a launch).

**Biased output projections (OPT, StarCoder 2, GPT-2)** accumulate without their biases, so the stream lags
the true sum by ``o``, the fp32 sum of the biases so far (fold_residual.py). The folded norm takes the
statistic of ``t + o`` (row_scale's ``shift``: the attention kernel's, the generated group's and the library
kernel's read ``o`` beside ``x``), and its product adds ``o`` through its weights, ``(t + o) @ F^T = t @ F^T +
F @ o`` (``ost.fold_bias`` of the folded weights, the row scale's ``pre``, added before its scale; not the
product's bias, which torch.addmm with an out_dtype copies into its result in a kernel of its own).

The row scale is placed after the chain of views (reshape, slices of a packed projection) that keep dim
0 as the rows and read each product, so the attention finds it on q's, k's and v's rows (before their
transposes to heads first). Not folded: a norm whose projection's result the graph returns (an LM head's
logits: its row scale would be a launch of its own); one whose q, k or v rows join a cache by concatenation
along a dim other than the last (no decode attention takes their row scales: each would launch alone); a
lagging one whose pre-scale bias a view would cut into more than one range of the row. In a program with
other entry points (``ostinato.llm``'s prefill) the original weights stay among the constants beside their folded copies
(the prefill reads them: more memory). Runs for accelerator exports only (manager.CPU_ONLY_SKIPS) and not
in torch.compile's backend (its weights stay the model's own, and a folded weight would not follow their
in-place updates). ``OSTINATO_FOLD_NORMS=0`` turns it off (the A/B switch: ``default_pipeline`` then
leaves the pass out); ``fold_key`` puts it and the matmul groups' rows into the export cache's key.
"""
from __future__ import annotations

import math
import os

import torch

from ..codegen.linear import ACTIVATION_OPS as _ACTIVATIONS     # ost.linear's activation as an ATen node
from ..ir import Graph, Node, TensorMeta, Value
from ..ir.ops import may_alias
from .fold_residual import accumulate, accumulator, constant, static, sum_before, transpose
from .rewrite import pinned_values, replace_values

_HALF = (torch.float16, torch.bfloat16)
_NORMS = ("ost.rms_norm", "ost.add_rms_norm", "ost.layer_norm")
_CODES = {torch.float16: "f16", torch.bfloat16: "bf16"}
# views a row scale moves past: they keep the rows along dim 0 and the elements in order (a transpose of
# heads and tokens stays after the scale, where the attention looks for the token's rows)
_ROW_VIEWS = {"aten.view", "aten._unsafe_view", "aten.reshape", "aten.unsqueeze", "aten.slice.Tensor"}
_SPLITS = ("aten.split_with_sizes", "aten.split.Tensor")


def fold_enabled() -> bool:
    return os.environ.get("OSTINATO_FOLD_NORMS", "1") != "0"


def fold_key() -> str:
    """What the pass's result depends on besides the graph (the switch, and the rows the matmul groups take,
    OSTINATO_DOT_ROWS): part of the export cache's key where the pipeline holds the pass."""
    from ..codegen.linear import max_rows
    return f"{int(fold_enabled())}-{max_rows('f16')}-{max_rows('bf16')}"


def _projection(node: Node, y: Value, hidden: int) -> tuple[list[Value], list[Value | None], str | None, bool] | None:
    """(the weights, the biases or Nones, the activation after them or None, whether the weights are [hidden, N])
    of a projection of ``y`` this pass folds into (constant [N, hidden] weights of y's dtype, or an
    ``ost.linear``'s [hidden, N] (GPT-2's Conv1D); constant [N] biases of that dtype or none; an
    ``ost.linear``'s activation runs after the row scale), else None."""
    if node.kwargs:
        return None
    activation, transposed = None, False
    if node.op == "ost.linear" and 2 <= len(node.args) <= 5:
        args = list(node.args) + [None, None, False][len(node.args) - 2:]
        if args[3] is not None and args[3] not in _ACTIVATIONS:
            return None
        weights, biases, activation, transposed = [args[1]], [args[2]], args[3], bool(args[4])
    elif node.op == "aten.linear" and len(node.args) in (2, 3):
        weights, biases = [node.args[1]], [node.args[2] if len(node.args) == 3 else None]
    elif node.op == "ost.multi_linear" and len(node.args) == 3:
        weights = list(node.args[1])
        biases = list(node.args[2]) if node.args[2] is not None else [None] * len(weights)
    else:
        return None
    if node.args[0] is not y or len(node.outputs) != len(weights) or len(biases) != len(weights):
        return None
    for w, b in zip(weights, biases):
        if not constant(w, 2) or w.meta.dtype != y.meta.dtype or static(w) is None \
                or w.meta.shape[0 if transposed else 1] != hidden:
            return None
        if b is not None and (not constant(b, 1) or b.meta.dtype != y.meta.dtype
                              or tuple(b.meta.shape) != (w.meta.shape[1 if transposed else 0],)):
            return None
    return weights, biases, activation, transposed


def _row_view(node: Node, rows: int) -> bool:
    """A view that keeps dim 0 as the rows (each output's dim 0 is the input's, and stays first): a reshape,
    an unsqueeze or a slice past dim 0, a split past dim 0 (several outputs: GPT-2's packed q/k/v)."""
    split = node.op in _SPLITS
    if node.kwargs or not node.outputs or (len(node.outputs) != 1 and not split) \
            or (node.op not in _ROW_VIEWS and not split):
        return False
    outs = [static(o) for o in node.outputs]
    if any(o is None or not o or o[0] != rows for o in outs):
        return False
    rank = len(outs[0])
    if node.op == "aten.unsqueeze":
        return node.args[1] % rank != 0
    if node.op == "aten.slice.Tensor":
        return len(node.args) > 1 and node.args[1] % rank != 0
    if split:
        return len(node.args) == 3 and node.args[2] % rank != 0
    return True


def _part(node: Node, k: int, shape: tuple[int, ...]) -> tuple[int, int] | None:
    """The [lo, hi) of its input's row (the elements after dim 0, in order) that output ``k`` of the row view
    ``node`` holds in order, or None where they are not one range (a slice of a dim with others before it)."""
    n = math.prod(shape[1:])
    if node.op not in _SPLITS and node.op != "aten.slice.Tensor":
        return 0, n
    rank = len(shape)
    if node.op == "aten.slice.Tensor":
        args = list(node.args) + [None, None, 1][len(node.args) - 2:]
        d, start, stop, step = args[1] % rank, args[2], args[3], args[4]
        if step != 1:
            return None
        size = shape[d]
        start = 0 if start is None else start + size if start < 0 else start
        stop = size if stop is None else stop + size if stop < 0 else stop
        start, stop = max(0, min(start, size)), max(0, min(stop, size))
    else:
        d = node.args[2] % rank
        if node.op == "aten.split_with_sizes":
            sizes = list(node.args[1])
        else:
            sizes = [min(node.args[1], shape[d] - i) for i in range(0, shape[d], node.args[1])]
        start = sum(sizes[:k])
        stop = start + sizes[k]
    if math.prod(shape[1:d]) != 1:
        return None
    inner = math.prod(shape[d + 1:])
    return start * inner, max(start, stop) * inner


def fold_norms(g: Graph) -> Graph:
    if not fold_enabled():
        return g
    refused: set[int] = set()
    lags: dict[int, tuple] = {}     # a lagging stream's value id -> (its t, the offset, the nodes adding it)
    while True:     # one norm at a time, each seeing the graph the ones before it left (readers, ancestors)
        node = next((n for n in g.nodes if n.op in _NORMS and id(n) not in refused), None)
        if node is None:
            return g
        if not _fold(g, node, lags):
            refused.add(id(node))


def _norm_args(node: Node, shape) -> tuple | None:
    """(its input or None for add_rms_norm, weight or None, its shift or None, eps, offset, LayerNorm's?) of
    a norm this pass folds: constant 1-d weight and shift as wide as its rows (an RMSNorm has a weight), a
    LayerNorm computed in its rows' dtype or fp32 (torch's kernels compute in fp32 either way)."""
    args = list(node.args)
    if node.op == "ost.layer_norm":
        args += [None] * (5 - len(args))
        x, w, shift, eps, compute = args[:5]
        if compute not in (None, torch.float32) or shift is not None and not _weight_like(shift, shape):
            return None
        offset, layer = 0.0, True
    else:
        args += [None, 0.0, False]
        add = node.op == "ost.add_rms_norm"
        x, w, eps, offset = (None, args[2], args[3], args[5]) if add else (args[0], args[1], args[2], args[4])
        shift, layer, offset = None, False, offset or 0.0
        if w is None:
            return None
    if w is not None and not _weight_like(w, shape) or not isinstance(eps, (int, float)) \
            or not isinstance(offset, (int, float)):
        return None
    return x, w, shift, float(eps), float(offset), layer


def _weight_like(v, shape) -> bool:
    return constant(v, 1) and tuple(v.meta.shape) == (shape[-1],)


def _fold(g: Graph, node: Node, lags: dict) -> bool:
    """Fold one norm (the module's conditions); whether it did."""
    if node.kwargs:
        return False
    users = g.users()
    pinned = pinned_values(g)
    y = node.outputs[1] if node.op == "ost.add_rms_norm" else node.outputs[0]
    shape = static(y)
    from ..codegen.linear import max_rows       # (OSTINATO_DOT_ROWS: matmul groups then take more rows)
    if shape is None or y.meta.dtype not in _HALF or len(shape) < 2 or shape[0] <= max_rows(_CODES[y.meta.dtype]) \
            or math.prod(shape[1:-1]) != 1 or y.id in pinned:
        return False
    parsed = _norm_args(node, shape)
    if parsed is None:
        return False
    x_in, w, shift, eps, offset, layer = parsed
    readers = users.get(y.id, [])
    projections = [(p, _projection(p, y, shape[-1])) for p in readers]
    if not readers or any(wb is None for _, wb in projections) or len({id(p) for p in readers}) != len(readers):
        return False
    ends = [e for p, _ in projections for o in p.outputs for e in _ends(o, users, pinned, shape[0])]
    if any(e.id in pinned for e in ends):
        return False        # a result the graph returns (an LM head's logits): its row scale would launch alone
    biased = shift is not None or any(b is not None for _, (_, biases, _, _) in projections for b in biases)
    if biased and not all(_bias_carried(o, users, pinned, shape[0]) for p, _ in projections for o in p.outputs):
        return False        # a bias a slice or a packed gating would cut
    if any(_concatenated(e, users) for e in ends):
        return False        # a cache grown by concatenation: no decode attention takes the row scales, which
        #                     would each launch alone (transformers 5.17's OPT: 122 kernels a step against 94)
    before: dict[int, list[Node]] = {}      # node id -> new nodes placed before it
    after: dict[int, list[Node]] = {}       # node id -> new nodes placed after it
    dead = {id(node)}
    mapping: dict[int, Value] = {}
    fixups: list[tuple[Node, tuple]] = []   # nodes whose arguments replace_values must not rewrite
    # the sum before the norm: ost.add_rms_norm's own, or an aten.add making its input (through reshapes: OPT's)
    add = node if x_in is None else sum_before(x_in)
    summed = shape if add is node or add is None else static(add.outputs[0])
    if add is not None and add is not node and (add.kwargs or len(add.args) != 2 or add.outputs[0].id in pinned
                                                or summed is None or math.prod(summed) != math.prod(shape)):
        return False        # (a scaled or broadcast add, or a sum the graph returns: it would stay a launch)
    if x_in is not None and (static(x_in) != shape or x_in.meta.dtype != y.meta.dtype):
        return False
    s = x_in        # the norm's input (an aten.add's sum or a reshape of it: it then reads the accumulation)
    lag = None      # the offset the accumulated stream lags the sum by (biased projections' biases)
    if add is not None:
        found = accumulator(g, add, summed, y.meta.dtype, users, pinned, lags)
        if found is None:
            return False        # the add would stay a launch: nothing saved
        lagging = found[0][4] is not None or found[2] is not None
        if lagging and not all(_part_carried(o, users, pinned, shape[0]) for p, _ in projections for o in p.outputs):
            return False        # (the pre-scale bias would be cut where a view's elements are no one range)
        taken = accumulate(g, node, add, x_in, found, shape, users, pinned, lags, before, dead, mapping)
        if taken is None:
            return False
        s, lag = taken
    for p, (weights, biases, activation, transposed) in projections:
        if transposed:      # ([hidden, N] weights: their [N, hidden] views, which the folds read)
            weights = [transpose(g, wt, p, before) for wt in weights]
        splits = [int(wt.meta.shape[0]) for wt in weights]
        if biased:      # (fp32: the shift through the weights plus the projection's own bias; zeros for one
            folded = []     # with neither, as its biased siblings' kernel reads three)
            for k, (wt, b) in enumerate(zip(weights, biases)):
                if shift is None and b is not None:
                    folded.append(b)
                    continue
                fb = Node("ost.fold_bias", (wt, shift, b), {}, f"{p.name}_bias{k}", p.source)
                fb.outputs = [g.new_value(fb.name, TensorMeta(torch.float32, (splits[k],)), "temp", fb)]
                before.setdefault(id(p), []).append(fb)
                folded.append(fb.outputs[0])
            biases = folded
        fw = Node("ost.fold_weights", (list(weights), w, offset, *((True,) if layer else ())), {},
                  f"{p.name}_folded", p.source)
        fw.outputs = [g.new_value(fw.name, TensorMeta(y.meta.dtype, (sum(splits), shape[-1])), "temp", fw)]
        before.setdefault(id(p), []).append(fw)
        pres: list = [None] * len(splits)
        if lag is not None:     # (t + lag) @ F^T = t @ F^T + F @ lag: the row scales add the constant F @ lag
            sb = Node("ost.fold_bias", (fw.outputs[0], lag, None), {}, f"{p.name}_lag", p.source)
            sb.outputs = [g.new_value(sb.name, TensorMeta(torch.float32, (sum(splits),)), "temp", sb)]
            before[id(p)].append(sb)
            pres = [sb.outputs[0]] if len(splits) == 1 else \
                [_cut(g, sb.outputs[0], sum(splits[:k]), sum(splits[:k + 1]), p, before) for k in range(len(splits))]
        lo = Node("ost.linear_out", (s, fw.outputs[0], splits, torch.float32), {}, f"{p.name}_f32", p.source)
        lo.outputs = [g.new_value(f"{lo.name}.{k}", TensorMeta(torch.float32, (*shape[:-1], n)), "temp", lo)
                      for k, n in enumerate(splits)]
        before[id(p)].append(lo)
        dead.add(id(p))
        for old, new, bias, pre in zip(p.outputs, lo.outputs, biases, pres):
            _scale_after_views(g, p, old, new, s, eps, bias, layer, activation, shape[0], users, pinned, mapping,
                               after, fixups, lag, pre)
    nodes: list[Node] = []
    for n in g.nodes:
        nodes.extend(before.get(id(n), ()))
        if id(n) not in dead:
            nodes.append(n)
        nodes.extend(after.get(id(n), ()))
    g.nodes = nodes
    replace_values(g, mapping)
    for n, a in fixups:
        n.args = a
    return True


def _cut(g: Graph, v: Value, lo: int, hi: int, at: Node, place: dict) -> Value:
    """The 1-d ``v``'s elements [lo, hi), a view placed with ``at``'s new nodes in ``place``."""
    cut = Node("aten.slice.Tensor", (v, 0, lo, hi), {}, f"{v.name}_{lo}_{hi}", at.source)
    cut.outputs = [g.new_value(cut.name, TensorMeta(v.meta.dtype, (hi - lo,)), "temp", cut)]
    place.setdefault(id(at), []).append(cut)
    return cut.outputs[0]


def _concatenated(v: Value, users: dict) -> bool:
    """Whether ``v`` or a view of it (a transpose to heads first) is an operand of an ``aten.cat`` along a dim
    other than the last (a cache grown by its new rows; a partial rope's cat of the head dims is the
    attention's)."""
    for u in users.get(v.id, ()):
        if u.op == "aten.cat":
            rank = u.outputs[0].meta.rank if u.outputs and isinstance(u.outputs[0].meta, TensorMeta) else 0
            dim = (u.args[1] if len(u.args) > 1 else u.kwargs.get("dim", 0)) if rank else 0
            if not rank or dim % rank != rank - 1:
                return True
            continue
        if may_alias(u.op) and any(o is not None and _concatenated(o, users) for o in u.outputs):
            return True
    return False


_PACKED = {"ost.swiglu_packed": "ost.swiglu", "ost.geglu_packed": "ost.geglu"}


def _ends(v: Value, users: dict, pinned: set[int], rows: int) -> list[Value]:
    """The values at the ends of the row-keeping views that read ``v`` (``v`` itself when none does)."""
    readers = users.get(v.id, [])
    if v.id in pinned or not readers or not all(_row_view(r, rows) for r in readers):
        return [v]
    return [e for r in readers for o in r.outputs for e in _ends(o, users, pinned, rows)]


def _part_carried(v: Value, users: dict, pinned: set[int], rows: int, gating: bool = True) -> bool:
    """Whether each end of the row-keeping views reading ``v`` holds one range of its row's elements, in
    order (``_part`` of every view on the way): a vector laid out along the row (a pre-scale bias) can be
    cut to it. ``gating`` False: also no packed gating reads an end (``_bias_carried``)."""
    readers = users.get(v.id, [])
    if v.id in pinned or not readers or not all(_row_view(r, rows) for r in readers):
        return gating or not (len(readers) == 1 and readers[0].op in _PACKED)
    shape = static(v)
    return all(_part(r, k, shape) is not None and _part_carried(o, users, pinned, rows, gating)
               for r in readers for k, o in enumerate(r.outputs))


def _bias_carried(v: Value, users: dict, pinned: set[int], rows: int) -> bool:
    """Whether a bias of ``v`` (a projection's result) can be the row scale's at each end of its views: each
    end holds one range of a row's elements in order (a slice or split of the last dims: the bias's same
    range), and no packed gating reads an end (the bias comes after the scale, the gating's halves' too)."""
    return _part_carried(v, users, pinned, rows, gating=False)


def _scale_after_views(g: Graph, anchor: Node, old: Value, new: Value, x: Value, eps: float, bias: Value | None,
                       center: bool, activation: str | None, rows: int, users: dict, pinned: set[int], mapping: dict,
                       after: dict, fixups: list, shift: Value | None = None, pre: Value | None = None) -> None:
    """Read ``new`` (the fp32 product) where ``old`` (the projection ``anchor``'s result) was read: through the
    row-keeping views that read it (each branch of a packed projection's slices), now over fp32 values, then
    ``ost.row_scale`` back to old's dtype at the end of each branch (the statistic of ``x + shift`` with a
    ``shift``: a lagging stream's, ``pre`` added before the scale), adding the projection's ``bias`` (its
    views keep a row's elements in order: ``_bias_carried``). A packed gating (``swiglu_packed``) reading a
    branch's end becomes the gating of its two halves' row scales, which a generated group takes whole."""
    dtype = old.meta.dtype
    mapping[old.id] = new

    def scale(end: Value, at: Node, name: str, part: tuple[int, int] | None) -> Value:
        # (the bias and the pre-scale bias of the range of the row ``end`` holds)
        if part is None and (bias is not None or pre is not None):
            raise AssertionError(f"fold_norms: {name}'s bias would be cut where its row is no one range")
        b, c = ((t if t is None or part == (0, t.meta.shape[0]) else _cut(g, t, part[0], part[1], at, after))
                for t in (bias, pre))
        tail = (b, center, shift, c) if shift is not None else (b, True) if center else () if b is None \
            else (b,)
        node = Node("ost.row_scale", (end, x, eps, dtype, *tail), {}, f"{name}_scaled", "")
        node.outputs = [g.new_value(node.name, TensorMeta(dtype, tuple(end.meta.shape)), "temp", node)]
        fixups.append((node, node.args))
        after.setdefault(id(at), []).append(node)
        if activation is None:
            return node.outputs[0]
        op, kwargs = _ACTIVATIONS[activation]       # (pointwise: after the views as well as before them)
        act = Node(op, (node.outputs[0],), dict(kwargs), f"{name}_{activation}", anchor.source)
        act.outputs = [g.new_value(act.name, TensorMeta(dtype, tuple(end.meta.shape)), "temp", act)]
        fixups.append((act, act.args))
        after[id(at)].append(act)
        return act.outputs[0]

    def place(v: Value, end: Value, at: Node, part: tuple[int, int] | None) -> None:
        """``v``: the value as the graph has it (read by its old readers); ``end``: what now holds it in fp32;
        ``part``: the range of the product's row it holds (``_part``)."""
        readers = users.get(v.id, [])
        if v.id not in pinned and readers and all(_row_view(r, rows) for r in readers):
            shape = static(v)
            for r in readers:
                for k, out in enumerate(r.outputs):
                    rng = _part(r, k, shape)    # (None only with no bias nor pre: _bias_carried, _part_carried)
                    out.meta = TensorMeta(torch.float32, tuple(out.meta.shape))
                    place(out, out, r, None if rng is None or part is None else (part[0] + rng[0], part[0] + rng[1]))
            return
        width = end.meta.shape[-1]
        if v.id not in pinned and len(readers) == 1 and readers[0].op in _PACKED and width % 2 == 0 \
                and readers[0].args[:1] == (v,) and not readers[0].kwargs:
            gate = readers[0]
            halves = []
            for k, (lo, hi) in enumerate(((0, width // 2), (width // 2, width))):
                cut = Node("aten.slice.Tensor", (end, -1, lo, hi), {}, f"{end.name}_half{k}", gate.source)
                cut.outputs = [g.new_value(cut.name, TensorMeta(torch.float32, (*end.meta.shape[:-1], width // 2)),
                                           "temp", cut)]
                after.setdefault(id(at), []).append(cut)
                sub = None if part is None else (part[0] + lo, part[0] + hi)
                halves.append(scale(cut.outputs[0], at, cut.name, sub))
            gate.op = _PACKED[gate.op]
            gate.args = (*halves, *gate.args[1:])
            fixups.append((gate, gate.args))
            return
        mapping[v.id] = scale(end, at, end.name, part)

    place(old, new, anchor, (0, math.prod(old.meta.shape[1:])))


