"""Triton source for a fusion group (spec.py), one kernel per variant of its launch.

The iteration space is seen as [X, R]: the kept dims (collapsed at launch into ``xr`` dims) and the
reduced ones (``rr`` dims; none for a pointwise group). Each operand, inputs and outputs alike, is
addressed through its own strides over those dims, passed at launch: broadcasts are stride 0, any
layout works, and a dim of size or stride 1 is compiled in as a constant (binaries.arg_type). One
program handles XBLOCK rows; a reduction holds a row in registers (``loop=False``, rows up to 4096
elements) or walks it in RBLOCK chunks, recomputing the pointwise ops each pass needs.

Only text is produced here: nothing imports Triton until a kernel must be compiled.
"""
from __future__ import annotations

import re

from .prims import (BINARY, COMPARE, FLOATS, HALF, LOGICAL, REDUCTIONS, TRITON_TYPES, UNARY, compute_code,
                    decode_const, literal, template)
from .spec import GroupSpec, LinearSpec


def kernel_name(spec: GroupSpec) -> str:
    return f"fused_{spec.digest[:16]}"


def param_names(spec: GroupSpec, xr: int, rr: int, loop: bool = False, split: bool = False) -> list[str]:
    """The kernel's runtime parameters, in launch order (a looped row kernel ends with ``rchunk``: the row
    elements whose outputs one program along grid axis 1 writes; a split one then with ``nsplit``, the
    programs per row, and ``ws``, the fp32 workspace of partial reductions ``[reductions, rows, nsplit]``)."""
    n_in, n_out = len(spec.inputs), len(spec.outputs)
    names = [f"in{k}" for k in range(n_in)] + [f"out{k}" for k in range(n_out)]
    names += [f"sc{k}" for k in range(len(spec.scalars))]
    names += ["xnumel"] + (["rnumel"] if spec.red else [])
    names += [f"xs{d}" for d in range(1, xr)] + [f"rs{d}" for d in range(1, rr)]
    for k in range(n_in + n_out):
        names += [f"xst{k}_{d}" for d in range(xr)] + [f"rst{k}_{d}" for d in range(rr if spec.red else 0)]
    for k, i in enumerate(spec.inputs):    # a gathered input: its gathered dim's stride and size
        if i[1] == "g":
            names += [f"gst{k}", f"gsz{k}"]
    return names + (["rchunk"] if loop and spec.red else []) + (["nsplit", "ws"] if split and spec.red else [])


def _ct(code: str) -> str:
    return TRITON_TYPES[compute_code(code)]


class _Emitter:
    def __init__(self, spec: GroupSpec, xr: int, rr: int, interpreted: bool):
        self.spec, self.xr, self.rr = spec, xr, rr
        self.row = bool(spec.red)
        self.n_in = len(spec.inputs)
        self.lines: list[str] = []
        self.interpreted = interpreted
        self.rblock = "RBLOCK"                  # the row tile's width (a matmul's epilogue: its column tile)
        self.loaded: dict[int, str] = {}       # input -> the expression that holds it (a matmul's result)
        self.i64 = False

    def line(self, text: str, indent: int = 1) -> None:
        self.lines.append("    " * indent + text)

    # -- indexing -------------------------------------------------------------------------------
    def coords(self, prefix: str, idx: str, rank: int, indent: int) -> None:
        """``{prefix}c{d}``: the coordinates of flat index ``idx`` over the sizes ``{prefix}s{d}``."""
        if rank == 1:
            self.line(f"{prefix}c0 = {idx}", indent)
            return
        self.line(f"{prefix}t = {idx}", indent)
        for d in range(rank - 1, 0, -1):
            self.line(f"{prefix}c{d} = {prefix}t % {prefix}s{d}", indent)
            self.line(f"{prefix}t = {prefix}t // {prefix}s{d}", indent)
        self.line(f"{prefix}c0 = {prefix}t", indent)

    def offsets(self, prefix: str, rank: int, indent: int) -> None:
        for k in range(self.n_in + len(self.spec.outputs)):
            terms = " + ".join(f"{prefix}c{d} * {prefix}st{k}_{d}" for d in range(rank))
            self.line(f"{prefix}off{k} = {terms}", indent)

    # -- values ---------------------------------------------------------------------------------
    def expr(self, i: int) -> str:
        """The right-hand side computing op ``i`` (its arguments already computed)."""
        name, code, level, *args = self.spec.ops[i]
        ops = self.spec.ops
        ct = _ct(code)
        if name == "in":
            k = args[0]
            if k in self.loaded:
                return self.loaded[k]
            off = f"xoff{k}" if level == "r" or not self.row else f"xoff{k} + roff{k}"
            mask = "xmask" if level == "r" or not self.row else "mask"
            load = f"tl.load(in{k} + {off}, mask={mask}, other=0)"
            return load + (".to(tl.float32)" if code in HALF else "")
        if name == "gather":
            k, i = args
            off, mask = (f"xoff{k} + roff{k}", "mask") if self.row else (f"xoff{k}", "xmask")
            load = (f"tl.load(in{k} + {off} + v{i}.to(tl.int64) * gst{k}, "
                    f"mask={mask} & (v{i} >= 0) & (v{i} < gsz{k}), other=0)")
            return load + (".to(tl.float32)" if code in HALF else "")
        if name == "scalar":
            return f"sc{args[0]}"
        if name == "const":
            shape = "[1, 1]" if self.row else "[1]"
            return f"tl.full({shape}, {literal(decode_const(args[0]))}, {ct})"
        if name == "rnumel":
            return f"tl.full({'[1, 1]' if self.row else '[1]'}, rnumel, tl.float32)"
        if name == "cast":
            src = f"v{args[0]}"
            if code == "bool":
                return f"({src} != 0)"
            if code in HALF:
                return f"{src}.to(tl.float32).to({TRITON_TYPES[code]}).to(tl.float32)"
            return f"{src}.to({ct})"
        if name in REDUCTIONS:
            raise AssertionError("reductions are emitted by the loop")
        if name == "where":
            c, x, y = args
            return f"tl.where(v{c}, {self._conv(x, code)}, {self._conv(y, code)})"
        if name in COMPARE:
            a, b = args
            float_args = [ops[j][1] for j in (a, b) if ops[j][1] in FLOATS]
            if float_args:
                common = "f64" if "f64" in float_args else "f32"
                return BINARY[name][0].format(self._conv(a, common), self._conv(b, common))
            return BINARY[name][0].format(f"v{a}", f"v{b}")
        if name in LOGICAL:
            return (UNARY[name][0] if name in UNARY else BINARY[name][0]).format(*(f"v{a}" for a in args))
        if name in UNARY:
            return self._rounded(template(name, self.interpreted).format(self._conv(args[0], code), t=ct), code)
        if name in BINARY:
            return self._rounded(template(name, self.interpreted).format(*(self._conv(a, code) for a in args)),
                                 code)
        raise AssertionError(f"unknown primitive {name}")

    def _conv(self, j: int, code: str) -> str:
        """Op ``j``'s value in ``code``'s compute type."""
        src = self.spec.ops[j][1]
        if compute_code(src) == compute_code(code):
            return f"v{j}"
        return f"v{j}.to({_ct(code)})"

    @staticmethod
    def _rounded(text: str, code: str) -> str:
        return f"({text}).to({TRITON_TYPES[code]}).to(tl.float32)" if code in HALF else text

    def needed(self, roots: list[int], level: str) -> list[int]:
        """The ops of ``level`` that ``roots`` depend on (through ops of that level), in order."""
        seen: set[int] = set()
        stack = list(roots)
        while stack:
            i = stack.pop()
            if i in seen or self.spec.ops[i][2] != level:
                continue
            seen.add(i)
            name, _, _, *args = self.spec.ops[i]
            if name == "gather":
                stack.append(args[1])       # args[0] names an input, not an op
            elif name not in ("in", "scalar", "const", "rnumel") and name not in REDUCTIONS:
                stack.extend(args)
        return sorted(seen)

    def emit_ops(self, ids, indent: int, skip=()) -> None:
        for i in ids:
            if i not in skip and self.spec.ops[i][0] not in REDUCTIONS:
                self.line(f"v{i} = {self.expr(i)}", indent)

    # -- kernels --------------------------------------------------------------------------------
    def render(self, name: str, loop: bool, i64: bool, stage: int | None = None) -> str:
        spec = self.spec
        split = stage is not None
        params = param_names(spec, self.xr, self.rr, loop or split, split)
        head = (f"def {name}({', '.join(params)}, XBLOCK: tl.constexpr" + (", RBLOCK: tl.constexpr" if self.row else "")
                + (", SBLOCK: tl.constexpr" if split else "") + "):")
        self.lines = ["@triton.jit", head]
        pid = "tl.program_id(0).to(tl.int64)" if i64 else "tl.program_id(0)"
        if self.row:
            self.line(f"xidx = {pid} * XBLOCK + tl.arange(0, XBLOCK)[:, None]")
        else:
            self.line(f"xidx = {pid} * XBLOCK + tl.arange(0, XBLOCK)")
        self.line("xmask = xidx < xnumel")
        self.coords("x", "xidx", self.xr, 1)
        self.offsets("x", self.xr, 1)
        if not self.row:
            self.emit_ops(range(len(spec.ops)), 1)
            for k, (ref, code, *_) in enumerate(spec.outputs):
                self._store(k, ref, code, "xoff", "xmask", 1)
            return "\n".join(self.lines) + "\n"
        x_outs = [(k, o) for k, o in enumerate(spec.outputs) if o[2] == "x"]
        r_outs = [(k, o) for k, o in enumerate(spec.outputs) if o[2] == "r"]
        self.i64 = i64
        if not loop:
            self.line("ridx = tl.arange(0, RBLOCK)[None, :]" + (".to(tl.int64)" if i64 else ""))
            self._row_body(1)
            for i, op in enumerate(spec.ops):
                if op[0] in REDUCTIONS:
                    self._reduce_whole(i)
                else:
                    self.line(f"v{i} = {self.expr(i)}")
            for k, (ref, code, level, *_) in enumerate(spec.outputs):
                if level == "x":
                    self._store(k, ref, code, "xoff{k} + roff{k}", "mask", 1, full=True)
                else:
                    self._store(k, ref, code, "xoff", "xmask", 1)
            return "\n".join(self.lines) + "\n"
        if split:
            self.line("chunk = tl.program_id(1)")
            if not self.split_reductions(stage):
                return "\n".join(self.lines) + "\n"     # a partial-reduction stage stores no output
        else:
            self.looped_reductions(set())
            self.line("chunk = tl.program_id(1)")
        # Grid axis 1 splits the output pass of a row (each program has the row's statistics: computed
        # over the whole row, or combined from the split stages' partials): rows that are few and long
        # still fill the GPU. Row-level results are stored by chunk 0.
        for k, (ref, code, *_) in r_outs:
            self._store(k, ref, code, "xoff", "xmask & (chunk == 0)", 1)
        if x_outs:
            self.line("for r0 in range(chunk * rchunk, tl.minimum(rnumel, chunk * rchunk + rchunk), RBLOCK):")
            self.line("ridx = r0 + tl.arange(0, RBLOCK)[None, :]" + (".to(tl.int64)" if i64 else ""), 2)
            self._row_body(2)
            self.emit_ops(self.needed([o[0] for _, o in x_outs], "x"), 2)
            for k, (ref, code, *_) in x_outs:
                self._store(k, ref, code, "xoff{k} + roff{k}", "mask", 2, full=True)
        return "\n".join(self.lines) + "\n"

    def looped_reductions(self, r_done: set[int]) -> None:
        """Each reduction as a loop over the row in RBLOCK chunks (recomputing the pointwise ops it
        reads), then every row-level op: the statistics the x-level outputs need."""
        spec = self.spec
        for j in [i for i, op in enumerate(spec.ops) if op[0] in REDUCTIONS]:
            self._emit_r_before(j, r_done)
            self._accumulate(j, "0", "rnumel")
            r_done.add(j)
        self._emit_r_before(len(spec.ops), r_done)

    def split_reductions(self, stage: int) -> bool:
        """A split row's statistics (``chunk``: this program's part of the row). Stage k < the number of
        stages - 1: the reductions before the stage's own combined from their partials, then its own over
        this part, stored as its partial (with its centred partner's, moment_pairs; returns False:
        nothing else to emit). The last stage: every reduction combined from its partials, then the
        row-level ops (returns True)."""
        spec = self.spec
        reds = [i for i, op in enumerate(spec.ops) if op[0] in REDUCTIONS]
        pairs = moment_pairs(spec)
        slot = {j: e for e, j in enumerate(reds)}
        own = [j for j in reds if j not in pairs]
        target = own[stage] if stage < len(own) else len(spec.ops)
        r_done: set[int] = set()
        if stage:
            # the partials as 1-D tiles reduced to scalars (XBLOCK is 1: a program's row is its id), so
            # no tile of theirs shares a layout with the output loop's (a [1, SBLOCK] tile that met a
            # row value was given one that held a broadcast [1, RBLOCK] copy in every thread)
            self.line("sidx = tl.arange(0, SBLOCK)" + (".to(tl.int64)" if self.i64 else ""))
            self.line("smask = sidx < nsplit")
            self.line("srow = tl.program_id(0)" + (".to(tl.int64)" if self.i64 else ""))
        for j in [j for j in reds if j < target]:
            self._emit_r_before(j, r_done)
            rname = spec.ops[j][0]
            self.line(f"p{j} = tl.load(ws + ({slot[j]} * xnumel + srow) * nsplit + sidx, mask=smask, "
                      f"other={REDUCTIONS[rname][0]})")
            if j in pairs:
                # sum over the row of (e - m)^2 = sum over parts of (their square sum about their own
                # mean + n_part * (mean_part - m)^2), m the row-level value the group subtracts; taken
                # about the row's mean k (u = mean_part - k, d = m - k: the parts' n (u - d)^2 summed
                # is A - 2 d B + d^2 rnumel, B ~ 0: no cancellation however far a part's mean is), so
                # the row value m meets only scalars
                m, first = spec.ops[spec.ops[spec.ops[j][3]][3]][4], pairs[j]
                self.line(f"k{j} = tl.sum(p{first}, axis=0) / rnumel.to(tl.float32)")
                self.line(f"n{j} = tl.where(smask, tl.maximum(tl.minimum(rchunk, rnumel - sidx * rchunk), 1)"
                          f".to(tl.float32), 0.0)")
                self.line(f"u{j} = tl.where(smask, p{first} / tl.maximum(n{j}, 1.0) - k{j}, 0.0)")
                self.line(f"d{j} = v{m} - k{j}")
                self.line(f"v{j} = (tl.sum(p{j} + n{j} * u{j} * u{j}, axis=0) - 2.0 * d{j} * tl.sum(n{j} * u{j}, axis=0) "
                          f"+ d{j} * d{j} * rnumel.to(tl.float32))")
            else:
                self.line(f"v{j} = {self._reduced(rname, f'p{j}', axis=0)}")
            r_done.add(j)
        if stage < len(own):
            j = target
            start, stop = "chunk * rchunk", "tl.minimum(rnumel, chunk * rchunk + rchunk)"
            self._emit_r_before(j, r_done)
            self._accumulate(j, start, stop)
            self.line(f"tl.store(ws + ({slot[j]} * xnumel + xidx) * nsplit + chunk, v{j}, mask=xmask)")
            partners = [k for k, first in pairs.items() if first == j]
            if partners:        # the part's squares about its own mean, once for every sum that pairs
                self.line(f"cm{j} = v{j} / ({stop} - {start}).to(tl.float32)")
                self._accumulate(j, start, stop, centre=f"cm{j}", name=f"q{j}")
            for j2 in partners:
                self.line(f"tl.store(ws + ({slot[j2]} * xnumel + xidx) * nsplit + chunk, q{j}, mask=xmask)")
            return False
        self._emit_r_before(len(spec.ops), r_done)
        return True

    def _emit_r_before(self, limit: int, r_done: set[int]) -> None:
        """The row-level ops before op ``limit`` not emitted yet (reductions aside)."""
        ids = [i for i, op in enumerate(self.spec.ops) if i < limit and op[2] == "r" and i not in r_done
               and op[0] not in REDUCTIONS]
        self.emit_ops(ids, 1)
        r_done.update(ids)

    def _accumulate(self, j: int, start: str, stop: str, centre: str | None = None, name: str | None = None) -> None:
        """Reduction ``j`` over the row elements [start, stop) in RBLOCK chunks (recomputing the
        pointwise ops it reads), as ``v{j}`` of shape [XBLOCK, 1]. With ``centre`` (a sum): the sum of
        (operand - centre)^2 instead, as ``name``."""
        rname, code, _, arg = self.spec.ops[j]
        ident = REDUCTIONS[rname][0]
        acc, name = (f"acc{j}", f"v{j}") if centre is None else (f"cacc{j}", name)
        self.line(f"{acc} = tl.full([XBLOCK, RBLOCK], {ident}, {_ct(code)})")
        self.line(f"for r0 in range({start}, {stop}, RBLOCK):")
        self.line("ridx = r0 + tl.arange(0, RBLOCK)[None, :]" + (".to(tl.int64)" if self.i64 else ""), 2)
        self._row_body(2)
        self.emit_ops(self.needed([arg], "x"), 2)
        term = self._conv(arg, code)
        if centre is not None:
            self.line(f"c{j} = {term} - {centre}", 2)
            term = f"c{j} * c{j}"
        val = f"tl.where(mask, {term}, {ident})"
        if rname == "sum":
            self.line(f"{acc} = {acc} + {val}", 2)
        else:
            fn = "tl.maximum" if rname == "rmax" else "tl.minimum"
            self.line(f"{acc} = {fn}({acc}, {val}, propagate_nan=tl.PropagateNan.ALL)", 2)
        self.line(f"{name} = {self._reduced(rname, acc)}")

    def _row_body(self, indent: int) -> None:
        self.line("rmask = ridx < rnumel", indent)
        self.line("mask = xmask & rmask", indent)
        self.coords("r", "ridx", self.rr, indent)
        self.offsets("r", self.rr, indent)

    def _reduce_whole(self, j: int) -> None:
        rname, code, _, arg = self.spec.ops[j]
        val = f"tl.where(mask, {self._conv(arg, code)}, {REDUCTIONS[rname][0]})"
        self.line(f"r{j} = {val}")
        self.line(f"v{j} = {self._reduced(rname, f'r{j}')}")

    @staticmethod
    def _reduced(rname: str, tile: str, axis: int = 1) -> str:
        """A [XBLOCK, N] tile reduced along its rows, as [XBLOCK, 1] (``axis=0``: a 1-D tile, as a
        scalar); max and min give NaN where the row holds one, as torch's amax/amin do (tl.max and
        tl.min drop NaN)."""
        reduced = REDUCTIONS[rname][1].format(tile)
        keep = "[:, None]"
        if axis == 0:
            reduced, keep = reduced.replace("axis=1", "axis=0"), ""
        if rname == "sum":
            return f"{reduced}{keep}"
        return (f"tl.where(tl.max(({tile} != {tile}).to(tl.int32), axis={axis}){keep} > 0, float('nan'), "
                f"{reduced}{keep})")

    def _store(self, k: int, ref: int, code: str, off: str, mask: str, indent: int, full: bool = False) -> None:
        slot = self.n_in + k
        offset = off.format(k=slot) if "{k}" in off else f"{off}{slot}"
        value = f"v{ref}"
        if full and self.spec.ops[ref][2] == "r":
            value = f"tl.broadcast_to({value}, [XBLOCK, {self.rblock}])"
        elif not self.row and self.spec.ops[ref][2] == "r":
            value = f"tl.broadcast_to({value}, [XBLOCK])"
        store_ty = TRITON_TYPES[code]
        conv = f"({value} != 0)" if code == "bool" else f"{value}.to({store_ty})"
        self.line(f"tl.store(out{k} + {offset}, {conv}, mask={mask})", indent)


def render(spec: GroupSpec, xr: int, rr: int, loop: bool, i64: bool, interpreted: bool = False,
           stage: int | None = None) -> tuple[str, str]:
    """(module source, kernel name) of one variant: ``xr`` kept dims, ``rr`` reduced dims (0 for a
    pointwise group), ``loop`` over row chunks, ``i64`` index arithmetic; ``interpreted`` for Triton's
    interpreter (no libdevice). ``stage``: one kernel of a split row (each row walked by several
    programs): each but the last stores a reduction's partials (a centred pair's both), the last
    combines them and writes the outputs (split_stages(spec) kernels run in order)."""
    kind = f"s{stage}" if stage is not None else "l" if loop else "p"
    name = f"{kernel_name(spec)}_x{xr}r{rr}{kind}{'w' if i64 else ''}{'_i' if interpreted else ''}"
    body = _Emitter(spec, xr, rr if spec.red else 0, interpreted).render(name, loop, i64, stage)
    head = ('"""Generated by ostinato.codegen from a fusion group; do not edit."""\n'
            "import triton\nimport triton.language as tl\nfrom triton.language.extra import libdevice\n\n")
    return head + f"# spec: {spec.to_json()}\n" + body, name


def moment_pairs(spec: GroupSpec) -> dict[int, int]:
    """The reductions a split row takes from its parts' centred sums, ``j2 -> j1``: op j2 sums
    (e - m)^2 in fp32 (no rounding between; the square as a product or a power of 2), m a row-level
    value computed from op j1, an earlier fp32 sum of the same e (a variance's mean: norms, var; a
    shifted mean). Each part stores its sum of e and its sum of squares about its own mean, in one
    kernel; the combination adds n_part * (mean_part - m)^2 per part (Chan's parallel variance). A
    norm's split row then takes two kernels instead of three, reading its input twice, not three times."""
    ops = spec.ops
    sums: dict[int, int] = {}       # a summed fp32 operand -> the first sum of it
    pairs: dict[int, int] = {}
    for j, op in enumerate(ops):
        if op[0] != "sum" or op[1] != "f32":
            continue
        sq = ops[op[3]]
        d = None
        if sq[1] == "f32" and sq[2] == "x" and (
                sq[0] == "mul" and sq[3] == sq[4]
                or sq[0] == "pow" and ops[sq[4]][0] == "const" and decode_const(ops[sq[4]][3]) == 2.0):
            d = sq[3]
        if d is not None and ops[d][0] == "sub" and ops[d][1] == "f32" and ops[d][2] == "x" \
                and ops[ops[d][4]][2] == "r" and ops[ops[d][3]][2] == "x" and ops[d][3] in sums \
                and _reaches(ops, ops[d][4], sums[ops[d][3]]):
            pairs[j] = sums[ops[d][3]]
        else:
            sums.setdefault(op[3], j)
    return pairs


_LEAVES = ("in", "gather", "scalar", "const", "rnumel")     # ops whose arguments are not ops


def _reaches(ops: list, i: int, target: int) -> bool:
    """Whether row-level op ``i`` is computed from op ``target`` (through row-level ops). A centre m
    made from the sum of e (a mean, a shifted mean) is inf or NaN wherever e holds an inf, as the
    parts' means are: the merged and the direct sums agree there; a centre from elsewhere would not
    ((inf - m)^2 is inf, the parts' (inf - inf) NaN)."""
    stack, seen = [i], set()
    while stack:
        k = stack.pop()
        if k == target:
            return True
        if k in seen or ops[k][2] != "r" or ops[k][0] in REDUCTIONS or ops[k][0] in _LEAVES:
            continue
        seen.add(k)
        stack.extend(a for a in ops[k][3:] if isinstance(a, int))
    return False


def split_stages(spec: GroupSpec) -> int:
    """How many kernels a split row takes: one per reduction (its partials; a centred pair of
    moment_pairs shares one), then the last."""
    return sum(op[0] in REDUCTIONS for op in spec.ops) - len(moment_pairs(spec)) + 1


def split_slots(spec: GroupSpec) -> int:
    """The partials a split row stores per part: one per reduction."""
    return sum(op[0] in REDUCTIONS for op in spec.ops)


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
    the length of K each split walks."""
    names = ["p_" + n for n in param_names(spec.pro, xr_pro, 1)] + ["w"] + (["bias"] if spec.bias else [])
    names += ["mm"] + (["e_" + n for n in param_names(spec.epi, xr_epi, 1)] if spec.epi else [])
    return names + ["ncols", "wst", "mmst"] + (["ws", "cnt", "kslice"] if split else [])


def can_split_k(spec: LinearSpec) -> bool:
    """Whether a one-row matmul group can walk K in several programs per column block (split-K): no
    epilogue (the last program to arrive finishes the columns: bias, rounding, store)."""
    return spec.epi is None


def render_linear(spec: LinearSpec, one_row: bool, xr_pro: int = 1, xr_epi: int = 1,
                  interpreted: bool = False, split: bool = False, dot: bool = False,
                  stationary: bool = False) -> tuple[str, str]:
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
    column block and row block, each remaking A's tile and the prologue."""
    if split and not (one_row and can_split_k(spec)):
        raise ValueError("a split-K matmul kernel takes one row and no epilogue")
    if dot and (one_row or split or spec.dt not in HALF):
        raise ValueError("a tl.dot matmul kernel takes several rows of fp16 or bf16")
    if stationary and not dot:
        raise ValueError("a row-stationary matmul kernel is a tl.dot one")
    kind = "m1" if one_row else "mr" if stationary else "md" if dot else "mb"
    name = (f"lin_{spec.digest[:16]}_{kind}{xr_pro}{xr_epi}"
            f"{'_s' if split else ''}{'_i' if interpreted else ''}")
    dt = TRITON_TYPES[spec.dt]
    pro = _Emitter(spec.pro, xr_pro, 1, interpreted)
    slices = [(g, g * spec.w[0]) for g in range(len(spec.w))] if spec.epi else [(0, 0)]
    lines = ["@triton.jit", f"def {name}({', '.join(linear_param_names(spec, xr_pro, xr_epi, split))}, "
             f"XBLOCK: tl.constexpr, RBLOCK: tl.constexpr, NBLOCK: tl.constexpr{', NSPLIT: tl.constexpr' if split else ''}):"]
    out = lines.append

    pro.lines = []
    pro.line("pid = tl.program_id(0)")
    if split:
        pro.line("sid = tl.program_id(1)")
    # a tl.dot kernel tiles the rows too (grid axis 1: blocks of XBLOCK rows; one block for a batched decode step)
    pro.line("xidx = (tl.program_id(1) * XBLOCK + tl.arange(0, XBLOCK))[:, None]" if dot else
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
    if split:       # (one slice: no epilogue)
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
    if split:
        out('        tl.atomic_xchg(cnt + pid, 0, sem="relaxed", scope="gpu")')
    pro.lines = []
    for k, (ref, code, *_) in r_stores:
        pro._store(k, ref, code, "xoff", "xmask & (pid == 0)", 1)
    lines += _prefixed(pro.lines, "p_")
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
    epi = _Emitter(spec.epi, xr_epi, 1, interpreted)
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


def _stationary_body(spec: LinearSpec, pro: "_Emitter", lines: list[str], slices, x_stores, r_stores, a_ref: int,
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
