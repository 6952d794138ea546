"""The scheduler: group a graph's nodes into fusion groups, each to become one generated kernel.

A group has one iteration space: a shape S and the dims R it reduces (none for a pointwise group).
Every member computes either a value of shape S ("x" level) or one value per row, S with 1 in every
dim of R ("r" level): so no member is recomputed for more elements than eager computes it, and every
intermediate a group absorbs is a tensor that is never written to memory nor read back. That is the
cost model: a merge always saves 2 x the intermediate's bytes and a launch, and the iteration-space
rule forbids the merges that would recompute (a small tensor's ops repeated across a broadcast).

Nodes are visited in graph order. A node the code generator can express (expand.HANDLERS) joins the
open groups that produce its inputs when their spaces combine; a group is closed as soon as a node
outside it reads one of its values (its kernel must have run by then) and when an impure node runs
(a state write must not move across a group's reads). Groups of one node stay ordinary ATen nodes:
torch's kernel for one op is as good as a generated one, except a copy of a permuted or expanded view
(_strided_copy: attention's heads made dense before a batched matmul), where torch's generic copy kernel
was slower than the generated one, and a lone ost.row_scale, whose reference is several torch kernels. A group's kernel runs where its last member stood; its outputs are
the members' values read outside it or returned by the graph.

One exception to the space rule: a small pointwise group (or lone node) whose values only one group
reads, broadcast into that group's space, is computed inside it again per element
(_broadcast_producers): a few ops per element cost less than a launch and a round trip.
"""
from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field

from ..ir import Graph, Node, Value, get_op
from ..ir.types import TensorMeta
from .expand import HANDLERS, Builder, Kind, NotFusible, _f, code_of
from .spec import GroupSpec

log = logging.getLogger("ostinato")

# OSTINATO_FUSION=0 turns generic fusion off (every node lowers on its own): the A/B switch.
def fusion_enabled() -> bool:
    return os.environ.get("OSTINATO_FUSION", "1") != "0"


def _same_dim(a, b) -> bool:
    return a is b or a == b


def _same_shape(a: tuple, b: tuple) -> bool:
    return len(a) == len(b) and all(_same_dim(x, y) for x, y in zip(a, b))


def _strip(shape: tuple) -> tuple:
    """The shape without its leading 1-dims: () and (1,) hold the same elements in the same order."""
    i = 0
    while i < len(shape) and shape[i] == 1:
        i += 1
    return tuple(shape[i:])


def row_shape(shape: tuple, red: tuple) -> tuple:
    return tuple(1 if i in red else d for i, d in enumerate(shape))


@dataclass
class Space:
    shape: tuple
    red: tuple = ()
    # (dim, groups): the dim is iterated as [groups, size / groups] (group norm's statistics per group);
    # ``red`` then counts dims of the split shape, and only values of ``shape`` itself are members.
    split: tuple | None = None
    short: bool = False     # a pointwise space holding values of fewer dims (leading 1s dropped)

    @property
    def rank(self) -> int:
        return len(self.shape) + (1 if self.split else 0)

    def combine(self, other: "Space") -> "Space | None":
        """The space holding both, or None when no space holds both without recomputation."""
        if (self.short and (other.red or other.split)) or (other.short and (self.red or self.split)):
            return None     # a shorter member would be taken for a per-row value of the reduction
        if self.split or other.split:
            a, b = (self, other) if self.split else (other, self)
            if not _same_shape(a.shape, b.shape):
                return None
            if b.split is None and not b.red or (b.split == a.split and b.red == a.red):
                return a
            return None
        if not self.red and not other.red and _same_shape(_strip(self.shape), _strip(other.shape)):
            longer = self if len(self.shape) >= len(other.shape) else other    # pointwise: leading 1s aside
            short = self.short or other.short or len(self.shape) != len(other.shape)
            return Space(longer.shape, (), None, short)
        if _same_shape(self.shape, other.shape) and (not self.red or not other.red or self.red == other.red):
            return Space(self.shape, self.red or other.red)
        for a, b in ((self, other), (other, self)):
            if a.red and not b.red and _same_shape(b.shape, row_shape(a.shape, a.red)):
                return a
        return None

    def holds(self, meta) -> bool:
        """Whether a value of this meta is a member value of the space (x or r level, right rank)."""
        if not isinstance(meta, TensorMeta):
            return False
        if self.split:
            return _same_shape(meta.shape, self.shape)
        if not self.red:
            return _same_shape(_strip(tuple(meta.shape)), _strip(self.shape)) and len(meta.shape) <= len(self.shape)
        return _same_shape(meta.shape, self.shape) or bool(self.red) and _same_shape(
            meta.shape, row_shape(self.shape, self.red))


@dataclass
class FusionGroup:
    nodes: list[Node]
    space: Space
    closed: bool = False
    merged_into: "FusionGroup | None" = None    # set when another group absorbed this one
    launch_at: int = -1     # the graph position whose place the kernel takes (nodes hoisted in later keep it)
    # (value, bias, unsq) of convolutions run without their bias: the group adds it where it loads the
    # convolution's result (or a permute of it), the bias unsqueezed to its channel dim (conv.py)
    prologues: list = field(default_factory=list)
    # Filled by build():
    spec: GroupSpec | None = None
    inputs: list[Value] = field(default_factory=list)     # tensor inputs, then host scalars
    outputs: list[Value] = field(default_factory=list)

    @property
    def name(self) -> str:
        return f"fused_{self.nodes[0].name}__{self.nodes[-1].name}"

    def build(self, read_outside: set[int]) -> None:
        """The group's spec; its inputs and outputs (values read outside it, by id in ``read_outside``)."""
        b = Builder(self.space.rank, list(self.space.red), self.space.shape, self.space.split)
        for v, bias, unsq in self.prologues:
            code = code_of(v)
            raw = b.value(v)
            added = b.emit("add", code, _f(b, raw, code), _f(b, b.value(bias, unsq), code))
            b.refs[v.id] = b.cast(added, code)
            b.biased.add(v.id)
        produced: list[Value] = []
        for node in self.nodes:
            refs = HANDLERS[node.op].emit(b, node)
            for v, ref in zip(node.outputs, refs):
                if v is None:
                    continue
                if ref is None:
                    if v.id in read_outside:
                        raise NotFusible(f"{node.op} result {v.name} is read")
                    continue
                if b.code(ref) != code_of(v):
                    ref = b.cast(ref, code_of(v))
                b.refs[v.id] = ref
                produced.append(v)
        outputs = []
        for v in produced:
            if v.id not in read_outside:
                continue
            ref = b.refs[v.id]
            is_x = _same_shape(v.meta.shape, self.space.shape) or not self.space.red and self.space.holds(v.meta)
            level = "x" if is_x else "r"
            if is_x and not self.space.red and b.level(ref) == "r":
                # a pointwise group's value computed from constants only: not worth a kernel's output
                raise NotFusible(f"{v.name} is a constant")
            rank = len(v.meta.shape)
            outputs.append([ref, code_of(v), level, rank == len(self.space.shape)]
                           + ([rank] if level == "x" and rank != len(self.space.shape) else []))
            self.outputs.append(v)
        if not outputs:
            raise NotFusible("the group's results are never read")
        self.spec = b.spec(outputs)
        self.spec.check()
        self.inputs = b.input_values + b.scalar_values

    def bytes_moved(self, bindings: dict | None = None) -> int | None:
        """Bytes the kernel reads and writes (each input and output once; an input that is a broadcasting
        view reads its source's elements, a gathered one at most one element per element of the space);
        None when a shape is symbolic."""
        def numel(shape) -> int | None:
            n = 1
            for d in shape:
                if not isinstance(d, int):
                    if bindings is None:
                        return None
                    d = d.evaluate(bindings)
                n *= d
            return n

        total = 0
        spec_inputs = self.spec.inputs if isinstance(self.spec, GroupSpec) else ()   # a matmul group has none
        gathered = {v.id for v, i in zip(self.inputs, spec_inputs) if i[1] == "g"}
        space = numel(self.space.shape) if self.space is not None else None
        for v in (*self.inputs, *self.outputs):
            if not isinstance(v.meta, TensorMeta):
                continue
            n = numel(v.meta.shape)
            if n is None:
                return None
            src = v
            while src.producer is not None and src.producer.op in _VIEWS and src.producer.args \
                    and isinstance(src.producer.args[0], Value) and isinstance(src.producer.args[0].meta, TensorMeta):
                src = src.producer.args[0]
                m = numel(src.meta.shape)
                if m is None:
                    break
                n = min(n, m)
            if v.id in gathered and space is not None:
                n = min(n, space)
            total += n * v.meta.dtype.itemsize
        return total


def node_space(node: Node, users: dict[int, list[Node]], graph_reads: set[int]) -> Space | None:
    """The node's own iteration space when the code generator can take it, else None."""
    handler = HANDLERS.get(node.op)
    if handler is None:
        return None
    if not any(isinstance(v, Value) and isinstance(v.meta, TensorMeta) for v in node.inputs):
        return None
    kind: Kind | None = handler.kind(node)
    if kind is None:
        return None
    if kind.red:
        x = kind.reduced
        if not kind.split and all(x.meta.shape[d] == 1 for d in kind.red):
            return None         # reducing size-1 dims is a copy
        space = Space(tuple(x.meta.shape), kind.red, kind.split)
    else:
        out0 = node.outputs[0]
        if out0 is None or not isinstance(out0.meta, TensorMeta):
            return None
        space = Space(tuple(out0.meta.shape))
    # A trial expansion in the node's own space: dtypes and arguments the generator cannot take.
    try:
        b = Builder(space.rank, list(space.red), space.shape, space.split)
        refs = handler.emit(b, node)
    except NotFusible:
        return None
    for v, ref in zip(node.outputs, refs):
        if v is None:
            continue
        if ref is None:
            if users.get(v.id) or v.id in graph_reads:
                return None
        elif code_of(v) is None or not (space.holds(v.meta) or kind.red and not kind.keepdim):
            return None
    return space


def read_outside(nodes: list[Node], users: dict, graph_reads: set[int]) -> set[int]:
    """Ids of the values ``nodes`` make that a node outside them or the graph reads (a group's outputs)."""
    ids = {id(n) for n in nodes}
    out = set(graph_reads)
    for n in nodes:
        for v in n.outputs:
            if v is not None and any(id(u) not in ids for u in users.get(v.id, ())):
                out.add(v.id)
    return out


_MAX_RECOMPUTED = 8     # nodes of a broadcast producer group computed again per element of its reader

_COPIES = ("aten.clone", "aten._to_copy", "aten.to.dtype", "prims.convert_element_type")
# fused ops whose reference is a chain of torch kernels: a generated kernel even alone (ost.row_scale: the
# statistic of a folded norm, passes/fold_norms.py, where no group reads it)
_GENERATED_ALONE = ("ost.row_scale",)
_REORDERING = ("aten.permute", "aten.transpose.int", "aten.t", "aten.expand")
_VIEWS = _REORDERING + ("aten.view", "aten.reshape", "aten._unsafe_view", "aten.unsqueeze", "aten.squeeze",
                        "aten.squeeze.dim", "aten.squeeze.dims", "aten.alias", "aten.slice.Tensor",
                        "aten.select.int")


def _gathered_inputs(node: Node) -> set[int]:
    """Ids of the values ``node`` reads at computed positions (a gather's input): they come from memory,
    so the group computing one must have run before the node's group, never be the same group."""
    if node.op == "aten.gather" and node.args and isinstance(node.args[0], Value):
        return {node.args[0].id}
    return set()


def strided_copies_enabled() -> bool:
    """OSTINATO_FUSE_STRIDED_COPIES=0 leaves a lone copy of a permuted view to torch (the A/B switch)."""
    return os.environ.get("OSTINATO_FUSE_STRIDED_COPIES", "1") != "0"


def _strided_copy(node: Node) -> bool:
    """A copy (or dtype conversion) of a view that reorders or broadcasts its source's elements:
    a permute, transpose or expand on the way back through views to a tensor."""
    if node.op not in _COPIES or not node.args or not isinstance(node.args[0], Value):
        return False
    v = node.args[0]
    while v.producer is not None and v.producer.op in _VIEWS:
        if v.producer.op in _REORDERING:
            return True
        src = v.producer.args[0] if v.producer.args else None
        if not isinstance(src, Value):
            return False
        v = src
    return False


def _broadcast_producers(g: FusionGroup, group_of_node: dict, free: set[int], users: dict, graph_reads: set[int],
                         position: dict, impure_at: list[int]) -> list[FusionGroup]:
    """Pointwise groups (lone nodes included) of another space whose values only ``g`` reads, to compute
    inside ``g``'s kernel: values broadcast into g's space (DiT's ``1 + scale[:, None]`` before its
    modulation, a squeeze-excite gate), which the space rule keeps out of g. Recomputing a few pointwise
    ops per element of g costs less than their own launch and the round trip of their result. Chains are
    taken too; never across an impure node (the producers' inputs must hold at g's launch what they held
    at their own place). ``free``: ids of the groups not built nor taken yet."""
    taken: list[FusionGroup] = []
    ids = {id(n) for n in g.nodes}
    stack = list(g.nodes)
    while stack:
        n = stack.pop()
        from_memory = _gathered_inputs(n)
        for v in n.inputs:
            if v.id in from_memory:
                continue
            h = group_of_node.get(id(v.producer)) if v.producer is not None else None
            if h is None or h is g or id(h) not in free or h.space.red or h.space.split \
                    or len(h.nodes) > _MAX_RECOMPUTED:
                continue
            inside = ids | {id(m) for m in h.nodes}
            made = [o for m in h.nodes for o in m.outputs if o is not None]
            if any(o.id in graph_reads or any(id(u) not in inside for u in users.get(o.id, ())) for o in made):
                continue
            first = min(position[id(m)] for m in h.nodes)
            if any(first < i <= g.launch_at for i in impure_at):
                continue
            free.discard(id(h))
            ids = inside
            taken.append(h)
            stack.extend(h.nodes)
    return taken


def schedule(graph: Graph, channels_last: frozenset = frozenset()) -> list[Node | FusionGroup]:
    """The graph's nodes in order, chains of fusible nodes replaced by FusionGroups; ``channels_last``:
    the names of the convolutions the backend runs NHWC."""
    users = graph.users()
    graph_reads = {v.id for v in graph.output_values()}
    graph_reads |= {t.id for t, new in graph.mutations} | {new.id for t, new in graph.mutations}
    group_of: dict[int, FusionGroup] = {}
    groups: list[FusionGroup] = []
    readers_of: dict[int, list[FusionGroup]] = {}   # value id -> groups reading it

    def close_readers_of(node: Node) -> None:
        for v in node.inputs:
            g = group_of.get(v.id)
            if g is not None:
                g.closed = True

    position = {id(n): i for i, n in enumerate(graph.nodes)}
    last_impure = -1

    def resolve(g: FusionGroup) -> FusionGroup:
        while g.merged_into is not None:
            g = g.merged_into
        return g

    def hoistable(node: Node, g: FusionGroup) -> bool:
        """Whether ``node`` may run at ``g``'s launch (earlier than it stands): every input is g's, a
        constant, a value some pure node made before that point, or an input or state buffer no impure
        node has written since."""
        for v in node.inputs:
            h = group_of.get(v.id)
            if h is not None and resolve(h) is g:
                continue
            if v.producer is None:
                if v.role != "constant" and last_impure > g.launch_at:
                    return False
                continue
            producer = get_op(v.producer.op)
            if producer is None or not producer.pure or position[id(v.producer)] >= g.launch_at:
                return False
        return True

    for pos, node in enumerate(graph.nodes):
        opdef = get_op(node.op)
        if opdef is None or not opdef.pure:
            for g in groups:
                g.closed = True
            last_impure = pos
            continue
        space = node_space(node, users, graph_reads)
        if space is None:
            close_readers_of(node)
            continue
        from_memory = _gathered_inputs(node)
        for vid in from_memory:     # a gather reads its input from memory: its group must have run
            g = group_of.get(vid)
            if g is not None:
                resolve(g).closed = True
        candidates: list[FusionGroup] = []      # groups producing the node's inputs
        for v in node.inputs:
            g = group_of.get(v.id)
            if g is not None and not g.closed and g not in candidates and v.id not in from_memory:
                candidates.append(g)
        siblings: list[FusionGroup] = []        # groups reading one of the node's inputs (horizontal fusion)
        for v in node.inputs:
            for g in readers_of.get(v.id, ()):
                while g.merged_into is not None:
                    g = g.merged_into
                if not g.closed and g not in candidates and g not in siblings:
                    siblings.append(g)
        target = space
        merged: list[FusionGroup] = []
        for g in candidates + siblings:
            combined = target.combine(g.space)
            # every value the node reads from the merged groups must be a member value of the space
            if combined is not None and all(combined.holds(v.meta) for v in node.inputs
                                            if group_of.get(v.id) in (*merged, g)):
                target = combined
                merged.append(g)
        for g in candidates:
            if g not in merged:
                g.closed = True          # the node reads its value from outside it
        if not merged:
            # A node reading only a closed group's values (and older ones) joins it, run at its launch.
            producers = {id(resolve(group_of[v.id])): resolve(group_of[v.id]) for v in node.inputs if v.id in group_of}
            if len(producers) == 1 and not any(vid in group_of for vid in from_memory):
                (g,) = producers.values()
                combined = g.space.combine(space)
                if g.closed and combined is not None and combined.shape == g.space.shape \
                        and combined.red == g.space.red and combined.split == g.space.split and hoistable(node, g) \
                        and all(combined.holds(v.meta) for v in node.inputs if v.id in group_of):
                    g.nodes.append(node)
                    g.space = combined
                    for v in node.outputs:
                        if v is not None:
                            group_of[v.id] = g
                    continue
        if merged:
            group = merged[0]
            for g in merged[1:]:
                group.nodes.extend(g.nodes)
                groups.remove(g)
                g.merged_into = group
                for n in g.nodes:
                    for v in n.outputs:
                        if v is not None:
                            group_of[v.id] = group
            group.nodes.append(node)
            group.space = target
            group.launch_at = pos
        else:
            group = FusionGroup([node], target, launch_at=pos)
            groups.append(group)
        for v in node.inputs:
            readers = readers_of.setdefault(v.id, [])
            if group not in readers:
                readers.append(group)
        for v in node.outputs:
            if v is not None:
                group_of[v.id] = group

    last_of: dict[int, FusionGroup] = {}
    fused: set[int] = set()
    impure_at = [i for i, n in enumerate(graph.nodes) if get_op(n.op) is None or not get_op(n.op).pure]
    group_of_node = {id(n): g for g in groups for n in g.nodes}
    free = {id(g) for g in groups}
    absorbed: dict[int, list[FusionGroup]] = {}
    copies = strided_copies_enabled()
    for g in reversed(groups):      # readers first: a chain of producers ends in its last reader
        if id(g) in free:
            absorbed[id(g)] = _broadcast_producers(g, group_of_node, free, users, graph_reads, position, impure_at)

    def build(g: FusionGroup, nodes: list[Node]) -> bool:
        g.nodes = sorted(nodes, key=lambda n: position[id(n)])
        try:
            g.build(read_outside(g.nodes, users, graph_reads))
        except NotFusible as e:
            log.debug("ostinato fusion: %s left unfused: %s", g.name, e)
            g.spec, g.inputs, g.outputs = None, [], []
            return False
        last_of[id(graph.nodes[g.launch_at])] = g
        fused.update(id(n) for n in g.nodes)
        return True

    for g in groups:
        if id(g) not in absorbed:
            continue        # taken into a reader's kernel
        own, extra = list(g.nodes), absorbed[id(g)]
        if extra and build(g, own + [n for h in extra for n in h.nodes]):
            continue
        # a group of one stays an ATen node, but where the op's own path is several torch kernels
        if len(own) > 1 or copies and _strided_copy(own[0]) or own[0].op in _GENERATED_ALONE:
            build(g, own)
        for h in extra:     # refused together: each as it was
            if len(h.nodes) > 1:
                build(h, list(h.nodes))
    out: list[Node | FusionGroup] = []
    for n in graph.nodes:
        if id(n) in last_of:
            out.append(last_of[id(n)])
        elif id(n) not in fused:
            out.append(n)
    from .linear import absorb_linears, linear_fusion_enabled    # it builds on this module's groups
    if linear_fusion_enabled():
        out = absorb_linears(graph, out, users, graph_reads)
    from .attention import absorb_attention, attention_fusion_enabled
    if attention_fusion_enabled():
        out = absorb_attention(graph, out, users, graph_reads)
    from .conv import absorb_conv_bias, conv_bias_fusion_enabled
    if conv_bias_fusion_enabled():
        out = absorb_conv_bias(graph, out, users, graph_reads, channels_last)
    return out
