"""``ost.rope`` through ``mx.fast.rope`` where that is provably what the model computes.

``ost.rope(x, cos, sin)`` takes the tables the model built; ``mx.fast.rope`` builds its own, as
``theta = (offset + row) * (1 / freqs[i])`` in float32. The two agree when the tables are the HF
recipe with contiguous positions, which lowering proves from the graph (``fast_rope_kwargs``):

- ``cos = cos(E) [* s]``, ``sin = sin(E) [* s]`` over the same ``E`` (and the same python ``s``),
  then optionally a cast, unsqueezes and expands;
- ``E = cat([F, F], -1)`` (rotate_half, ``interleaved=False``) or ``repeat_interleave(F, 2, -1)``
  (``interleaved=True``, ``traditional=True`` in MLX);
- ``F = float32(P[..., None]) * inv`` with ``inv`` a 1-D constant of ``d / 2`` entries (float32, or
  a half type widened to float32);
- ``P = arange(a, a + L) + offset`` (``offset`` a scalar: an int, a symbolic int or a one-element
  integer tensor such as transformers' ``cumulative_length`` or ostinato.llm's ``pos``), then
  unsqueezes and expands. Positions that are anything else (a model input, a gather, ...) are not
  proven: that rope stays elementwise.

What lowering cannot see is ``inv``'s values: MLX takes ``freqs`` and uses ``1 / freqs``, so the angle
is the model's only if some float32 ``f`` has ``fl(1 / f) == inv[i]`` exactly, for every ``i``.
``exact_freqs`` finds those ``f`` (or says there are none: that rope stays elementwise) once per
weight array, on concrete values; replay bakes the arrays into its compiled functions for that reason
(replay.py). The remaining differences are cos/sin's own rounding (an ulp or two in float32) and, in
float16/bfloat16, that MLX applies the float32 tables to ``x`` in float32 and rounds once, where the
model rounds the tables and each product to the half type first.

On Metal nothing is proven: the kernel takes ``metal::fast::cos/sin`` (an absolute error up to 2^-13
for |theta| <= pi, unspecified beyond; float32's tolerance is 1e-5) and inverts ``freqs`` with a
division the Metal compiler may compute inexactly (fast math), which moves the angle by up to
``position * 1e-7``-ish. So on the GPU every rope stays elementwise unless ``METAL_FAST_ROPE`` is set
(for float16/bfloat16 only), which no test here can check (CI has no Metal).
"""
from __future__ import annotations

import hashlib
import threading
from pathlib import Path
from typing import Any

import numpy as np
import torch

import mlx.core as mx

from ...ir import Node, ScalarMeta, TensorMeta, Value

# Use mx.fast.rope on Metal for float16/bfloat16 ropes (unproven there: see the module docstring).
METAL_FAST_ROPE = False

# A digest of this file: part of the plan cache's key (backend.plan_key_parts), since cached plans keep
# the keywords this proof wrote.
ROPE_PROOF = hashlib.sha256(Path(__file__).read_bytes()).hexdigest()[:16]

# -- proof from the graph ----------------------------------------------------------------------------
_INT_DTYPES = (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8)


def _arg(node: Node, i: int, name: str, default: Any = None) -> Any:
    if name in node.kwargs:
        return node.kwargs[name]
    return node.args[i] if len(node.args) > i else default


def _tensor(v: Any) -> bool:
    return isinstance(v, Value) and isinstance(v.meta, TensorMeta)


def _rank(v: Value) -> int:
    return v.meta.rank


def _through_views(v: Value, allow_cast: bool) -> tuple[Value, list[Node]]:
    """``v``'s producer chain up through unsqueeze / expand (and casts when ``allow_cast``): the value
    they start from and the ops, outermost last."""
    ops: list[Node] = []
    while _tensor(v) and v.producer is not None:
        n = v.producer
        if n.op in ("aten.unsqueeze", "aten.expand") or (allow_cast and n.op == "aten._to_copy"
                                                         and set(n.kwargs) <= {"dtype"}
                                                         and v.meta.dtype.is_floating_point):
            ops.append(n)
            v = n.args[0]
            if not _tensor(v):
                return v, []
            continue
        break
    ops.reverse()
    return v, ops


def _map_axis(axis: int, ops: list[Node]) -> int | None:
    """Where the root's ``axis`` lands after ``ops`` (unsqueeze / expand / cast), or None."""
    for n in ops:
        src, out = n.args[0], n.outputs[0]
        if n.op == "aten.unsqueeze":
            d = _arg(n, 1, "dim", 0)
            if type(d) is not int:
                return None
            d = d % _rank(out)
            axis = axis + 1 if d <= axis else axis
        elif n.op == "aten.expand":
            # New leading dims; the mapped axis must keep its size (-1 or the same symbol/int).
            lead = _rank(out) - _rank(src)
            axis += lead
            sizes = _arg(n, 1, "size", [])
            if str(out.meta.shape[axis]) != str(src.meta.shape[axis - lead]):
                return None
            if not isinstance(sizes, (list, tuple)):
                return None
    return axis


def _positions(p: Value) -> tuple[Any, int] | None:
    """``p`` = ``arange(a, a + L) + offset`` through unsqueezes/expands: (offset, p's sequence axis).
    ``offset`` is an int or a Value (a symbolic int or a 0-d integer tensor)."""
    root, ops = _through_views(p, allow_cast=False)
    if not _tensor(root) or root.producer is None or _rank(root) != 1 or root.meta.dtype not in _INT_DTYPES:
        return None
    node = root.producer
    offset: Any = 0
    if node.op == "aten.add.Tensor" and len(node.args) == 2 and node.kwargs in ({}, {"alpha": 1}):
        a, b = node.args
        if _is_arange(b) and not _is_arange(a):
            a, b = b, a
        if not _is_arange(a) or not _scalar_int(b):
            return None
        offset, node = b, a.producer
    elif not _is_arange(root):
        return None
    start = _arange_start(node)
    if start is None:
        return None
    if start:
        if not (isinstance(offset, int)):
            return None   # a non-zero start plus a tensor offset: not worth another form
        offset += start
    axis = _map_axis(0, ops)
    return None if axis is None else (offset, axis)


def _is_arange(v: Any) -> bool:
    n = v.producer if isinstance(v, Value) else None
    return n is not None and n.op in ("aten.arange.start_step", "aten.arange.start", "aten.arange.default",
                                      "aten.arange") and _arange_start(n) is not None


def _arange_start(n: Node) -> int | None:
    if n.op in ("aten.arange", "aten.arange.default"):
        return 0
    start = _arg(n, 0, "start", 0)
    step = _arg(n, 2, "step", 1) if n.op == "aten.arange.start_step" else 1
    if type(start) is not int or step != 1:
        return None
    return start


def _scalar_int(v: Any) -> bool:
    if type(v) is int:
        return True
    if isinstance(v, Value) and isinstance(v.meta, ScalarMeta):
        return v.meta.kind is int
    # A 0-d integer tensor, or a one-element one (ostinato.llm's ``pos``: [1]) broadcast over the arange.
    return _tensor(v) and _rank(v) <= 1 and all(str(d) == "1" for d in v.meta.shape) \
        and v.meta.dtype in _INT_DTYPES


def _angles(e: Value, interleaved: bool) -> tuple[Value, Any, int] | None:
    """``e`` = ``cat([F, F], -1)`` / ``repeat_interleave(F, 2, -1)`` with ``F = float(P[..., None]) *
    inv``: (inv, offset, e's sequence axis)."""
    n = e.producer
    if n is None:
        return None
    if interleaved:
        if n.op != "aten.repeat_interleave.self_int" or _arg(n, 1, "repeats") != 2 \
                or _arg(n, 2, "dim") not in (-1, _rank(e) - 1) or n.kwargs.get("output_size") not in (None,):
            return None
        f = n.args[0]
    else:
        parts = _arg(n, 0, "tensors")
        if n.op != "aten.cat" or not isinstance(parts, (list, tuple)) or len(parts) != 2 \
                or parts[0] is not parts[1] or _arg(n, 1, "dim", 0) not in (-1, _rank(e) - 1):
            return None
        f = parts[0]
    mul = f.producer if _tensor(f) else None
    if mul is None or mul.op != "aten.mul.Tensor" or len(mul.args) != 2 or mul.kwargs or f.meta.dtype != torch.float32:
        return None
    for pf, inv in (mul.args, mul.args[::-1]):
        inv = _constant_freqs(inv)
        if not (inv is not None and _tensor(pf) and pf.meta.dtype == torch.float32 and _rank(pf) >= 2
                and str(pf.meta.shape[-1]) == "1" and _rank(f) == _rank(pf)):
            continue
        # pf = float(P[..., None]): casts and unsqueezes above an integer position tensor.
        root, ops = _through_views(pf, allow_cast=True)
        casts = [o for o in ops if o.op == "aten._to_copy"]
        if len(casts) != 1 or _arg(casts[0], 1, "dtype", casts[0].kwargs.get("dtype")) != torch.float32:
            continue
        pos = _positions_through(root, ops)
        if pos is None:
            continue
        offset, axis = pos
        if axis == _rank(pf) - 1:
            continue      # the positions must not lie along the frequency axis
        return inv, offset, axis
    return None


def _constant_freqs(v: Any) -> Value | None:
    """``v`` = a 1-D float constant, or its exact widening to float32 (a half model's
    ``inv_freq.float()``): the constant."""
    if _tensor(v) and v.producer is not None and v.producer.op == "aten._to_copy" \
            and set(v.producer.kwargs) <= {"dtype", "device"} and v.meta.dtype == torch.float32:
        v = v.producer.args[0]
    if _tensor(v) and v.role == "constant" and _rank(v) == 1 \
            and v.meta.dtype in (torch.float32, torch.float16, torch.bfloat16):
        return v
    return None


def _positions_through(root: Value, ops: list[Node]) -> tuple[Any, int] | None:
    p = _positions(root)
    if p is None:
        return None
    offset, axis = p
    axis = _map_axis(axis, ops)
    return None if axis is None else (offset, axis)


def _table(t: Any, interleaved: bool, fn: str) -> tuple[Value, Any, int, float] | None:
    """``t`` = ``fn(E) [* s]`` (then casts, unsqueezes, expands): (inv, offset, t's seq axis, s)."""
    if not _tensor(t):
        return None
    root, ops = _through_views(t, allow_cast=True)
    scale = 1.0
    n = root.producer if _tensor(root) else None
    if n is not None and n.op == "aten.mul.Tensor" and len(n.args) == 2 and type(n.args[1]) in (int, float):
        scale, root = float(n.args[1]), n.args[0]
        n = root.producer if _tensor(root) else None
    if n is None or n.op != fn or not _tensor(n.args[0]) or root.meta.dtype != torch.float32:
        return None
    a = _angles(n.args[0], interleaved)
    if a is None:
        return None
    inv, offset, axis = a
    axis = _map_axis(axis, ops)
    return None if axis is None else (inv, offset, axis, scale)


def fast_rope_kwargs(node: Node) -> dict[str, Any]:
    """The extra keywords of an ``ost.rope`` launch that let its handler use ``mx.fast.rope`` (empty
    when the graph does not prove the tables are mx.fast.rope's)."""
    x, cos, sin = node.args[:3]
    interleaved = bool(_arg(node, 3, "interleaved", False))
    if not (_tensor(x) and _tensor(cos) and _tensor(sin)) or _rank(x) < 2 or _rank(cos) > _rank(x):
        return {}
    c, s = _table(cos, interleaved, "aten.cos"), _table(sin, interleaved, "aten.sin")
    if c is None or s is None or c[0] is not s[0] or c[2] != s[2] or c[3] != s[3]:
        return {}
    inv, offset, axis, scale = c
    if (offset is not s[1]) and not (type(offset) is int and offset == s[1]):
        return {}
    d = x.meta.shape[-1]
    if str(cos.meta.shape[-1]) != str(d) or str(sin.meta.shape[-1]) != str(d) \
            or type(d) is not int or inv.meta.shape[0] * 2 != d:
        return {}
    if [str(v) for v in node.outputs[0].meta.shape] != [str(v) for v in x.meta.shape]:
        return {}   # the tables broadcast x up: not a rope of x alone
    seq = axis - _rank(cos)          # negative: the same axis counted from x's end
    if seq == -1:
        return {}
    return {"inv_freq": inv, "offset": offset, "seq_axis": seq, "scaling": scale}


# -- run time ----------------------------------------------------------------------------------------
_EXACT: dict[int, tuple[mx.array, mx.array | None]] = {}
_EXACT_LOCK = threading.Lock()
_EXACT_MAX = 256


def exact_freqs(inv: mx.array) -> mx.array | None:
    """float32 ``f`` with ``fl(1 / f) == inv`` element by element (what mx.fast.rope turns back into
    ``inv``), or None when some entry has no such ``f``. Needs ``inv``'s values: once per array."""
    hit = _EXACT.get(id(inv))
    if hit is not None and hit[0] is inv:
        return hit[1]
    try:
        a = np.array(inv.astype(mx.float32), dtype=np.float32, copy=True)   # a half constant widens exactly
    except (RuntimeError, ValueError):
        return None    # no values here (a traced argument): stay elementwise rather than guess
    f0 = (1.0 / a.astype(np.float64)).astype(np.float32)
    found = np.zeros(a.shape, dtype=bool)
    freqs = f0.copy()
    with np.errstate(divide="ignore", over="ignore"):
        for k in (0, -1, 1, -2, 2):
            f = (f0.view(np.int32) + np.int32(k)).view(np.float32)
            ok = ~found & np.isfinite(f) & (f > 0) & (np.float32(1.0) / f == a)
            freqs[ok] = f[ok]
            found |= ok
    result = mx.array(freqs) if found.all() and np.all(a > 0) else None
    with _EXACT_LOCK:
        if len(_EXACT) >= _EXACT_MAX:
            _EXACT.clear()
        _EXACT[id(inv)] = (inv, result)
    return result


def fast_rope(x: mx.array, cos: mx.array, freqs: mx.array, offset: Any, seq_axis: int, interleaved: bool,
              scaling: float) -> mx.array | None:
    """``mx.fast.rope`` of ``x`` with the proven tables, or None when this call's shapes or dtype do
    not allow it (the caller computes the rope elementwise)."""
    if mx.default_device().type == mx.DeviceType.gpu and (not METAL_FAST_ROPE or x.dtype == mx.float32):
        return None       # Metal's kernel is not proven within tolerance (module docstring)
    if x.dtype not in (mx.float32, mx.float16, mx.bfloat16):
        return None
    cos_axis = cos.ndim + seq_axis
    if cos_axis < 0 or cos.shape[cos_axis] != x.shape[seq_axis]:
        return None       # positions broadcast along x's sequence (one table row for many): not a rope by row
    if type(offset) is mx.array:
        offset = mx.reshape(offset, ()).astype(mx.int32)
    h = x if seq_axis == -2 else mx.swapaxes(x, seq_axis, -2)
    shape = h.shape
    if h.ndim < 3:
        h = mx.reshape(h, (1,) * (3 - h.ndim) + shape)
    y = mx.fast.rope(h, shape[-1], traditional=interleaved, base=None, scale=1.0, offset=offset, freqs=freqs)
    y = mx.reshape(y, shape) if y.shape != shape else y
    y = y if seq_axis == -2 else mx.swapaxes(y, seq_axis, -2)
    return y if scaling == 1.0 else y * scaling
