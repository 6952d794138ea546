"""``run_decompositions`` of several ExportedPrograms with torch's set-up done once.

Each ``ExportedProgram.run_decompositions(table)`` first splits the table into CompositeImplicitAutograd
(CIA) ops and the rest (walking every CIA op torch knows), then, around its re-trace, overrides the
CIA kernel of every one of those ops (a few thousand ``py_impl`` registrations, and their removal
after): about 0.2 s per call on a 2-core VM whatever the graph's size, as much as re-tracing a
64-layer model whose layers are opaque calls. Regional export decomposes two programs (the model and
its block), so ``decompositions`` splits the table once, enters the override once, and has torch's
own decomposition (``_decompose_exported_program``, what ``run_decompositions`` calls after the
split) run each program inside it: the graphs are the ones ``run_decompositions`` gives.

It leans on three private names of ``torch.export.exported_program``; where one is missing (another
torch), each program goes through ``run_decompositions`` as before. The override is torch's global
state (the ops' Python kernels) while it lasts, as it is during any ``run_decompositions``: two threads
decomposing at once were not safe before either; ``_lock`` keeps two of these apart.
"""
from __future__ import annotations

import contextlib
import threading
from typing import Callable, Iterator

import torch

_lock = threading.RLock()
_PRIVATE = ("_split_decomp_table_to_cia_and_python_decomp", "_override_composite_implicit_decomp",
            "_decompose_exported_program", "_disable_prexisiting_fake_mode")


@contextlib.contextmanager
def decompositions(table: dict) -> Iterator[Callable]:
    """Yields ``run(ep)``: ``ep.run_decompositions(table)``, all runs sharing one CIA override."""
    xp = torch.export.exported_program
    if not all(hasattr(xp, name) for name in _PRIVATE):
        yield lambda ep: ep.run_decompositions(table)
        return
    with _lock:
        cia, python = xp._split_decomp_table_to_cia_and_python_decomp(dict(table))
        decompose = xp._disable_prexisiting_fake_mode(xp._decompose_exported_program)

        def run(ep):
            return decompose(ep, cia_to_decomp=cia, python_decomp_table=dict(python), joint_loss_index=None,
                             decompose_custom_triton_ops=False)

        override = xp._override_composite_implicit_decomp
        with override(cia):
            # Entered above for every run below: each run's own entry is then the same state again.
            xp._override_composite_implicit_decomp = _entered
            try:
                yield run
            finally:
                xp._override_composite_implicit_decomp = override


@contextlib.contextmanager
def _entered(cia_ops_to_callable) -> Iterator[None]:
    yield
