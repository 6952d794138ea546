"""Weights laid out for the ops that read several at once: the weights (and biases) of one
``ost.multi_linear`` lie one after another in one buffer, and the executable's constants are views into
it, so the op runs one matmul over them (ir/fused_ops.multi_linear) with no second copy of the weights.

Placing and packing are one step (``place_constants``), so each weight byte is copied at most once:

- already packed where they are (a loaded program: the reader's tensors are views of one mapping, and
  a group's weights lie one after another in the file): views of that memory on the CPU, one upload
  of the whole block on a GPU;
- to another device (CUDA): one buffer allocated there, each weight copied into its rows (no packed
  host copy, no concatenation on the device);
- a loaded program's constants on another device: uploaded as a few runs of the file's data segment
  (``bulk_upload``; the backend's ``upload_bytes``: through pinned buffers on CUDA), each constant then a
  view of its run, so the packed groups above stay packed there too;
- on the CPU, from separate tensors (a program just exported: the model's parameters): a group is
  copied into one buffer only up to ``CPU_PACK_COPY_LIMIT`` bytes. Past that the matmuls take long
  enough that the launches packing saves matter little (the Llama-3.2-1B-shaped model's prefill of 16
  tokens: 1.16 s packed, 1.19 s not, best of 8, docs/startup.md), while the copy allocates fresh memory
  for every such weight (2.5 GB there: 4.5-7.0 s of a fresh process's compile on a 2-core VM short of
  free memory) and doubles their memory as long as the model keeps its own. ``multi_linear`` runs one
  matmul per weight then.
"""
from __future__ import annotations

import contextlib
import threading
from typing import Any

import torch

from ..backends import Backend
from ..ir import Graph, Value
from ..ir.fused_ops import _packed_rows

# Bytes of one group of sibling weights (or biases) the CPU copies to pack them; larger groups stay
# separate unless they are packed already. None: no limit.
CPU_PACK_COPY_LIMIT: int | None = 16 << 20


def _groups(graph: Graph) -> list[list[Value]]:
    """Each multi_linear's weights, and its biases, where all are constants (each constant in one group)."""
    out, seen = [], set()
    for node in graph.nodes:
        if node.op != "ost.multi_linear":
            continue
        for vals in (node.args[1], node.args[2]):
            if vals and all(isinstance(v, Value) and v.role == "constant" for v in vals) \
                    and not any(v.id in seen for v in vals):
                seen.update(v.id for v in vals)
                out.append(list(vals))
    return out


def _stackable(tensors: list) -> bool:
    t0 = tensors[0]
    return all(isinstance(t, torch.Tensor) and t.dim() >= 1 and t.dtype == t0.dtype and t.device == t0.device
               and t.shape[1:] == t0.shape[1:] for t in tensors)


def _views(buf: torch.Tensor, tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    out, start = [], 0
    for t in tensors:
        out.append(buf[start:start + t.shape[0]])
        start += t.shape[0]
    return out


_LOCAL = threading.local()


@contextlib.contextmanager
def live_weights():
    """Within: executables built keep every weight the caller's own tensor, so in-place updates of it
    (``load_state_dict``, an optimizer step) reach every value computed from it: no sibling group is
    copied into a packed buffer (a group packed already is used where it lies) and nothing is folded
    (folding.py). torch.compile's backend builds its executables so."""
    before = getattr(_LOCAL, "live", False)
    _LOCAL.live = True
    try:
        yield
    finally:
        _LOCAL.live = before


def weights_live() -> bool:
    return getattr(_LOCAL, "live", False)


# A loaded program's constants are uploaded as runs of its data segment when they hold at least this many
# bytes (below, the per-weight copies cost little); runs are joined across gaps of up to BULK_GAP_BYTES
# (state tensors and folded-away weights between constants: uploaded with them rather than splitting).
BULK_MIN_BYTES = 16 << 20
BULK_GAP_BYTES = 1 << 20


def bulk_upload(graph: Graph, weights: dict[str, torch.Tensor], backend: Backend,
                placed: dict[str, Any] | None = None) -> dict[str, torch.Tensor]:
    """Constants of ``graph`` that are views of one host storage (a loaded program's mapped data segment),
    copied to ``backend``'s device as a few contiguous runs of that storage (``Backend.upload_bytes``),
    by name, each a view of its run; empty when there is nothing worth it (an exported program's
    parameters have a storage each; a CPU backend; constants the caller keeps live)."""
    if backend.device.type == "cpu" or weights_live():
        return {}
    by_storage: dict[int, list] = {}
    for v in graph.constants:
        t = weights.get(v.name)
        if (placed and v.name in placed) or type(t) is not torch.Tensor or t.device.type != "cpu" \
                or not t.is_contiguous() or t.numel() == 0:
            continue
        start = t.storage_offset() * t.element_size()
        by_storage.setdefault(t.untyped_storage().data_ptr(), []).append((start, start + t.nbytes, v.name, t))
    if not by_storage:
        return {}
    items = max(by_storage.values(), key=lambda xs: sum(e - s for s, e, _, _ in xs))
    if sum(e - s for s, e, _, _ in items) < BULK_MIN_BYTES:
        return {}
    items.sort(key=lambda it: it[0])
    runs: list[list] = []
    for it in items:
        if runs and it[0] - runs[-1][1] <= BULK_GAP_BYTES:
            runs[-1][1] = max(runs[-1][1], it[1])
            runs[-1][2].append(it)
        else:
            runs.append([it[0], it[1], [it]])
    storage = items[0][3].untyped_storage()
    whole = torch.empty(0, dtype=torch.uint8).set_(storage, 0, (storage.nbytes(),))
    out: dict[str, torch.Tensor] = {}
    for lo, hi, members in runs:
        dev = backend.upload_bytes(whole[lo:hi])
        for start, end, name, t in members:
            if (start - lo) % t.element_size():
                continue          # not aligned for its dtype's view: placed on its own below
            out[name] = dev[start - lo:end - lo].view(t.dtype).view(t.shape)
    return out


def place_constants(graph: Graph, weights: dict[str, torch.Tensor], backend: Backend, template: list,
                    placed: dict[str, Any] | None = None) -> int:
    """Fill ``template`` (the environment by slot) with ``graph``'s constants on ``backend``'s device,
    each multi_linear group packed (see the module's docstring); ``placed``: tensors already there, by
    name (a method gets its root's). Returns how many groups were copied into a new buffer."""
    def source(v: Value):
        t = None if placed is None else placed.get(v.name)
        return (t, True) if t is not None else (weights[v.name], False)

    done: set[int] = set()
    copied = 0
    # A backend with its own placement (MLX arrays) places each constant; it packs nothing here.
    direct = type(backend).place is Backend.place
    if direct:
        uploaded = bulk_upload(graph, weights, backend, placed)
        if uploaded:
            placed = {**(placed or {}), **uploaded}
    for vals in (_groups(graph) if direct else []):
        found = [source(v) for v in vals]
        tensors = [t for t, _ in found]
        if not _stackable(tensors):
            continue
        on_device = all(here for _, here in found) or tensors[0].device == backend.device
        rows = _packed_rows(tensors)
        if rows is not None:                       # packed already: no copy on the device it lives on
            packed = _views(rows if on_device else backend.place(rows), tensors)
        elif on_device and weights_live():
            continue                               # the caller's tensors, each placed as it is
        elif on_device:
            nbytes = sum(t.numel() for t in tensors) * tensors[0].element_size()
            if backend.device.type == "cpu" and CPU_PACK_COPY_LIMIT is not None and nbytes > CPU_PACK_COPY_LIMIT:
                continue                           # separate matmuls (placed one by one below)
            packed = _views(torch.cat([t.contiguous() for t in tensors], dim=0), tensors)
            copied += 1
        else:                                      # upload: one buffer on the device, each weight into its rows
            t0 = tensors[0]
            buf = torch.empty((sum(t.shape[0] for t in tensors),) + tuple(t0.shape[1:]), dtype=t0.dtype,
                              device=backend.device)
            packed = _views(buf, tensors)
            for dst, t in zip(packed, tensors):
                dst.copy_(t)
            copied += 1
        for v, t in zip(vals, packed):
            template[v.slot] = t
            done.add(v.id)
    for v in graph.constants:
        if v.id not in done:
            t, here = source(v)
            template[v.slot] = t if here else backend.place(t)
    return copied


def pack_sibling_weights(graph: Graph, template: list) -> int:
    """Pack each multi_linear's constants already in ``template`` (the environment by slot) with a copy,
    whatever their size; returns how many groups were packed. A constant is packed once; a group with one
    already packed is left as is. (``place_constants`` places and packs in one step, copying less.)"""
    count = 0
    for vals in _groups(graph):
        tensors = [template[v.slot] for v in vals]
        if not _stackable(tensors) or _packed_rows(tensors) is not None:
            continue
        for v, t in zip(vals, _views(torch.cat([t.contiguous() for t in tensors], dim=0), tensors)):
            template[v.slot] = t
        count += 1
    return count
