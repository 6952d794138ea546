"""Triton source for a fusion group (spec.py), one kernel per variant of its launch.

The iteration space is seen as [X, R]: the kept dims (collapsed at launch into ``xr`` dims) and the
reduced ones (``rr`` dims; none for a pointwise group). Each operand, inputs and outputs alike, is
addressed through its own strides over those dims, passed at launch: broadcasts are stride 0, any
layout works, and a dim of size or stride 1 is compiled in as a constant (binaries.arg_type). One
program handles XBLOCK rows; a reduction holds a row in registers (``loop=False``, rows up to 4096
elements) or walks it in RBLOCK chunks, recomputing the pointwise ops each pass needs.

Only text is produced here: nothing imports Triton until a kernel must be compiled. A matmul group's
kernel (its prologue and epilogue written by this module's emitter) is triton_linear.py's.
"""
from __future__ import annotations

from .prims import (BINARY, COMPARE, FLOATS, HALF, LOGICAL, REDUCTIONS, TRITON_TYPES, UNARY, compute_code,
                    decode_const, literal, template)
from .spec import GroupSpec, gathered_statistics


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


class Emitter:
    def __init__(self, spec: GroupSpec, xr: int, rr: int, interpreted: bool):
        self.spec, self.xr, self.rr = spec, xr, rr
        self.row = bool(spec.red)
        self.n_in = len(spec.inputs)
        self.lines: list[str] = []
        self.interpreted = interpreted
        self.rblock = "RBLOCK"                  # the row tile's width (a matmul's epilogue: its column tile)
        self.loaded: dict[int, str] = {}       # input -> the expression that holds it (a matmul's result)
        self.i64 = False
        # the statistics loops' software pipelining (a tl.dot matmul's prologue: its loads are otherwise
        # issued one chunk at a time); None: a plain loop
        self.loop_stages: int | None = None

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
        if name == "rindex":    # (spec.check: the one reduced dim, the last; a matmul epilogue's: its columns)
            return "ridx"
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
            elif name not in _LEAVES and name not in REDUCTIONS:
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
        k = gathered_statistics(spec)
        if k is None:
            stop = "rnumel"
        else:       # (past the widest one's width: zeros)
            widest = f"gsz{k[0]}"
            for j in k[1:]:
                widest = f"tl.maximum({widest}, gsz{j})"
            stop = f"tl.minimum(rnumel, {widest})"
        for j in [i for i, op in enumerate(spec.ops) if op[0] in REDUCTIONS]:
            self._emit_r_before(j, r_done)
            self._accumulate(j, "0", stop)
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
        loop = (f"tl.range({start}, {stop}, RBLOCK, num_stages={self.loop_stages})" if self.loop_stages
                else f"range({start}, {stop}, RBLOCK)")
        self.line(f"for r0 in {loop}:")
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
    body = Emitter(spec, xr, rr if spec.red else 0, interpreted).render(name, loop, i64, stage)
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


_LEAVES = ("in", "gather", "scalar", "const", "rnumel", "rindex")     # ops whose arguments are not ops


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
