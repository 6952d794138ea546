"""Triton source for a matmul group (spec.LinearSpec): a projection with the group that feeds it (the
prologue) and the one that reads its result (the epilogue), both written by triton_source's emitter
under their own name prefixes, around the matmul's loops (codegen/linear.py says which projections).

Only text is produced here: nothing imports Triton until a kernel must be compiled.
"""
from __future__ import annotations

import re

from .prims import HALF, TRITON_TYPES
from .spec import LinearSpec
from .triton_source import Emitter, param_names


# A matmul group (spec.LinearSpec): the prologue's and the epilogue's emitters write their names with
# a prefix (p_, e_) so one kernel holds both; the shared row index (xidx, xmask) is the matmul's rows.
_OWN_NAMES = re.compile(r"\b(?:(?:in|out|sc|v|acc|r|xoff|roff|xs)\d+|(?:xst|rst)\d+_\d+|xnumel|rnumel)\b")


def _prefixed(lines: list[str], prefix: str) -> list[str]:
    return [_OWN_NAMES.sub(lambda m: prefix + m.group(0), line) for line in lines]


def linear_param_names(spec: LinearSpec, xr_pro: int = 1, xr_epi: int = 1, split: bool = False) -> list[str]:
    """The matmul kernel's runtime parameters, in launch order: the prologue's (as a row group over
    [rows, K], ``xr_pro`` row dims), the weights and biases, the projection's output, the epilogue's
    (over [rows, N]), then the columns walked, the weights' row stride and the output's; a split-K
    kernel then takes its fp32 partials ``[NSPLIT, ncols]``, one arrival counter per column block and
    the length of K each split walks (a tl.dot kernel's partials: [NSPLIT, slices, rows, ncols])."""
    names = ["p_" + n for n in param_names(spec.pro, xr_pro, 1)] + ["w"] + (["bias"] if spec.bias else [])
    names += ["mm"] + (["e_" + n for n in param_names(spec.epi, xr_epi, 1)] if spec.epi else [])
    return names + ["ncols", "wst", "mmst"] + (["ws", "cnt", "kslice"] if split else [])


def can_split_k(spec: LinearSpec) -> bool:
    """Whether a one-row matmul group can walk K in several programs per column block (split-K): no
    epilogue (the last program to arrive finishes the columns: bias, rounding, store)."""
    return spec.epi is None


def render_linear(spec: LinearSpec, one_row: bool, xr_pro: int = 1, xr_epi: int = 1,
                  interpreted: bool = False, split: bool = False, dot: bool = False,
                  stationary: bool = False, stats_stages: int = 0) -> tuple[str, str]:
    """(module source, kernel name) of a matmul group's kernel. Each program computes NBLOCK columns of
    every row (XBLOCK >= the rows): the prologue's statistics first (loops over K), then one loop over
    K that makes A's tile from the prologue's ops and multiplies it into the weights' [NBLOCK, RBLOCK]
    tiles (one per slice the epilogue reads), then the bias, the rounding to the projection's dtype and
    the epilogue on the [XBLOCK, NBLOCK] result tile. ``one_row``: a single row, accumulated as
    [NBLOCK, RBLOCK] and reduced once at the end; ``xr_pro``/``xr_epi``: the row dims the prologue's and
    the epilogue's operands walk (1 unless one broadcasts over part of the rows).

    ``split`` (one row, ``can_split_k``): grid axis 1 splits K in NSPLIT slices of ``kslice``. Each
    program stores its slice's fp32 sums in ``ws``, then counts itself in on its column block's counter
    (acquire-release at GPU scope, after a barrier: every thread's partials are written first); the
    program that arrives last adds the NSPLIT partials in split order (the result does not depend on
    which program came last), finishes the columns and sets the counter back to 0 for the next launch.
    One launch, deterministic; a lone GEMV with a long K (a down projection) otherwise runs a few
    programs per SM, each walking all of K.

    ``dot`` (several rows, fp16/bf16: more than codegen.linear.MAX_ROWS): each step multiplies A's tile,
    rounded to the projection's dtype (what eager's half-precision A holds; the prologue's last op already
    rounds to it), with the weights' tile in their dtype through ``tl.dot`` (tensor cores), into an fp32
    [XBLOCK, NBLOCK] accumulator: XBLOCK, NBLOCK and RBLOCK at least 16 (tl.dot's smallest tile). Grid
    axis 1 walks blocks of XBLOCK rows (a prefill's or an image's many rows; a batched decode step's fit
    one), each program recomputing the prologue for its rows.

    ``stationary`` (``dot``, all of K in one RBLOCK tile: a short K): one program per block of rows (grid
    axis 0 of size 1) makes A's tile once, the prologue included, then walks every column block, each
    one tl.dot, the bias, the rounding and the epilogue; the K-loop form instead runs one program per
    column block and row block, each remaking A's tile and the prologue.

    ``split`` with ``dot`` (K-loop form, one block of rows): grid axis 1 splits K as above; each program
    stores its slices' [XBLOCK, NBLOCK] fp32 partials, and the last to arrive adds them in split order,
    then runs the bias, the rounding and the epilogue (the prologue's statistics are still each
    program's own walk over all of K).

    ``stats_stages`` (``dot``, K-loop form): the prologue's statistics loops software-pipelined that
    deep (``tl.range``), so a program's walk over its rows' K issues several chunks' loads at once."""
    if split and not ((one_row and can_split_k(spec)) or (dot and not stationary)):
        raise ValueError("a split-K matmul kernel takes one row and no epilogue, or is a K-loop tl.dot kernel")
    if dot and (one_row or spec.dt not in HALF):
        raise ValueError("a tl.dot matmul kernel takes several rows of fp16 or bf16")
    if stationary and not dot:
        raise ValueError("a row-stationary matmul kernel is a tl.dot one")
    if stats_stages and (not dot or stationary):
        raise ValueError("pipelined statistics loops are a K-loop tl.dot matmul kernel's")
    kind = "m1" if one_row else "mr" if stationary else "md" if dot else "mb"
    name = (f"lin_{spec.digest[:16]}_{kind}{xr_pro}{xr_epi}"
            f"{'_s' if split else ''}{f'_p{stats_stages}' if stats_stages else ''}{'_i' if interpreted else ''}")
    dt = TRITON_TYPES[spec.dt]
    pro = Emitter(spec.pro, xr_pro, 1, interpreted)
    pro.loop_stages = stats_stages or None
    slices = [(g, g * spec.w[0]) for g in range(len(spec.w))] if spec.epi else [(0, 0)]
    lines = ["@triton.jit", f"def {name}({', '.join(linear_param_names(spec, xr_pro, xr_epi, split))}, "
             f"XBLOCK: tl.constexpr, RBLOCK: tl.constexpr, NBLOCK: tl.constexpr{', NSPLIT: tl.constexpr' if split else ''}):"]
    out = lines.append

    pro.lines = []
    pro.line("pid = tl.program_id(0)")
    if split:
        pro.line("sid = tl.program_id(1)")
    # a tl.dot kernel tiles the rows too (grid axis 1: blocks of XBLOCK rows; one block for a batched decode step)
    # (a split one: one block, XBLOCK >= the rows; grid axis 1 walks the splits of K)
    pro.line("xidx = (tl.program_id(1) * XBLOCK + tl.arange(0, XBLOCK))[:, None]" if dot and not split else
             "xidx = tl.arange(0, XBLOCK)[:, None]")
    pro.line("xmask = xidx < xnumel")
    pro.coords("x", "xidx", xr_pro, 1)
    pro.offsets("x", xr_pro, 1)
    pro.looped_reductions(set())
    lines += _prefixed(pro.lines, "p_")
    x_stores = [(k, o) for k, o in enumerate(spec.pro.outputs) if spec.pro_store[k] and o[2] == "x"]
    r_stores = [(k, o) for k, o in enumerate(spec.pro.outputs) if spec.pro_store[k] and o[2] == "r"]
    a_ref = spec.pro.outputs[spec.a][0]
    if stationary:
        _stationary_body(spec, pro, lines, slices, x_stores, r_stores, a_ref, dt, xr_epi, interpreted)
        return _linear_module(spec, lines), name
    out("    col = pid * NBLOCK + tl.arange(0, NBLOCK)")
    out("    cmask = col < ncols")
    for g, _ in slices:
        out(f"    mm_{g} = tl.zeros({'[NBLOCK, RBLOCK]' if one_row else '[XBLOCK, NBLOCK]'}, tl.float32)")
    out("    for r0 in range(sid * kslice, sid * kslice + kslice, RBLOCK):" if split else
        "    for r0 in range(0, p_rnumel, RBLOCK):")
    out("        ridx = r0 + tl.arange(0, RBLOCK)[None, :]")
    pro.lines = []
    pro._row_body(2)
    pro.emit_ops(pro.needed([a_ref] + [o[0] for _, o in x_stores], "x"), 2)
    for k, (ref, code, *_) in x_stores:
        pro._store(k, ref, code, "xoff{k} + roff{k}", "mask & (pid == 0)", 2, full=True)
    lines += _prefixed(pro.lines, "p_")
    out(f"        a = tl.where(mask, tl.broadcast_to(p_v{a_ref}, [XBLOCK, RBLOCK]), 0.0)")
    if dot:
        out(f"        a = a.to({dt})")
        if spec.wt:     # W stored [K, N]: its [RBLOCK, NBLOCK] tile is the dot's right operand as it lies
            out("        kidx = r0 + tl.arange(0, RBLOCK)[:, None]")
            out("        wv = tl.load(w + kidx.to(tl.int64) * wst + col[None, :], "
                "mask=(kidx < p_rnumel) & cmask[None, :], other=0)")
            out("        mm_0 = tl.dot(a, wv, mm_0)")
        for g, off in slices if not spec.wt else ():
            out(f"        wv = tl.load(w + (col[:, None] + {off}).to(tl.int64) * wst + ridx, "
                "mask=cmask[:, None] & rmask, other=0)")
            out(f"        mm_{g} = tl.dot(a, tl.trans(wv), mm_{g})")
    for g, off in slices if not dot else ():
        # W stored [K, N] (wt): element (n, k) at k * wst + n; else [N, K]: at n * wst + k
        where = "ridx.to(tl.int64) * wst + col[:, None]" if spec.wt else f"(col[:, None] + {off}).to(tl.int64) * wst + ridx"
        out(f"        wv = tl.load(w + {where}, mask=cmask[:, None] & rmask, other=0).to(tl.float32)")
        if one_row:
            out(f"        mm_{g} += wv * a")
        else:
            out(f"        mm_{g} += tl.sum(a[:, None, :] * wv[None, :, :], axis=2)")
    pad = "    "
    if split and dot:   # every slice's [XBLOCK, NBLOCK] partial; the last program sums them in split order
        part = "({s} * " + str(len(slices)) + " + {g}) * p_xnumel * ncols + xidx * ncols + col[None, :]"
        for g, _ in slices:
            out(f"    tl.store(ws + {part.format(s='sid', g=g)}, mm_{g}, mask=xmask & cmask[None, :])")
        out("    tl.debug_barrier()")
        out('    arrived = tl.atomic_add(cnt + pid, 1, sem="acq_rel", scope="gpu")')
        out("    if arrived == NSPLIT - 1:")
        for g, _ in slices:
            out(f"        mm_{g} = tl.zeros([XBLOCK, NBLOCK], tl.float32)")
        out("        for s in range(NSPLIT):")
        for g, _ in slices:
            out(f"            mm_{g} += tl.load(ws + {part.format(s='s', g=g)}, mask=xmask & cmask[None, :], "
                'other=0.0, cache_modifier=".cg")')
        pad = "        "
    elif split:       # (one slice: no epilogue)
        out("    mm_0 = tl.sum(mm_0, axis=1)[None, :]")
        out("    tl.store(ws + sid * ncols + col[None, :], mm_0, mask=cmask[None, :])")
        out("    tl.debug_barrier()")
        out('    arrived = tl.atomic_add(cnt + pid, 1, sem="acq_rel", scope="gpu")')
        out("    if arrived == NSPLIT - 1:")
        out("        mm_0 = tl.zeros([1, NBLOCK], tl.float32)")
        out("        for s in range(NSPLIT):")
        out('            mm_0 += tl.load(ws + s * ncols + col[None, :], mask=cmask[None, :], other=0.0, '
            'cache_modifier=".cg")')
        pad = "        "
    for g, off in slices:
        if one_row and not split:
            out(f"    mm_{g} = tl.sum(mm_{g}, axis=1)[None, :]")
        _finish_columns(spec, lines, [(g, off)], dt, pad)
    if split and dot:   # the epilogue in the last program only
        lines += _epilogue(spec, xr_epi, interpreted, 2)
    if split:
        out('        tl.atomic_xchg(cnt + pid, 0, sem="relaxed", scope="gpu")')
    pro.lines = []
    for k, (ref, code, *_) in r_stores:
        pro._store(k, ref, code, "xoff", "xmask & (pid == 0)" + (" & (sid == 0)" if split else ""), 1)
    lines += _prefixed(pro.lines, "p_")
    if not split:
        lines += _epilogue(spec, xr_epi, interpreted, 1)
    return _linear_module(spec, lines), name


def _finish_columns(spec: LinearSpec, lines: list[str], slices, dt: str, pad: str) -> None:
    """The bias, the rounding to the projection's dtype and the store of each slice's result tile."""
    for g, off in slices:
        if spec.bias:
            lines.append(f"{pad}mm_{g} = mm_{g} + tl.load(bias + col + {off}, mask=cmask, other=0).to(tl.float32)[None, :]")
        if spec.dt in HALF:
            lines.append(f"{pad}mm_{g} = mm_{g}.to({dt}).to(tl.float32)")
        if spec.mm_store[g]:
            lines.append(f"{pad}tl.store(mm + xidx * mmst + (col + {off})[None, :], mm_{g}.to({dt}), "
                         "mask=xmask & cmask[None, :])")


def _epilogue(spec: LinearSpec, xr_epi: int, interpreted: bool, indent: int) -> list[str]:
    """The epilogue's lines over the [XBLOCK, NBLOCK] result tile at ``col``."""
    if spec.epi is None:
        return []
    epi = Emitter(spec.epi, xr_epi, 1, interpreted)
    epi.rblock = "NBLOCK"
    epi.loaded = {k: f"mm_{g}" for g, k in enumerate(spec.acc)}
    epi.lines = []
    epi.coords("x", "xidx", xr_epi, indent)
    epi.offsets("x", xr_epi, indent)
    epi.line("ridx = col[None, :]", indent)
    epi._row_body(indent)
    epi.emit_ops(range(len(spec.epi.ops)), indent)
    for k, (ref, code, level, *_) in enumerate(spec.epi.outputs):
        if level == "x":
            epi._store(k, ref, code, "xoff{k} + roff{k}", "mask", indent, full=True)
        else:
            epi._store(k, ref, code, "xoff", "xmask", indent)
    return _prefixed(epi.lines, "e_")     # (mm_{g}, the kernel's own names, carry no prefix)


def _stationary_body(spec: LinearSpec, pro: "Emitter", lines: list[str], slices, x_stores, r_stores, a_ref: int,
                     dt: str, xr_epi: int, interpreted: bool) -> None:
    """A row-stationary kernel's body after the prologue's statistics: A's tile once (all of K), the
    prologue's stores, then a loop over the column blocks. K's indices are ``kidx``/``kmask``: the
    epilogue redefines ``ridx``, ``rmask`` and ``mask`` for its columns."""
    out = lines.append
    pro.lines = []
    pro.line("ridx = tl.arange(0, RBLOCK)[None, :]")
    pro._row_body(1)
    pro.emit_ops(pro.needed([a_ref] + [o[0] for _, o in x_stores], "x"), 1)
    for k, (ref, code, *_) in x_stores:
        pro._store(k, ref, code, "xoff{k} + roff{k}", "mask", 1, full=True)
    for k, (ref, code, *_) in r_stores:
        pro._store(k, ref, code, "xoff", "xmask", 1)
    pro.line(f"a = tl.where(mask, tl.broadcast_to(v{a_ref}, [XBLOCK, RBLOCK]), 0.0).to({dt})")
    # the row body's names are the epilogue's too: renamed here, or Triton would take them for values
    # carried through the column loop, of another shape
    lines += [_ROW_NAMES.sub(r"k_\g<0>", line) for line in _prefixed(pro.lines, "p_")]
    out("    kidx = tl.arange(0, RBLOCK)")
    out("    kmask = kidx < p_rnumel")
    out("    for c0 in range(0, ncols, NBLOCK):")
    out("        col = c0 + tl.arange(0, NBLOCK)")
    out("        cmask = col < ncols")
    if spec.wt:     # W stored [K, N]: its [RBLOCK, NBLOCK] tile is the dot's right operand as it lies
        out("        wv = tl.load(w + kidx[:, None].to(tl.int64) * wst + col[None, :], "
            "mask=kmask[:, None] & cmask[None, :], other=0)")
        out("        mm_0 = tl.dot(a, wv)")
    for g, off in slices if not spec.wt else ():
        out(f"        wv = tl.load(w + (col[:, None] + {off}).to(tl.int64) * wst + kidx[None, :], "
            "mask=cmask[:, None] & kmask[None, :], other=0)")
        out(f"        mm_{g} = tl.dot(a, tl.trans(wv))")
    _finish_columns(spec, lines, slices, dt, "        ")
    lines += _epilogue(spec, xr_epi, interpreted, 2)


_ROW_NAMES = re.compile(r"\b(?:ridx|rmask|rt|rc\d+|mask)\b(?!=)")


def _linear_module(spec: LinearSpec, lines: list[str]) -> str:
    head = ('"""Generated by ostinato.codegen from a matmul group; do not edit."""\n'
            "import triton\nimport triton.language as tl\nfrom triton.language.extra import libdevice\n\n")
    return head + f"# spec: {spec.to_json()}\n" + "\n".join(lines) + "\n"
