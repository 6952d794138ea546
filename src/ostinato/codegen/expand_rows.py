"""Reductions and the ops built on them as primitives (see expand.py): sums, means, amax/amin, var,
softmax and log-softmax, and the norms (ost.rms_norm / ost.add_rms_norm, layer norm in its ATen and
fused forms, group norm over a split dim). Registered into expand.HANDLERS on import."""
from __future__ import annotations

from ..ir import Node, Value
from .expand import Builder, Kind, NotFusible, _f, _out, code_of, handles
from .prims import DTYPE_CODES, FLOATS, compute_code


# -- reductions ------------------------------------------------------------------------------------
def _dims(x: Value, dims) -> tuple[int, ...] | None:
    rank = x.meta.rank
    if dims is None or dims == []:
        return tuple(range(rank))
    if isinstance(dims, int):
        dims = [dims]
    if not all(isinstance(d, int) for d in dims):
        return None
    return tuple(sorted({d % rank for d in dims})) if rank else None


def _reduction_kind(dims_at: int, keepdim_at: int | None, keep_kw: str = "keepdim"):
    def kind(node: Node) -> Kind | None:
        x = node.args[0]
        if not isinstance(x, Value) or code_of(x) not in FLOATS or x.meta.rank == 0:
            return None
        dims = node.args[dims_at] if len(node.args) > dims_at else node.kwargs.get("dim")
        red = _dims(x, dims)
        if red is None:
            return None
        keep = node.kwargs.get(keep_kw, node.args[keepdim_at] if keepdim_at is not None and len(node.args) > keepdim_at
                               else False)
        if node.kwargs.get("dtype") is not None:
            return None
        return Kind(red, x, bool(keep))
    return kind


@handles("aten.sum.dim_IntList", "aten.mean.dim", kind=_reduction_kind(1, 2))
def _sum_mean(b: Builder, node: Node):
    code = _out(node)
    x = _f(b, b.value(node.args[0]), code)
    s = b.emit("sum", compute_code(code), x)
    if node.op == "aten.mean.dim":
        s = b.emit("div", compute_code(code), s, b.rnumel())
    return [b.cast(s, code)]


@handles("aten.amax", "aten.amin", kind=_reduction_kind(1, 2))
def _amax(b: Builder, node: Node):
    code = _out(node)
    x = _f(b, b.value(node.args[0]), code)
    return [b.cast(b.emit("rmax" if node.op == "aten.amax" else "rmin", compute_code(code), x), code)]


@handles("aten.var.correction", kind=_reduction_kind(1, None))
def _var(b: Builder, node: Node):
    code = _out(node)
    ct = compute_code(code)
    correction = node.kwargs.get("correction", 1)
    correction = 1 if correction is None else correction
    x = _f(b, b.value(node.args[0]), code)
    n = b.rnumel()
    d = b.emit("sub", ct, x, b.emit("div", ct, b.emit("sum", ct, x), n))
    v = b.emit("div", ct, b.emit("sum", ct, b.emit("mul", ct, d, d)), b.emit("sub", ct, n, b.const(float(correction), ct)))
    return [b.cast(v, code)]


def _softmax_kind(node: Node) -> Kind | None:
    x = node.args[0]
    if not isinstance(x, Value) or code_of(x) not in FLOATS or x.meta.rank == 0 or not isinstance(node.args[1], int):
        return None
    return Kind((node.args[1] % x.meta.rank,), x, True)


@handles("aten._softmax", "aten._log_softmax", kind=_softmax_kind)
def _softmax(b: Builder, node: Node):
    code = _out(node)
    ct = compute_code(code)
    x = _f(b, b.value(node.args[0]), code)
    m = b.emit("rmax", ct, x)
    shifted = b.emit("sub", ct, x, m)
    s = b.emit("sum", ct, b.emit("exp", ct, shifted))
    if node.op == "aten._softmax":
        return [b.cast(b.emit("div", ct, b.emit("exp", ct, shifted), s), code)]
    return [b.cast(b.emit("sub", ct, shifted, b.emit("log", ct, s)), code)]


def _last_dim_kind(node: Node) -> Kind | None:
    x = node.args[0]
    if not isinstance(x, Value) or code_of(x) not in FLOATS or x.meta.rank == 0:
        return None
    return Kind((x.meta.rank - 1,), x, True)


def _rms(b: Builder, x: int, node: Node, wi: int, out_code: str) -> int:
    """ost.rms_norm's reference (ir/fused_ops.rms_norm), rounding where it rounds; ``x`` is its input."""
    args = list(node.args) + [None] * 8
    weight, eps, compute_dtype = args[wi], args[wi + 1], args[wi + 2]
    offset = args[wi + 3] or 0.0
    weight_first = bool(args[wi + 4])
    xc = b.code(x)
    hd = DTYPE_CODES.get(compute_dtype) if compute_dtype is not None else xc
    if hd not in FLOATS:
        raise NotFusible("rms_norm compute dtype")
    h = b.cast(x, hd) if hd != xc else x
    hf = _f(b, h, hd)
    sq = b.emit("mul", hd, hf, hf)
    mean = b.emit("div", hd, b.emit("sum", compute_code(hd), sq), b.rnumel())
    scale = b.emit("rsqrt", hd, b.emit("add", hd, mean, b.const(float(eps), compute_code(hd))))
    w = None
    if weight is not None:
        w = b.value(weight)
        wc = b.code(w)
        if offset:
            w = b.emit("add", hd if weight_first else wc, _f(b, b.cast(w, hd) if weight_first else w, wc),
                       b.const(float(offset), compute_code(hd)))
    if weight_first:
        h = b.emit("mul", hd, hf, scale)
        if w is not None:
            h = b.emit("mul", hd, h, _f(b, b.cast(w, hd), hd))
        return b.cast(h, out_code)
    h = b.emit("mul", hd, hf, scale)
    if compute_dtype is not None:
        h = b.cast(h, xc)
    if w is None:
        return b.cast(h, out_code)
    return b.emit("mul", out_code, _f(b, h, out_code), _f(b, w, out_code))


def _row_scale_kind(node: Node) -> Kind | None:
    """ost.row_scale as a reduction over its product's rows: their width N is walked, and ``x``'s row (H <= N
    wide, its rows along dim 0 as the product's) is read where the coordinate is below H (a gather)."""
    p, x = node.args[0], node.args[1]
    bias = node.args[4] if len(node.args) > 4 else None
    if not (isinstance(p, Value) and isinstance(x, Value)) or code_of(p) not in FLOATS or code_of(x) not in FLOATS:
        return None
    ps, xs = tuple(p.meta.shape), tuple(x.meta.shape)
    if not ps or len(xs) != len(ps) or not all(isinstance(d, int) for d in ps + xs) or xs[0] != ps[0] \
            or xs[-1] > ps[-1] or any(d != 1 for d in xs[1:-1]):
        return None
    if bias is not None and not (isinstance(bias, Value) and code_of(bias) in FLOATS
                                 and tuple(bias.meta.shape) == ps[-1:] and all(d == 1 for d in ps[1:-1])):
        return None     # (a bias over a row of several dims: the library kernel takes it)
    shift = node.args[6] if len(node.args) > 6 else None
    if shift is not None and not (isinstance(shift, Value) and code_of(shift) in FLOATS
                                  and tuple(shift.meta.shape) == xs[-1:]):
        return None
    pre = node.args[7] if len(node.args) > 7 else None
    if pre is not None and not (isinstance(pre, Value) and code_of(pre) in FLOATS
                                and tuple(pre.meta.shape) == ps[-1:] and all(d == 1 for d in ps[1:-1])):
        return None
    return Kind((len(ps) - 1,), p, True)


@handles("ost.row_scale", kind=_row_scale_kind)
def _row_scale(b: Builder, node: Node):
    """ost.row_scale (ir/fold_ops.py): p * rsqrt(mean(x ** 2) + eps) (+ bias) in fp32, rounded to its dtype;
    ``center``: LayerNorm's statistic, x less its mean (the coordinates past x's width masked to 0);
    ``shift``: the statistic of x + shift (both gathered, 0 past their width), ``pre`` added to p first."""
    p, x, eps = node.args[:3]
    bias = node.args[4] if len(node.args) > 4 else None
    center = bool(node.args[5]) if len(node.args) > 5 else False
    shift = node.args[6] if len(node.args) > 6 else None
    index = b.rindex()
    xv = b._push(["gather", code_of(x), "x", b.gathered(x, x.meta.rank - 1), index])
    xf = _f(b, xv, "f32")
    if shift is not None:       # (the statistic of x + shift: a residual stream lagging its biases)
        sv = b._push(["gather", code_of(shift), "x", b.gathered(shift, 0), index])
        xf = b.emit("add", "f32", xf, _f(b, sv, "f32"))
    width = b.const(float(x.meta.shape[-1]), "f32")
    if center:
        mean = b.emit("div", "f32", b.emit("sum", "f32", xf), width)
        inside = b.emit("lt", "bool", index, b.const(int(x.meta.shape[-1]), "i64"))
        xf = b.emit("where", "f32", inside, b.emit("sub", "f32", xf, mean), b.const(0.0, "f32"))
    var = b.emit("div", "f32", b.emit("sum", "f32", b.emit("mul", "f32", xf, xf)), width)
    scale = b.emit("rsqrt", "f32", b.emit("add", "f32", var, b.const(float(eps), "f32")))
    pv = _f(b, b.value(p), "f32")
    pre = node.args[7] if len(node.args) > 7 else None
    if pre is not None:         # (the shift through the weights, before the scale)
        pv = b.emit("add", "f32", pv, _f(b, b.value(pre), "f32"))
    h = b.emit("mul", "f32", pv, scale)
    if bias is not None:
        h = b.emit("add", "f32", h, _f(b, b.value(bias), "f32"))
    return [b.cast(h, _out(node))]


@handles("ost.rms_norm", kind=_last_dim_kind)
def _rms_norm(b: Builder, node: Node):
    return [_rms(b, b.value(node.args[0]), node, 1, _out(node))]


@handles("ost.add_rms_norm", kind=_last_dim_kind)
def _add_rms_norm(b: Builder, node: Node):
    sc = _out(node, 0)
    s = b.emit("add", sc, _f(b, b.value(node.args[0]), sc), _f(b, b.value(node.args[1]), sc))
    return [s, _rms(b, s, node, 2, _out(node, 1))]


def _aten_layer_norm_kind(node: Node) -> Kind | None:
    x, shape = node.args[0], node.args[1]
    if not isinstance(x, Value) or code_of(x) not in FLOATS or not isinstance(shape, (list, tuple)) \
            or not 0 < len(shape) <= x.meta.rank:
        return None
    return Kind(tuple(range(x.meta.rank - len(shape), x.meta.rank)), x, True)


@handles("aten.layer_norm", "aten.native_layer_norm", kind=_aten_layer_norm_kind)
def _aten_layer_norm(b: Builder, node: Node):
    args = list(node.args) + [None] * 4
    eps = args[4] if args[4] is not None else node.kwargs.get("eps", 1e-5)
    y = _normalize(b, node.args[0], args[2], args[3], eps, _out(node), None)
    return [y] if node.op == "aten.layer_norm" else [y, None, None]


def _group_norm_kind(node: Node) -> Kind | None:
    x, groups = node.args[0], node.args[6] if len(node.args) > 6 else None
    if not isinstance(x, Value) or code_of(x) not in FLOATS or x.meta.rank < 2 or not isinstance(groups, int) \
            or not isinstance(x.meta.shape[1], int) or x.meta.shape[1] % groups:
        return None
    return Kind(tuple(range(2, x.meta.rank + 1)), x, True, (1, groups))


@handles("aten.native_group_norm", kind=_group_norm_kind)
def _group_norm(b: Builder, node: Node):
    x, weight, bias = node.args[:3]
    eps = node.args[7]
    return [_normalize(b, x, weight, bias, eps, _out(node), None, unsq=x.meta.rank - 2), None, None]


@handles("ost.layer_norm", kind=_last_dim_kind)
def _layer_norm(b: Builder, node: Node):
    args = list(node.args) + [None] * 4
    _, weight, bias, eps, compute_dtype = args[:5]
    return [_normalize(b, node.args[0], weight, bias, eps, _out(node), compute_dtype)]


def _normalize(b: Builder, x: Value, weight, bias, eps: float, code: str, compute_dtype, unsq: int = 0) -> int:
    """(x - mean) * rsqrt(var + eps) * weight + bias over the group's reduced dims, in fp32 (torch's
    layer and group norm kernels), rounded once to ``compute_dtype`` and then ``code``."""
    hd = DTYPE_CODES.get(compute_dtype) if compute_dtype is not None else code
    ct = compute_code(hd)
    h = _f(b, b.value(x), hd)
    n = b.rnumel()
    d = b.emit("sub", ct, h, b.emit("div", ct, b.emit("sum", ct, h), n))
    var = b.emit("div", ct, b.emit("sum", ct, b.emit("mul", ct, d, d)), n)
    y = b.emit("mul", ct, d, b.emit("rsqrt", ct, b.emit("add", ct, var, b.const(float(eps), ct))))
    if weight is not None:
        y = b.emit("mul", ct, y, _f(b, b.value(weight, unsq), hd))
    if bias is not None:
        y = b.emit("add", ct, y, _f(b, b.value(bias, unsq), hd))
    return b.cast(b.cast(y, hd), code)
