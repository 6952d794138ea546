"""Projections with their neighbours: a decode-shaped matmul (at most MAX_ROWS rows; in fp16/bf16, with
OSTINATO_DOT_ROWS, more) becomes one generated kernel together with the group that feeds it (a norm in any algebraic
form, any pointwise chain: the prologue) and the pointwise group that reads its result (bias, activation,
gating of an ``ost.multi_linear``'s slices, a residual add: the epilogue). The matmul itself is a GEMV-like
loop over K that every program runs for its block of output columns, recomputing the prologue on the fly:
the prologue's input is a few rows (L2-resident), so the norm's output is never written and read back,
and the projection's result never leaves registers before the epilogue.

The pass runs on the scheduler's result (schedule.py): a projection absorbs the fusion group or the
lone fusible node producing its input, and the one reading its result, when that moves no read across a
write (an impure node) and no value is read before the merged kernel has made it. A projection of one
row with neither neighbour is a matmul group of its own (the generated GEMV; OSTINATO_LONE_GEMV=0 keeps
cuBLAS), and so is one of more than MAX_ROWS rows where the tensor-core kernel is on (unless
OSTINATO_DOT_PICK=prologue, which moves only projections with a prologue); of 2 to MAX_ROWS rows, it stays
a cuBLAS call.

Past MAX_ROWS rows (a batched decode step) the kernel can multiply with ``tl.dot`` (tensor cores) instead
of a broadcast product and a sum: fp16/bf16 only (an fp32 ``tl.dot`` is TF32, not what eager computes), up
to ``dot_rows()`` rows. It is off unless OSTINATO_DOT_ROWS asks for it (up to MAX_DOT_ROWS): measured on an
H100, a batch-32 decode step of the hidden-4096 Llama took 3.37 ms of GPU time with it against 1.65 with
cuBLAS (each program walks all of K and recomputes the prologue's rows from L2; no split-K), though it
makes the layer 5 launches instead of 8.

OSTINATO_DOT_PICK=prologue (with OSTINATO_DOT_ROWS) moves only some of those projections to the tl.dot
kernel: those that remove a launch at the least cost (``_prologue_picks``). The kernel's cost over
cuBLAS's grows with the weight it streams, and so does its prologue's: every program (one per column
block) makes A's rows again from the prologue's inputs over all of K (a norm's twice: its statistics,
then the K loop). A launch is saved only by taking a group that would otherwise launch on its own. Over
one graph, a projection of more than MAX_ROWS rows (up to ``dot_rows()``) is a tl.dot
matmul group when

- it takes a prologue that would otherwise be a launch of its own (a lone projection stays cuBLAS's, and
  so does one with only an epilogue: a decoder's residual add goes to the next norm's group, a gating
  between two projections is the next one's prologue);
- its result is not the step's: a head (an LM head) runs once a step, not once a layer, and its
  vocabulary-wide weight is often the largest;
- its weights are lighter (bytes) than those of the heaviest projection meeting the two conditions
  above, which stays cuBLAS's, with any as heavy: the projection dominating the step's weight traffic
  keeps cuBLAS's speed (so a graph with one such projection moves none);

and it takes its epilogue too, if it has one. Where a picked projection takes as its epilogue the group
that a later one would take as its prologue, the later one has nothing left to remove and stays
cuBLAS's. In a Llama-shaped decoder layer the candidates are q/k/v (after an add + RMSNorm), gate/up
(after the second) and down (after the SwiGLU over gate/up's results); gate/up is the heaviest, so q/k/v
take their norm and down its SwiGLU: add + RMSNorm + q/k/v, attention, o (cuBLAS), add + RMSNorm, gate/up
(cuBLAS), SwiGLU + down, 6 launches a layer instead of 8 (5 with every projection moved). The add's sum
is still the residual the next add reads: the q/k/v kernel's first column block stores it, so taking the
norm saves the normalized rows' round trip and a launch, not the sum's write. GPT-2's layer (LayerNorm
before c_attn and c_fc, GELU in c_fc's op) moves c_attn: 6 launches instead of 7. Phi-3's packed gate_up
keeps its gating (a packed one is only ever an epilogue, and gate_up is the heaviest): 7. Measured on an
H200 (scripts/gpu_dot_pick.sh, docs/benchmarks/session_gpu_1127c/), the batch-32 step of the hidden-4096
Llama took 3.15 ms of GPU time with it (2.26 with the sweep's fastest knobs) against the default's 1.25:
the tl.dot kernel at 32 rows reads the weights far below cuBLAS's rate, so the pick is off by default.

Past MAX_DOT_ROWS rows (a prefill, an image's pixels), with OSTINATO_TILED_LINEAR=1, a projection with a
neighbour to take is a tl.dot matmul group tiled over blocks of rows when it is memory-bound (``tiled``:
ConvNeXt's LayerNorm -> 4x projection -> GELU at its first two stages): the norm's output and the
projection's result are then never written and read back. A lone one, or a compute-bound one (BERT's
MLP), stays a cuBLAS call. It is off by default: measured on an H100 (bf16), ConvNeXt-tiny at batch 32
took 3.42 ms of GPU time a step with it against 2.38 without; its first stage's fused kernel took 0.30 ms
a call where the cuBLAS GEMM and the GELU pass it replaces take about 0.1 (128x128 tiles, 8 warps; 64-row
tiles 0.24 ms; 64-column tiles or 4 warps slower). With K only 96-192 each program runs a loop of two or
three steps, so the pipeline never fills. That was the K-loop kernel (one program per row and column
block, each remaking A's tile and the norm; now OSTINATO_TILED_KLOOP=1); a K of at most 256 now runs a
row-stationary kernel instead (one program per block of rows makes A's tile once and walks every column
block), not measured on a GPU yet.
"""
from __future__ import annotations

import logging
import math
import os

from ..ir import Graph, Node, Value, get_op
from ..ir.ops import does_device_work
from ..ir.types import TensorMeta
from .expand import Builder, NotFusible, code_of
from .schedule import FusionGroup, Space, node_space
from .spec import LinearSpec

log = logging.getLogger("ostinato")

LINEAR_OPS = ("aten.linear", "ost.multi_linear", "ost.linear")
# ost.linear's activation as the ATen node the epilogue expands (expand.HANDLERS)
ACTIVATION_OPS = {"relu": ("aten.relu", {}), "silu": ("aten.silu", {}), "gelu": ("aten.gelu", {}),
                   "gelu_tanh": ("aten.gelu", {"approximate": "tanh"}),
                   # GPT-2's written-out form: one rounding in the generated kernel, as torch.compile's (the
                   # reference rounds at each op, as eager does: ir/fused_ops.py's gelu_new)
                   "gelu_new": ("aten.gelu", {"approximate": "tanh"})}
MAX_ROWS = 16       # decode-shaped: the GEMV-like kernel (a broadcast product summed over K)
MAX_DOT_ROWS = 128  # half dtypes, with OSTINATO_DOT_ROWS: at most this many rows in a tl.dot kernel
TILE_INTENSITY = 160    # past MAX_DOT_ROWS rows: the most FLOPs per byte of a tiled projection (``tiled``)


def linear_fusion_enabled() -> bool:
    """OSTINATO_FUSE_LINEAR=0 keeps every projection a cuBLAS call (the A/B switch)."""
    return os.environ.get("OSTINATO_FUSE_LINEAR", "1") != "0"


def lone_gemv_enabled() -> bool:
    """OSTINATO_LONE_GEMV=0 keeps a projection with no neighbour to take a cuBLAS call: one of one row, and
    one of more than MAX_ROWS rows (the tl.dot kernel's; under OSTINATO_DOT_PICK=prologue such a one stays
    cuBLAS's anyway) (the A/B switch; part of the plan key)."""
    return os.environ.get("OSTINATO_LONE_GEMV", "1") != "0"


def dot_rows() -> int:
    """The most rows a matmul group of fp16/bf16 takes: OSTINATO_DOT_ROWS (MAX_DOT_ROWS at most; unset, MAX_ROWS or
    less: no tl.dot kernel, projections of more than MAX_ROWS rows stay cuBLAS calls, the default; the A/B
    switch, part of the plan key)."""
    raw = os.environ.get("OSTINATO_DOT_ROWS")
    if raw is None:
        return MAX_ROWS
    try:
        rows = int(raw)
    except ValueError:
        rows = -1
    if rows < 0 or rows > MAX_DOT_ROWS:
        raise ValueError(f"OSTINATO_DOT_ROWS={raw!r}: a row count up to {MAX_DOT_ROWS} ({MAX_ROWS} switches the tl.dot "
                         "kernel off)")
    return max(rows, MAX_ROWS)


DOT_PICKS = ("all", "prologue")


def dot_pick() -> str:
    """Which projections of more than MAX_ROWS rows (up to dot_rows()) are tl.dot matmul groups:
    OSTINATO_DOT_PICK=all (unset: the default) every one with a neighbour, and lone ones (OSTINATO_LONE_GEMV);
    ``prologue`` only those _prologue_picks chooses (the module's note; part of the plan key)."""
    raw = os.environ.get("OSTINATO_DOT_PICK", "all")
    if raw not in DOT_PICKS:
        raise ValueError(f"OSTINATO_DOT_PICK={raw!r}: one of {', '.join(DOT_PICKS)}")
    return raw


def dot_key() -> str:
    """The tl.dot kernel's switches as a part of the CUDA plan key: empty while it is off (the default)."""
    if dot_rows() == MAX_ROWS:
        return ""
    return f"-dotrows{dot_rows()}" + ("" if dot_pick() == "all" else f"-pick{dot_pick()}")


def tiled_linear_enabled() -> bool:
    """OSTINATO_TILED_LINEAR=1 makes ``tiled`` projections matmul groups (off by default: the module's
    note; part of the plan key)."""
    return os.environ.get("OSTINATO_TILED_LINEAR", "0") == "1"


def tiled(rows: int, k: int, n: int, code: str) -> bool:
    """Whether a projection of ``rows`` rows, ``k`` -> ``n`` (all slices' columns), may be a tl.dot matmul
    group tiled over its rows (a prefill's or an image's many rows; taken only with a neighbour to fuse):
    fp16/bf16, more than MAX_DOT_ROWS rows, int32 offsets, and memory-bound, so that the bytes a fused
    neighbour saves (the result written and read back, the norm's output) are the step's cost: its FLOPs
    per byte of A and result, k*n/(k+n), at most TILE_INTENSITY. Past that (BERT's 768 -> 3072: 614)
    cuBLAS's tensor-core schedule is worth more than the pass an epilogue saves."""
    return (tiled_linear_enabled() and code in ("f16", "bf16") and rows > MAX_DOT_ROWS and min(k, n) >= 16
            and k * n <= TILE_INTENSITY * (k + n) and rows * max(k, n) < 2 ** 31)


def max_rows(code: str) -> int:
    """The most rows a matmul group of dtype ``code`` takes."""
    return dot_rows() if code in ("f16", "bf16") else MAX_ROWS


def _static(shape) -> bool:
    return all(isinstance(d, int) for d in shape)


def linear_parts(node: Node) -> tuple[Value, list[Value], list[Value] | None, str | None, bool] | None:
    """(x, weights, biases, activation, transposed) of a projection the generated kernel takes, else
    None: static shapes, a float dtype shared by all, at most MAX_ROWS rows (max_rows: more in fp16/bf16),
    constant [N, K] weights, or one [K, N] weight (``ost.linear``'s ``weight_t``: GPT-2's Conv1D; ``transposed`` then)."""
    activation, weight_t = None, False
    if node.op == "ost.linear":
        x, w, b, *rest = node.args
        activation = rest[0] if rest else node.kwargs.get("activation")
        weight_t = bool(rest[1] if len(rest) > 1 else node.kwargs.get("weight_t", False))
        if activation is not None and activation not in ACTIVATION_OPS:
            return None
        weights, biases = [w], None if b is None else [b]
    elif node.op == "aten.linear":
        x, w = node.args[0], node.args[1]
        b = node.args[2] if len(node.args) > 2 else node.kwargs.get("bias")
        weights, biases = [w], None if b is None else [b]
    elif node.op == "ost.multi_linear" and not node.kwargs:
        x, weights, biases = node.args
        weights = list(weights)
        biases = None if biases is None else list(biases)
    else:
        return None
    if not isinstance(x, Value) or not isinstance(x.meta, TensorMeta) or not _static(x.meta.shape):
        return None
    shape = tuple(x.meta.shape)
    code = code_of(x)
    if len(shape) < 2 or code not in ("f16", "bf16", "f32") or shape[-1] < 2 or math.prod(shape[:-1]) < 1:
        return None
    k_dim = 0 if weight_t else 1    # the weight's dim of size K
    for w in weights:
        if not (isinstance(w, Value) and w.role == "constant" and isinstance(w.meta, TensorMeta)
                and code_of(w) == code and _static(w.meta.shape) and len(w.meta.shape) == 2
                and w.meta.shape[k_dim] == shape[-1]):
            return None
    for b, w in zip(biases or (), weights):
        if not (isinstance(b, Value) and b.role == "constant" and code_of(b) == code
                and tuple(b.meta.shape) == (w.meta.shape[1 - k_dim],)):
            return None
    if len(node.outputs) != len(weights) or any(v is None for v in node.outputs):
        return None
    rows, n = math.prod(shape[:-1]), sum(int(w.meta.shape[1 - k_dim]) for w in weights)
    if rows > max_rows(code) and not tiled(rows, shape[-1], n, code):
        return None
    return x, weights, biases, activation, weight_t


def _activation_node(node: Node, activation: str) -> Node:
    """ost.linear's activation as a node of its own (outside the graph) reading the projection's result,
    a Value made for it (never stored: the epilogue computes the activation on the result's tile)."""
    out = node.outputs[0]
    pre = Value(-1 - out.id, f"{out.name}_pre", out.meta, "temp", node)
    op, kwargs = ACTIVATION_OPS[activation]
    act = Node(op, (pre,), dict(kwargs), node.name, node.source)
    act.outputs = [out]
    return act


# a packed gating reading both halves of one projection's result, and its form over the two halves
_PACKED_GATED = {"ost.swiglu_packed": "ost.swiglu", "ost.geglu_packed": "ost.geglu"}


def _packed_gating(node: Node, weights: list[Value], weight_t: bool, users: dict, graph_reads: set[int],
                   holder: dict) -> tuple[Node, Node, list[Value]] | None:
    """(the lone ``ost.swiglu_packed``/``geglu_packed`` node reading the projection's result and nothing
    else reading it, that gating as a node (outside the graph) over two Values standing for the halves,
    those Values), else None. The halves are the first and last rows of the one weight: the epilogue
    reads them as two slices of one packed weight (LinearSpec.one_weight)."""
    if len(weights) != 1 or weight_t or len(node.outputs) != 1:
        return None
    y = node.outputs[0]
    readers = users.get(y.id, ())
    if y.id in graph_reads or len(readers) != 1 or readers[0].op not in _PACKED_GATED:
        return None
    gate = readers[0]
    if holder.get(id(gate)) is not gate or gate.args[:1] != (y,) or set(gate.kwargs) - {"approximate"}:
        return None
    n = y.meta.shape[-1]
    if n % 2 or len(gate.outputs) != 1 or gate.outputs[0] is None:
        return None
    meta = TensorMeta(y.meta.dtype, (*y.meta.shape[:-1], n // 2))
    halves = [Value(-2 - 2 * y.id - k, f"{y.name}_{part}", meta, "temp", node) for k, part in enumerate(("gate", "up"))]
    half_node = Node(_PACKED_GATED[gate.op], (*halves, *gate.args[1:]), dict(gate.kwargs), gate.name, gate.source)
    half_node.outputs = list(gate.outputs)
    return gate, half_node, halves


class LinearGroup(FusionGroup):
    """A projection with its prologue and epilogue nodes, lowered as one ``ost.fused`` launch like any
    fusion group (its ``space`` is None: the spec holds the prologue's and the epilogue's)."""

    def __init__(self, nodes: list[Node], spec: LinearSpec, inputs: list[Value], outputs: list[Value],
                 launch_at: int):
        super().__init__(nodes, None, closed=True, launch_at=launch_at)
        self.spec, self.inputs, self.outputs = spec, inputs, outputs


def _build(nodes: list[Node], shape: tuple, read_outside: set[int]):
    """A group of ``nodes`` over ``shape`` walked as [..., last dim] (schedule.FusionGroup.build)."""
    g = FusionGroup(list(nodes), Space(tuple(shape), (len(shape) - 1,)))
    g.build(read_outside)
    return g


def absorb_linears(graph: Graph, items: list, users: dict, graph_reads: set[int]) -> list:
    """``items`` (the scheduler's result, in run order) with each projection that has a prologue or an
    epilogue to take replaced by a LinearGroup."""
    position = {id(n): i for i, n in enumerate(graph.nodes)}
    impure = [i for i, n in enumerate(graph.nodes) if get_op(n.op) is None or not get_op(n.op).pure]
    items = list(items)

    def members(item) -> list[Node]:
        return item.nodes if isinstance(item, FusionGroup) else [item]

    def run_at(item) -> int:
        return item.launch_at if isinstance(item, FusionGroup) else position[id(item)]

    def item_of() -> tuple[dict[int, object], dict[int, object]]:
        """(value id -> the item making it, node id -> the item holding it)."""
        by_value, by_node = {}, {}
        for it in items:
            for n in members(it):
                by_node[id(n)] = it
                for v in n.outputs:
                    if v is not None:
                        by_value[v.id] = it
        return by_value, by_node

    def row_space(item, shape: tuple, pointwise: bool) -> bool:
        """Whether a group or lone node works over exactly ``shape`` (reducing its last dim at most)."""
        if isinstance(item, FusionGroup):
            sp = item.space     # None for a LinearGroup
            if sp is not None and sp.short:
                return False
        else:
            sp = node_space(item, users, graph_reads)
        return sp is not None and not sp.split and tuple(sp.shape) == shape and (
            sp.red == () or (not pointwise and sp.red == (len(shape) - 1,)))

    owner, holder = item_of()       # kept up to date as groups replace items (each node is in one item)
    # A one-row projection with no neighbour is a matmul group too: on an H200, cuBLAS read a Llama-1B
    # layer's down projection (K 8192) at 2.5 TB/s with a split-K reduce after it, and its output
    # projection at 1.5 TB/s, where the generated GEMV read the gate/up weights at 3.4 TB/s. One of more
    # than MAX_ROWS rows (fp16/bf16, the opt-in tl.dot kernel) likewise, so a batched decode step's output
    # and down projections are generated kernels as a one-row step's are (on an H100 slower than cuBLAS:
    # the module's note).
    lone = lone_gemv_enabled()
    keys = [run_at(it) for it in items]

    def neighbours(node: Node):
        """(linear_parts, the prologue, the epilogue, ost.linear's activation node, a packed gating's
        halves) of a projection the generated kernel takes, over the items as they stand; else None."""
        parts = linear_parts(node)
        if parts is None:
            return None
        x, weights, biases, activation, weight_t = parts
        outs = list(node.outputs)
        pro = owner.get(x.id)
        if pro is not None and not row_space(pro, tuple(x.meta.shape), pointwise=False):
            pro = None
        # the epilogue: the first group (or lone node) reading the projection's results, pointwise over
        # one slice's shape and reading every slice
        epi = None
        act = _activation_node(node, activation) if activation is not None else None
        same_shape = len({tuple(v.meta.shape) for v in outs}) == 1
        readers = [] if act is not None or not same_shape else sorted(
            {id(holder[id(u)]): holder[id(u)] for v in outs for u in users.get(v.id, ()) if id(u) in holder}.values(),
            key=run_at)
        for cand in readers:
            if cand is pro or not row_space(cand, tuple(outs[0].meta.shape), pointwise=True):
                continue
            cand_nodes = {id(n) for n in members(cand)}
            if all(any(id(u) in cand_nodes for u in users.get(v.id, ())) for v in outs):
                epi = cand
                break
        halves = None
        if epi is None and act is None:
            halves = _packed_gating(node, weights, weight_t, users, graph_reads, holder)
            epi = halves[0] if halves is not None else None
        return parts, pro, epi, act, halves

    projections = [it for it in items if isinstance(it, Node) and it.op in LINEAR_OPS]
    picked = _prologue_picks(projections, neighbours, graph_reads) if dot_pick() == "prologue" else None
    for node in projections:
        found = neighbours(node)
        if found is None:
            continue
        (x, weights, biases, activation, weight_t), pro, epi, act, halves = found
        rows = math.prod(x.meta.shape[:-1])
        if rows > MAX_DOT_ROWS:
            if pro is None and epi is None and act is None:
                continue    # a tiled projection is worth it only for the pass a neighbour saves
        elif rows > MAX_ROWS and picked is not None:
            if id(node) not in picked or pro is None:
                continue    # (pro None: an earlier pick took it as its epilogue)
        elif pro is None and epi is None and not (lone and (rows == 1 or rows > MAX_ROWS)):
            continue        # 2..MAX_ROWS rows and no neighbour (an activation alone included): cuBLAS
        group = _merge(node, x, weights, biases, weight_t, pro, epi, act, members, run_at, position, impure,
                       users, graph_reads, items, keys, halves[1:] if halves is not None else None)
        if group is None:
            continue
        at = items.index(epi if epi is not None else node)
        items[at] = group
        kept = [k for k, it in enumerate(items) if it is not pro and it is not node and it is not epi or it is group]
        items, keys = [items[k] for k in kept], [keys[k] for k in kept]   # the group launches where it stood
        for n in group.nodes:
            holder[id(n)] = group
            for v in n.outputs:
                if v is not None:
                    owner[v.id] = group
    return items


def _weight_bytes(weights: list[Value]) -> int:
    return sum(math.prod(w.meta.shape) * w.meta.dtype.itemsize for w in weights)


def _prologue_picks(projections: list[Node], neighbours, graph_reads: set[int]) -> set[int]:
    """The ids of the projections of more than MAX_ROWS rows (up to dot_rows()) that OSTINATO_DOT_PICK=prologue
    makes tl.dot matmul groups (the module's note): each takes a prologue that would otherwise be a launch
    of its own, leaves the step's result to other nodes (not a head), and is lighter (weight bytes) than
    the heaviest such projection, which stays cuBLAS's with all as heavy as it. ``neighbours``:
    absorb_linears' (linear_parts, prologue, ...) of a projection, over the scheduler's items."""
    takers = {}
    for node in projections:
        found = neighbours(node)
        if found is None:
            continue
        (x, weights, *_), pro = found[0], found[1]
        if not MAX_ROWS < math.prod(x.meta.shape[:-1]) <= dot_rows():
            continue
        if pro is None or not (isinstance(pro, FusionGroup) or does_device_work(pro.op)):
            continue    # no launch of its own to remove
        if any(v is not None and v.id in graph_reads for v in node.outputs):
            continue    # a head: once a step, not once a layer
        takers[id(node)] = _weight_bytes(weights)
    heaviest = max(takers.values(), default=0)
    return {k for k, size in takers.items() if size < heaviest}


def _merge(node, x, weights, biases, weight_t, pro, epi, act, members, run_at, position, impure, users, graph_reads,
           items, keys, halves=None):
    """The LinearGroup of ``node`` with ``pro``/``epi`` (None when moving them together is not legal);
    ``act``: ost.linear's activation node, the epilogue then; ``keys``: each item's ``run_at``;
    ``weight_t``: the one weight is stored [K, N]; ``halves``: (the epilogue's node over the two halves
    of the one weight's result, those halves) when ``epi`` is a packed gating (_packed_gating)."""
    pro_nodes = members(pro) if pro is not None else []
    epi_members = members(epi) if epi is not None else []
    epi_nodes = [halves[0]] if halves else epi_members or ([act] if act is not None else [])
    # the projection's own values
    results = list(halves[1]) if halves else [act.args[0]] if act is not None else list(node.outputs)
    first = run_at(pro) if pro is not None else position[id(node)]
    launch = run_at(epi) if epi is not None else position[id(node)]
    if any(first < p < launch for p in impure):
        return None         # a state write between: the prologue's reads must not move across it
    made = {v.id for n in (*pro_nodes, node) for v in n.outputs if v is not None}
    for it, at in zip(items, keys):
        if not first <= at < launch or it is pro or it is epi or it is node:
            continue
        if any(v.id in made for n in members(it) for v in n.inputs):
            return None     # read before the merged kernel makes it
    pro_made = {v.id for n in pro_nodes for v in n.outputs if v is not None}
    if any(v.id in pro_made for n in epi_nodes for v in n.inputs):
        return None         # the epilogue's tile cannot read the prologue's [..., K] values

    def read_by_others(v: Value, inside: set[int]) -> bool:
        return v.id in graph_reads or any(id(u) not in inside for u in users.get(v.id, ()))

    code = code_of(x)
    xshape = tuple(x.meta.shape)
    try:
        if pro_nodes:
            inside = {id(n) for n in pro_nodes}
            read = {v.id for n in pro_nodes for v in n.outputs if v is not None and read_by_others(v, inside)}
            g = _build(pro_nodes, xshape, read | {x.id})
            pro_spec, pro_vals, pro_outs = g.spec, g.inputs, g.outputs
            pro_in = len(pro_spec.inputs)
            a = pro_outs.index(x)
            pro_store = [v is not x or read_by_others(x, inside | {id(node)}) for v in pro_outs]
        else:
            b = Builder(len(xshape), [len(xshape) - 1], xshape)
            ref = b.value(x)
            pro_spec, pro_vals, pro_outs, pro_in = b.spec([[ref, code, "x", True]]), [x], [x], 1
            a, pro_store = 0, [False]
        mm_inside = {id(n) for n in epi_nodes}
        mm_store = [read_by_others(v, mm_inside) for v in results]
        epi_spec, acc, epi_vals, epi_in, epi_outs = None, [], [], 0, []
        if epi_nodes:
            inside = {id(n) for n in epi_nodes}
            read = {v.id for n in epi_nodes for v in n.outputs if v is not None and read_by_others(v, inside)}
            e = _build(epi_nodes, tuple(results[0].meta.shape), read)
            epi_spec, epi_outs = e.spec, e.outputs
            epi_in = len(epi_spec.inputs)
            tensors = e.inputs[:epi_in]
            ids = [v.id for v in tensors]
            acc = [ids.index(v.id) if v.id in ids else -1 for v in results]
            if -1 in acc:
                return None
            epi_vals = [v for k, v in enumerate(e.inputs) if k not in acc]
            if any(v in results for v in epi_vals):
                return None     # a slice read in another form (unsqueezed) than the tile's
        rows = [int(v.meta.shape[-1]) for v in results] if halves else \
            [int(w.meta.shape[1 if weight_t else 0]) for w in weights]
        spec = LinearSpec(pro_spec, a, pro_store, rows, biases is not None, code, mm_store, epi_spec, acc, weight_t,
                          bool(halves))
        spec.check()
    except (NotFusible, ValueError) as err:
        log.debug("ostinato fusion: %s left with cuBLAS: %s", node.name, err)
        return None
    inputs = [*pro_vals[:pro_in], *weights, *(biases or ()), *epi_vals[:epi_in - len(acc)],
              *pro_vals[pro_in:], *epi_vals[epi_in - len(acc):]]
    outputs = [v for v, keep in zip(pro_outs, pro_store) if keep]
    outputs += [v for v, keep in zip(results, mm_store) if keep] + list(epi_outs)
    nodes = sorted({id(n): n for n in (*pro_nodes, node, *epi_members, *epi_nodes) if id(n) in position}.values(),
                   key=lambda n: position[id(n)])
    return LinearGroup(nodes, spec, inputs, outputs, launch)
