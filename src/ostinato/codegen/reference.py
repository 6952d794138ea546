"""A fusion group computed with torch, primitive by primitive: the reference every generated kernel is
checked against, and what ``ost.fused`` runs where no kernel is generated (the CPU backend, a plan
decoded with ``OSTINATO_CUDA_REFERENCE=1``)."""
from __future__ import annotations

import functools

import torch

from ..ir.ops import OpDef, register_op
from .prims import BINARY, DTYPES, HALF, REDUCTIONS, UNARY, compute_dtype, decode_const
from .spec import GroupSpec, LinearSpec, parse_spec


@functools.lru_cache(maxsize=1024)
def parse(spec_json: str) -> "GroupSpec | LinearSpec":
    return parse_spec(spec_json)


def broadcast(shapes: list[tuple[int, ...]]) -> tuple[int, ...]:
    """The broadcast of int shapes (torch.broadcast_shapes imports sympy, ~1 s of a warm process's first
    call); ValueError naming them when they do not broadcast."""
    rank = max((len(s) for s in shapes), default=0)
    out = [1] * rank
    for s in shapes:
        for i, d in enumerate(s, rank - len(s)):
            if d != 1:
                if out[i] not in (1, d):
                    raise ValueError(f"fusion group inputs of shapes {[list(x) for x in shapes]} do not broadcast")
                out[i] = d
    return tuple(out)


def base_shape(spec: GroupSpec, tensors) -> tuple[int, ...]:
    """The broadcast of the inputs' shapes (after each one's trailing 1-dims): the shape of the group's
    full-size values, before any split."""
    shapes = [tuple(t.shape) + (1,) * spec.inputs[k][2] for k, t in enumerate(tensors) if spec.inputs[k][1] != "g"]
    shape = broadcast(shapes)
    if len(shape) != spec.rank - (1 if spec.split else 0):
        raise ValueError(f"fusion group of rank {spec.rank} got inputs broadcasting to {list(shape)}")
    return shape


def split_dims(spec: GroupSpec, shape: tuple, strides: tuple | None = None):
    """``shape`` (right-aligned to the base rank) with the split dim as [groups, size / groups] ([1, 1]
    where it broadcasts), and ``strides`` likewise when given."""
    base = spec.rank - 1
    shape = (1,) * (base - len(shape)) + tuple(shape)
    if strides is not None:
        strides = (0,) * (base - len(strides)) + tuple(strides)
    d, groups = spec.split
    size = shape[d]
    parts = (1, 1) if size == 1 else (groups, size // groups)
    new_shape = shape[:d] + parts + shape[d + 1:]
    if strides is None:
        return new_shape
    st = strides[d]
    return new_shape, strides[:d] + ((0, 0) if size == 1 else (st * parts[1], st)) + strides[d + 1:]


def iteration_shape(spec: GroupSpec, tensors) -> tuple[int, ...]:
    """The group's iteration space for these inputs."""
    shape = base_shape(spec, tensors)
    return split_dims(spec, shape) if spec.split else shape


def _scalar(x, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A 0-d tensor of ``x`` on ``device`` made by a fill, not a host-to-device copy: a reference may run
    inside a CUDA graph capture (a matmul group whose weights are not one packed block), where a copy
    from pageable host memory is refused."""
    if isinstance(x, torch.Tensor):
        return x.to(device=device, dtype=dtype)
    if dtype.is_floating_point and isinstance(x, float) and dtype != torch.float64:
        # filled in fp64 and rounded, as torch.tensor(x, dtype=...) rounds (1e40 in fp32 is inf, where
        # torch.full refuses it)
        return torch.full((), x, dtype=torch.float64, device=device).to(dtype)
    return torch.full((), x, dtype=dtype, device=device)


def evaluate(spec: GroupSpec, tensors, scalars) -> list[torch.Tensor]:
    shape = iteration_shape(spec, tensors)
    red = tuple(spec.red)
    device = tensors[0].device if tensors else torch.device("cpu")
    vals: list[torch.Tensor] = []
    for name, code, _, *args in spec.ops:
        ct = compute_dtype(code)
        if name == "in":
            t = tensors[args[0]]
            t = t.reshape(tuple(t.shape) + (1,) * spec.inputs[args[0]][2])
            v = (t.reshape(split_dims(spec, tuple(t.shape))) if spec.split else t).to(ct)
        elif name == "gather":
            v = _gathered(tensors[args[0]], spec.inputs[args[0]][3], vals[args[1]], shape).to(ct)
        elif name == "scalar":
            v = _scalar(scalars[args[0]], ct, device)
        elif name == "const":
            v = _scalar(decode_const(args[0]), ct, device)
        elif name == "rnumel":
            n = 1
            for d in red:
                n *= shape[d]
            v = _scalar(float(n), ct, device)
        elif name == "rindex":
            v = torch.arange(shape[-1], device=device).reshape((1,) * (len(shape) - 1) + (shape[-1],))
        elif name == "cast":
            v = vals[args[0]].to(DTYPES[code]).to(ct)
        elif name == "where":
            c, x, y = (vals[a] for a in args)
            v = torch.where(c, x.to(ct), y.to(ct))
        elif name in REDUCTIONS:
            x = torch.broadcast_to(vals[args[0]].to(ct), shape)
            if x.numel() == 0 and name != "sum":   # torch's amax refuses empty dims; the identity is what a
                v = torch.full(tuple(1 if i in red else d for i, d in enumerate(shape)),   # kernel would give
                               float("-inf") if name == "rmax" else float("inf"), dtype=ct, device=device)
            else:
                v = REDUCTIONS[name][2](x, red)
        elif name in UNARY:
            x = vals[args[0]]
            v = UNARY[name][1](x if code == "bool" else x.to(ct))
        elif name in BINARY:
            a, b = (vals[i] for i in args)
            if code == "bool":
                v = BINARY[name][1](a, b)
            else:
                v = BINARY[name][1](a.to(ct), b.to(ct))
        else:
            raise ValueError(f"unknown primitive {name}")
        if code in HALF and name not in ("in", "const", "scalar", "rnumel", "rindex"):
            v = v.to(DTYPES[code]).to(ct)
        vals.append(v)
    outs = []
    row = tuple(1 if i in red else d for i, d in enumerate(shape))
    for ref, code, level, keepdim, *rank in spec.outputs:
        v = torch.broadcast_to(vals[ref], shape if level == "x" else row).to(DTYPES[code]).contiguous()
        if rank:
            v = v.reshape(shape[len(shape) - rank[0]:])
        if level == "r" and not keepdim:
            v = v.reshape(tuple(d for i, d in enumerate(shape) if i not in red))
        elif spec.split:
            v = v.reshape(base_shape(spec, tensors))
        outs.append(v)
    return outs


def _gathered(x: torch.Tensor, dim: int, index: torch.Tensor, shape: tuple) -> torch.Tensor:
    """torch.gather of ``x`` along the space's dim ``dim`` at ``index`` (broadcast to the space), x
    right-aligned to the space: its other dims cut or broadcast to the space's sizes; an index outside
    x reads 0, as the kernels do."""
    x = x.reshape((1,) * (len(shape) - x.dim()) + tuple(x.shape))
    for d, n in enumerate(shape):
        if d != dim and x.shape[d] != n:
            x = x.narrow(d, 0, n) if x.shape[d] > n else x.expand(*x.shape[:d], n, *x.shape[d + 1:])
    index = torch.broadcast_to(index, shape).to(torch.int64)
    inside = (index >= 0) & (index < x.shape[dim])
    return torch.where(inside, torch.gather(x, dim, torch.where(inside, index, 0)), x.new_zeros(()))


def split_linear_args(spec: LinearSpec, tensors) -> tuple[list, list, list, list]:
    """A matmul group's launch tensors as (prologue inputs, weights, biases, epilogue inputs other than
    the slices' results)."""
    n_pro, g = len(spec.pro.inputs), spec.n_weights
    weights = list(tensors[n_pro:n_pro + g])
    biases = list(tensors[n_pro + g:n_pro + 2 * g]) if spec.bias else [None] * g
    rest = list(tensors[n_pro + g * (2 if spec.bias else 1):])
    if spec.one_weight:     # the slices as views of the one weight's (and bias's) row blocks
        starts = [sum(spec.w[:i]) for i in range(len(spec.w))]
        weight, bias = weights[0], biases[0]
        weights = [weight.narrow(0, s, n) for s, n in zip(starts, spec.w)]
        biases = [None if bias is None else bias.narrow(0, s, n) for s, n in zip(starts, spec.w)]
    return list(tensors[:n_pro]), weights, biases, rest


def epilogue_inputs(spec: LinearSpec, rest: list, results: list) -> list:
    """The epilogue's inputs in its order: slice g's result at ``acc[g]``, the other tensors in turn."""
    it = iter(rest)
    where = {k: g for g, k in enumerate(spec.acc)}
    return [results[where[k]] if k in where else next(it) for k in range(len(spec.epi.inputs))]


def evaluate_linear(spec: LinearSpec, tensors, scalars) -> list[torch.Tensor]:
    """A matmul group with torch: the prologue, one ``linear`` per slice (as eager runs it), the epilogue."""
    pro_in, weights, biases, rest = split_linear_args(spec, tensors)
    n_sc = len(spec.pro.scalars)
    pro_outs = evaluate(spec.pro, pro_in, scalars[:n_sc])
    a = pro_outs[spec.a]
    if spec.wt:     # GPT-2's Conv1D, as fused_ops.linear computes it (addmm over the rows flattened)
        from ..ir.fused_ops import linear
        results = [linear(a, weights[0], biases[0], None, True)]
    else:
        results = [torch.nn.functional.linear(a, w, b) for w, b in zip(weights, biases)]
    outs = [o for o, keep in zip(pro_outs, spec.pro_store) if keep]
    outs += [r for r, keep in zip(results, spec.mm_store) if keep]
    if spec.epi is not None:
        outs += evaluate(spec.epi, epilogue_inputs(spec, rest, results), scalars[n_sc:])
    return outs


def fused(spec_json: str, *args) -> tuple[torch.Tensor, ...]:
    """``ost.fused``: a fusion group's outputs, computed with torch (its inputs, then its host scalars)."""
    spec = parse(spec_json)
    if isinstance(spec, LinearSpec):
        n = spec.n_tensors
        return tuple(evaluate_linear(spec, args[:n], args[n:]))
    n = len(spec.inputs)
    return tuple(evaluate(spec, args[:n], args[n:]))


fused.multi_output = True
register_op(OpDef("ost.fused", fused, category="fused"))
