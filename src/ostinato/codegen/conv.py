"""Convolutions with their bias added by the kernel that reads their result.

torch runs a convolution with a bias as two kernels: cuDNN's convolution, then an in-place add of the
bias broadcast over the channels (one more pass over the activations, read and written). When every
reader of the result is one fusion group (or one fusible node, which then becomes a group of its own),
the convolution runs without its bias and the group adds it where it loads the result: the same
rounding as eager (the convolution's result rounded to its dtype, then the add in float32 and rounded
again), one launch and two passes over the activations fewer.

The pass runs on the scheduler's result, after the projections and attention took their neighbours
(schedule.py); those groups (LinearGroup, attention) are left as they are.
"""
from __future__ import annotations

import logging
import os

from ..ir import Graph, Node, Value
from ..ir.types import TensorMeta
from .expand import NotFusible, code_of
from .schedule import FusionGroup, node_space, read_outside

log = logging.getLogger("ostinato")

CONV = "aten.convolution"
PERMUTE = "aten.permute"


def conv_bias_fusion_enabled() -> bool:
    """OSTINATO_FUSE_CONV_BIAS=0 leaves every convolution's bias to torch (the A/B switch)."""
    return os.environ.get("OSTINATO_FUSE_CONV_BIAS", "1") != "0"


def _depthwise(node: Node) -> bool:
    """One group per input channel (torch's own depthwise kernels on CUDA)."""
    x, w = node.args[0], node.args[1]
    groups = node.args[8] if len(node.args) > 8 else node.kwargs.get("groups", 1)
    transposed = node.args[6] if len(node.args) > 6 else node.kwargs.get("transposed", False)
    if not (isinstance(x, Value) and isinstance(w, Value) and isinstance(groups, int)) or transposed:
        return False
    c, out = x.meta.shape[1], w.meta.shape[0]
    return groups > 1 and isinstance(c, int) and c == groups and isinstance(out, int) and out % groups == 0


def conv_bias(node: Node, channels_last: frozenset = frozenset()) -> Value | None:
    """The bias of a convolution node the pass may take: a [C] tensor of the result's dtype, where C is
    the result's dim 1 (channels first, as aten.convolution returns it), added by a kernel of its own.
    torch's depthwise kernels over NCHW (``channels_last``: the names of the convolutions running NHWC)
    add the bias as they write (conv-stack's 3x3 depthwise convolutions: moving their bias into the
    group norm's statistics made those 2.6 us slower each on an H100, for no launch saved)."""
    if node.op != CONV or len(node.outputs) != 1 or node.outputs[0] is None:
        return None
    if node.name not in channels_last and _depthwise(node):
        return None
    bias = node.args[2] if len(node.args) > 2 else node.kwargs.get("bias")
    out = node.outputs[0]
    if not isinstance(bias, Value) or not isinstance(bias.meta, TensorMeta) or not isinstance(out.meta, TensorMeta):
        return None
    shape = tuple(out.meta.shape)
    if len(shape) < 3 or tuple(bias.meta.shape) != (shape[1],) or code_of(out) is None \
            or bias.meta.dtype != out.meta.dtype:
        return None
    return bias


def without_bias(node: Node) -> Node:
    """A copy of the convolution node (same name, same result Value) with no bias."""
    args = list(node.args)
    kwargs = dict(node.kwargs)
    if len(args) > 2:
        args[2] = None
    else:
        kwargs["bias"] = None
    copy = Node(node.op, tuple(args), kwargs, node.name, node.source)
    copy.outputs = list(node.outputs)
    return copy


def absorb_conv_bias(graph: Graph, items: list, users: dict, graph_reads: set[int],
                     channels_last: frozenset = frozenset()) -> list:
    """``items`` (the scheduler's result, in run order) with each convolution whose result only one
    plain fusion group (or lone fusible node) reads run without its bias, that group adding it."""
    position = {id(n): i for i, n in enumerate(graph.nodes)}
    holder: dict[int, object] = {}      # node id -> the item holding it
    for it in items:
        for n in (it.nodes if isinstance(it, FusionGroup) else [it]):
            holder[id(n)] = it
    prologues: dict[int, list[tuple[Value, Value, int]]] = {}     # item id -> [(value, bias, unsq)]
    convs_of: dict[int, list[Node]] = {}                            # item id -> the convolutions it takes
    for conv in items:
        bias = conv_bias(conv, channels_last) if isinstance(conv, Node) else None
        found = None if bias is None else _reader(conv.outputs[0], users, graph_reads)
        if found is None:
            continue
        v, channel = found
        readers = users[v.id]
        if len({id(holder.get(id(u))) for u in readers}) != 1:
            continue
        item = holder.get(id(readers[0]))
        if isinstance(item, FusionGroup):
            if not _takes(item, tuple(v.meta.shape)):
                continue
        elif item is None or node_space(item, users, graph_reads) is None:
            continue
        prologues.setdefault(id(item), []).append((v, bias, len(v.meta.shape) - 1 - channel))
        convs_of.setdefault(id(item), []).append(conv)
    if not prologues:
        return items
    taken: dict[int, Node] = {}                               # conv node id -> the conv without bias
    rebuilt: dict[int, object] = {}
    for it in items:
        pro = prologues.get(id(it))
        if pro is not None:
            group = _with_prologue(it, pro, users, graph_reads, position)
            if group is not None:
                rebuilt[id(it)] = group
                for conv in convs_of[id(it)]:
                    taken[id(conv)] = without_bias(conv)
    return [taken.get(id(it)) or rebuilt.get(id(it), it) for it in items]


def _takes(group: FusionGroup, shape: tuple) -> bool:
    """Whether a plain fusion group can add a bias to a value of ``shape`` where it loads it: a member of
    its space, or (a pointwise space) a value broadcast into it (an SE block's gate)."""
    space = group.space
    if type(group) is not FusionGroup or space is None or space.short:
        return False
    if space.red:
        return tuple(space.shape) == shape
    return len(shape) <= len(space.shape) and all(d == 1 or d == e for d, e in zip(shape[::-1], space.shape[::-1]))


def _reader(out: Value, users: dict, graph_reads: set[int]) -> tuple[Value, int] | None:
    """The value a convolution's result reaches through permutes each read by nothing else (ConvNeXt's
    NCHW -> NHWC before its layer norm), and where the channels went; None when something else reads the
    result or a value on the way."""
    v, channel = out, 1
    while True:
        readers = users.get(v.id, ())
        if v.id in graph_reads or not readers:
            return None
        if len(readers) != 1 or readers[0].op != PERMUTE:
            return v, channel
        dims = [d % len(v.meta.shape) for d in readers[0].args[1]]
        nxt = readers[0].outputs[0]
        if nxt is None or not isinstance(nxt.meta, TensorMeta):
            return v, channel
        v, channel = nxt, dims.index(channel)


def _with_prologue(item, prologue: list[tuple[Value, Value, int]], users: dict, graph_reads: set[int],
                   position: dict):
    """A FusionGroup of the item's nodes adding each bias to its convolution's result on load; None when
    the generator does not take it."""
    if isinstance(item, FusionGroup):
        nodes, space, launch_at = list(item.nodes), item.space, item.launch_at
    else:
        nodes, space, launch_at = [item], node_space(item, users, graph_reads), position[id(item)]
        if space is None or tuple(space.shape) != tuple(prologue[0][0].meta.shape):
            return None
    group = FusionGroup(nodes, space, closed=True, launch_at=launch_at, prologues=list(prologue))
    try:
        group.build(read_outside(nodes, users, graph_reads))
    except NotFusible as e:
        log.debug("ostinato fusion: %s keeps its convolutions' biases: %s", group.name, e)
        return None
    return group
