"""Constant folding at compile: launches whose every input is a weight (or made from weights and
literals alone) run once when the executable is built, and their results join its constants.

A model's forward often recomputes, on every call, values that depend on its weights only: T5's
relative position bias (the buckets of an arange, an embedding, a permute), DeBERTa's position keys
and queries (each layer's projections of the shared relative embeddings, their head splits), tables
built from aranges. Inductor folds such values only under ``freezing``; torch.compile's default does
not. ostinato folds them when it builds the executable, on the target device with the backend's own
kernels, so a step launches only what depends on its inputs or state.

What folds: a launch of a pure, deterministic op (no random draws, no host reads, no in-place writes,
no op run through eager torch for lack of a kernel) reading only constants, literals and results of
launches folded before it. Not folded, so that memory stays as eager's: a launch whose results are
more than twice as large as its largest input (plus 1 MiB; 16 MiB for creation ops without inputs),
which would keep a broadcast or a ``repeat`` materialised (DeBERTa's position keys repeated over the
batch stay a per-step copy of a folded value); anything once 1 GiB has been folded; and a value the
plan returns or writes back (the caller could modify what it receives), nor one an impure launch takes
as an argument (it could write it), nor one of those may be a view of. Folded values that only other
folded launches read are dropped after folding. ``ost.fold_weights`` (a norm folded into the weights of
the projections it feeds, passes/fold_norms.py) folds whatever its size: its result replaces the weights it
reads, which leave the executable's constants once nothing else reads them.

The plan function compiled for the rest records which launches were folded; an executable whose own
folding differs (folding switched off, a launch that failed to run here) compiles its own.
``OSTINATO_FOLD_CONSTANTS=0`` turns folding off (the A/B switch); torch.compile's backend builds under
``packing.live_weights()``: its constants alias the model's tensors, whose in-place updates it must see.
"""
from __future__ import annotations

import logging
import os
from typing import Any

import torch

from ..backends.base import Launch, arg_slots, resolve, slot_reads
from ..ir import get_op
from ..ir.ops import may_alias
from .packing import weights_live

log = logging.getLogger("ostinato")

_FUSED = ("ost.fused",)             # generated groups: pure by construction (groups close at impure nodes)
# Ops whose folded result replaces the weights they read (passes/fold_norms.py's folded projections): those
# weights leave the template once nothing else reads them (unless a program's methods share them).
_REPLACING = ("ost.fold_weights",)
# A folded norm's ops, folded whatever their size, outside the caps (left to run, each would read every weight
# it folds at every step, a LayerNorm's rounding search too): the folded weights and the shift through them.
_NORM_FOLDS = ("ost.fold_weights", "ost.fold_bias", "ost.fold_offset")
_GROWTH_SLACK = 1 << 20
_CREATION_LIMIT = 16 << 20
_TOTAL_LIMIT = 1 << 30


def folding_enabled() -> bool:
    return os.environ.get("OSTINATO_FOLD_CONSTANTS", "1") != "0" and not weights_live()


def _foldable_op(op: str) -> bool:
    if op in _FUSED:
        return True
    if op.startswith("fallback."):
        return False
    d = get_op(op)
    return d is not None and d.pure and not d.random and not d.host_sync and d.category != "inplace"


def _nbytes(x: Any) -> int:
    if isinstance(x, torch.Tensor):
        return x.numel() * x.element_size()
    if isinstance(x, (list, tuple)):
        return sum(_nbytes(t) for t in x)
    return 0


def written_reads(op: str, args, reads_of) -> list | None:
    """What an impure op may write of what it reads: the reads (``reads_of(argument)``) of the arguments
    its OpDef declares it writes (``writes``: the decode attention writes its caches, not q's biases);
    None where it declares none (any it reads)."""
    d = get_op(op)
    if d is None or d.writes is None:
        return None
    return [r for i in d.writes if i < len(args) for r in reads_of(args[i])]


def protected(steps: list[tuple], keep: set) -> set:
    """What a folded value must never be, over ``steps`` in run order, each (op, what it reads, what it
    makes, what it may write of those: ``written_reads``, None for anything): what the plan returns or writes back (``keep``),
    what an impure step takes as an argument (it could write it), and everything those may be a view of. A
    folded value is shared by every call and session: a caller writing into what it received, or a state
    write into a view of it, would change it for the next call. (Slots for launches; value ids for the
    launch report's graph, codegen/report.py.)"""
    out = set(keep)
    for op, reads, _, written in steps:
        d = get_op(op)
        if op not in _FUSED and (d is None or not d.pure):
            out.update(reads if written is None else written)
    for op, reads, outs, _ in reversed(steps):
        if may_alias(op) and any(o in out for o in outs):
            out.update(reads)
    return out


def fold_constants(launches: list[Launch], template: list, constant_slots: set[int], keep: set[int],
                   backend, drop_weights: bool = True) -> tuple[list[Launch], frozenset]:
    """Run the foldable launches of ``launches`` (in order) into ``template``; return the launches left
    to run per call and the indices of the launches folded.
    ``constant_slots``: the slots ``template`` holds weights in; ``keep``: slots the plan returns or
    writes back (never folded, nor what they may be views of); ``drop_weights``: the weights that only
    folded ``ost.fold_weights`` launches read leave the template (their folded copies replace them;
    False where other executables share the template's weights by name: a program's methods)."""
    if not folding_enabled():
        return launches, frozenset()
    protected_slots = protected([(l.op, list(slot_reads(l)), l.outs, written_reads(l.op, l.args, arg_slots))
                                 for l in launches], keep)
    known = set(constant_slots)
    folded: set[int] = set()          # launch indices
    made: set[int] = set()            # slots produced by folded launches
    total = 0
    # A weight a folded ost.fold_weights read last leaves at once (its copy replaces it), unless a launch
    # left to run reads it: the copies are not all made before any original goes (peak memory).
    last_read = {i: k for k, launch in enumerate(launches) for i in slot_reads(launch)}
    unfolded_reads: set[int] = set()  # slots read by the launches before this one left to run
    alias_of: dict[int, int] = {}     # a folded view's slot -> the weight's slot it views (GPT-2's W^T)
    for k, launch in enumerate(launches):
        if k and k - 1 not in folded:
            unfolded_reads.update(slot_reads(launches[k - 1]))
        reads = list(slot_reads(launch))
        outs = [o for o in launch.outs if o >= 0]
        if not outs or any(o in protected_slots for o in outs) or not all(i in known for i in reads) \
                or not _foldable_op(launch.op):
            continue
        args = [resolve(a, template) for a in launch.args]
        kwargs = {name: resolve(a, template) for name, a in launch.kwargs.items()}
        try:
            with torch.no_grad():
                result = launch.fn(*args, **kwargs)
        except Exception as e:  # noqa: BLE001 - a launch that cannot run here runs per call, as before
            log.debug("ostinato: %s (%s) not folded: %s", launch.name, launch.op, e)
            continue
        results = list(result) if launch.unpack else [result]
        if len(results) != len(launch.outs) or any(
                r is not None and not isinstance(r, (torch.Tensor, int, float, bool)) for r in results):
            continue
        largest = max((_nbytes(template[i]) for i in reads), default=0)
        size = sum(_nbytes(r) for r in results)
        limit = 2 * largest + _GROWTH_SLACK if reads else _CREATION_LIMIT
        replacing = drop_weights and launch.op in _REPLACING
        if launch.op not in _NORM_FOLDS:
            if size > limit or total + size > _TOTAL_LIMIT:
                continue
            total += size
        for o, r in zip(launch.outs, results):
            if o >= 0:
                template[o] = r
                known.add(o)
                made.add(o)
        folded.add(k)
        if may_alias(launch.op) and len(reads) == 1 and alias_of.get(reads[0], reads[0]) in constant_slots:
            alias_of.update((o, alias_of.get(reads[0], reads[0])) for o in outs)
        if replacing:
            for i in reads:
                if i in constant_slots and last_read[i] == k and i not in unfolded_reads and i not in keep:
                    template[i] = None
    if not folded:
        return launches, frozenset()
    rest = [l for k, l in enumerate(launches) if k not in folded]
    read_later = {i for l in rest for i in slot_reads(l)}
    kept = 0
    for o in made:
        if o in read_later:
            kept += _nbytes(template[o])
        else:
            template[o] = None      # read only by other folded launches
    if drop_weights:    # (through folded views: a weight goes with the last view of it nothing reads later)
        replaced = {alias_of.get(i, i) for k in folded if launches[k].op in _REPLACING for i in slot_reads(launches[k])}
        read_later |= {alias_of[i] for i in read_later if i in alias_of}
        for i in replaced & constant_slots:
            if i not in read_later and i not in keep:
                template[i] = None
    backend.synchronize()
    log.debug("ostinato: %d launches folded into constants (%d bytes kept)", len(folded), kept)
    return rest, frozenset(folded)
