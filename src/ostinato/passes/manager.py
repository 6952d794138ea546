"""The pass pipeline: run passes in order, timing each and counting the nodes it leaves.

Each line of the report is logged to the "ostinato" logger at INFO; with ``OSTINATO_LOG_PASSES=1``
at WARNING, so it shows without any logging configuration.
"""
from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

from ..errors import GraphError
from ..ir import Graph, verify
from .canonicalize import canonicalize
from .cse import eliminate_common_subexpressions
from .dce import eliminate_dead_code
from .fold_norms import fold_norms
from .patterns import (fuse_add_rms_norm, fuse_eager_attention, fuse_gated_mlp, fuse_kv_update, fuse_layer_norm, fuse_linear,
                       fuse_moe, fuse_moe_gathered, fuse_multi_linear, fuse_rms_norm, fuse_rope, fuse_sdpa, rewrite_matmul_linears)
from .matvec import rewrite_small_matvecs
from .reinplace import reinplace_state_writes
from .sink_permutes import sink_permutes, sink_unit_views

log = logging.getLogger("ostinato")

Pass = Callable[[Graph], Graph]

# Canonicalize first: removing no-op views and folding sizes makes more duplicates look alike.
# DCE after CSE clears what merging left unread. A projection written as a matmul with a transposed
# weight becomes aten.linear first (matmul_linear.py), so the patterns see one form. Patterns follow, in an order where none can
# take another's nodes: kv_update before sdpa (sdpa reads the updated cache), eager_attention just before
# sdpa (it leaves attention nodes for sdpa to take), multi_linear before
# gated_mlp and linear (sibling projections become one matmul; their activations stay), gated_mlp before
# linear (the gate's activation belongs to the gated MLP, not to a linear epilogue); moe after gated_mlp (a
# mixture of experts' gating is the packed gated activation it made) and before small_matvec (which would
# turn its expert products into multiplies and sums); fold_norms after the projections are in their final
# form (a batched decode step's norms folded into the cuBLAS products they feed); small matrix-vector
# products become a multiply and a sum (matvec.py) once the patterns have taken theirs; the second DCE
# clears what patterns left unread (a mask no attention reads any more). Canonicalize runs again after the
# patterns: a no-op it had to keep because a layout-sensitive op read it may be free once a pattern took
# that reader (Phi-3's eager attention: the query's cat with an empty pass-through part, read by matmul's
# expand and view, folds once the attention is one node, which then reads the rope itself, as with sdpa).
# Permutes, and views that only insert or remove 1-dims, sink through pointwise ops after the patterns
# (which match the forms torch.export gives), for the code generator's groups. Reinplace stays last: it
# turns functional state writes into in-place ones, after which reads of a buffer are no longer
# interchangeable.
DEFAULT_PIPELINE: list[tuple[str, Pass]] = [
    ("canonicalize", canonicalize),
    ("cse", eliminate_common_subexpressions),
    ("dce", eliminate_dead_code),
    ("matmul_linear", rewrite_matmul_linears),
    ("rms_norm", fuse_rms_norm),
    ("layer_norm", fuse_layer_norm),
    ("add_rms_norm", fuse_add_rms_norm),
    ("rope", fuse_rope),
    ("kv_update", fuse_kv_update),
    ("eager_attention", fuse_eager_attention),
    ("sdpa", fuse_sdpa),
    ("multi_linear", fuse_multi_linear),
    ("gated_mlp", fuse_gated_mlp),
    ("moe", fuse_moe),
    ("linear", fuse_linear),
    ("fold_norms", fold_norms),
    ("small_matvec", rewrite_small_matvecs),
    ("canonicalize_after_fusion", canonicalize),
    ("sink_permutes", sink_permutes),
    ("sink_unit_views", sink_unit_views),
    ("dce_after_fusion", eliminate_dead_code),
    ("reinplace", reinplace_state_writes),
]

# What the default pipeline is for a program exported from CPU tensors: small matrix-vector products stay
# matmuls there (the CPU backend has no code generator to fuse a multiply and a sum with their producer:
# a 4-layer Mamba's replayed step took 12-18% longer with them on the 2-core VM).
# Nor are norms folded into projections (fold_norms.py: for cuBLAS's products, whose row scale an
# accelerator's generated kernels apply).
CPU_ONLY_SKIPS = {"small_matvec", "fold_norms"}


def default_pipeline(example) -> list[tuple[str, Pass]]:
    """DEFAULT_PIPELINE for a program exported from ``example`` (its example inputs, any nesting): all
    of it when one of its tensors is on an accelerator, else without CPU_ONLY_SKIPS and with the MoE
    pattern only where the references' per-choice gather stays small (patterns/moe.py's fuse_moe_gathered);
    without fold_norms where OSTINATO_FOLD_NORMS=0. (The export cache's key has the example's devices.)"""
    import torch
    from torch.utils import _pytree
    from .fold_norms import fold_enabled
    devices = {x.device.type for x in _pytree.tree_leaves(example) if isinstance(x, torch.Tensor)}
    cpu = not devices - {"cpu"}
    skip = set(CPU_ONLY_SKIPS) if cpu else set()
    if not fold_enabled():
        skip.add("fold_norms")      # (the pipeline shown is what runs; the export cache's key has fold_key)
    return [("moe", fuse_moe_gathered) if cpu and p[0] == "moe" else p for p in DEFAULT_PIPELINE if p[0] not in skip]


# The pipeline without the fused patterns: every ATen op the exporter kept stays an ATen op (op
# tests use it to exercise the op a row claims, not the fused op that replaces it).
_PATTERNS = {"matmul_linear", "rms_norm", "layer_norm", "add_rms_norm", "rope", "kv_update", "eager_attention", "sdpa", "multi_linear", "gated_mlp", "moe", "linear", "fold_norms",
             "small_matvec", "canonicalize_after_fusion", "dce_after_fusion"}
GENERIC_PIPELINE: list[tuple[str, Pass]] = [p for p in DEFAULT_PIPELINE if p[0] not in _PATTERNS]


@dataclass(frozen=True)
class PassRecord:
    name: str
    nodes: int       # node count after the pass
    seconds: float

    def __str__(self) -> str:
        return f"pass {self.name}: {self.nodes} nodes, {self.seconds * 1e3:.2f} ms"


def _log_level() -> int:
    return logging.WARNING if os.environ.get("OSTINATO_LOG_PASSES") == "1" else logging.INFO


def run_passes(graph: Graph, passes: Sequence[tuple[str, Pass]] = DEFAULT_PIPELINE, *,
               verify_each: bool = False, hints: Mapping[str, int] | None = None
               ) -> tuple[Graph, list[PassRecord]]:
    """Run ``passes`` in order on ``graph``; return the graph and one PassRecord per pass.

    ``verify_each`` re-verifies the graph (shapes included, at ``hints``) after every pass, naming
    the pass that broke it: for debugging a pass, not for every export.
    """
    level = _log_level()
    report: list[PassRecord] = []
    for name, fn in passes:
        t0 = time.perf_counter()
        graph = fn(graph)
        record = PassRecord(name, len(graph.nodes), time.perf_counter() - t0)
        report.append(record)
        log.log(level, "%s", record)
        if verify_each:
            try:
                verify(graph, check_shapes=True, hints=hints)
            except GraphError as e:
                raise GraphError(f"after pass {name}: {e}") from e
    return graph, report
