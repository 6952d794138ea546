"""Core-ATen ExportedPrograms with torch's decomposition set-up done once (regional export).

``ExportedProgram.run_decompositions(table)`` first splits the table into CompositeImplicitAutograd
(CIA) ops and the rest (walking every CIA op torch knows), then, around a second trace of the
program, overrides the CIA kernel of each of those ops (hundreds of ``py_impl`` registrations, and
their removal after): ~0.05 s each on a 2-core VM, whatever the graph's size. And the second trace
costs about what the first did: a 64-layer model whose layers are opaque calls is traced twice.

``decompositions(table)`` splits the table once and enters the override once; inside it,
``Decomposer.export`` traces a module straight to core ATen (torch.export's ``_export`` with
``pre_dispatch=False`` and the table's non-CIA decompositions: what ``run_decompositions`` re-traces
with), one trace instead of two, and ``Decomposer.run`` decomposes an existing program with torch's own
``_decompose_exported_program``. A direct trace differs from a re-traced one in three ways, each undone
here so that the program is the one ``export`` + ``run_decompositions`` gives (byte-identical programs:
tests/frontend/test_regional.py and test_decompose.py): a tied tensor is read through its first name's
placeholder (the re-trace reads its last), a constant input (an int argument) is read through its
placeholder (the re-trace inlines its value), and a written buffer's new value goes through a
``copy_`` (``run_decompositions`` removes it after its re-trace). torch's metadata asserts
(``_assert_tensor_metadata``) are there in a direct trace only; ``convert`` drops them. AOT autograd
runs the model twice in a direct trace (metadata, then the trace), so an opaque block is called twice
(regional.Session.keep_calls_in).

Only regional export uses it; a full export stays ``torch.export.export`` + ``run_decompositions``.
It leans on private names of ``torch.export``; where one is missing (another torch), ``export`` and
``run`` are the public two steps. The override is torch's global state (the ops' Python kernels) while
it lasts, as during any ``run_decompositions``: two threads decomposing at once were not safe before
either; ``_lock`` keeps two of these apart.
"""
from __future__ import annotations

import contextlib
import functools
import threading
from typing import Iterator

import torch

_lock = threading.RLock()
_PRIVATE = ("_split_decomp_table_to_cia_and_python_decomp", "_override_composite_implicit_decomp",
            "_decompose_exported_program", "_disable_prexisiting_fake_mode", "_remove_unnecessary_copy_op_pass")


class Decomposer:
    """``run(ep)``: ``ep.run_decompositions(table)``; ``export(...)``: ``torch.export.export(...)`` then
    ``run_decompositions(table)`` (non-strict). Made by ``decompositions``."""

    def __init__(self, table: dict):
        self.table = table

    def run(self, ep):
        return ep.run_decompositions(self.table)

    def export(self, mod, args, kwargs=None, dynamic_shapes=None):
        return self.run(torch.export.export(mod, args, kwargs, dynamic_shapes=dynamic_shapes, strict=False))


class _Shared(Decomposer):
    """Inside one CIA override: each run is torch's own ``_decompose_exported_program``; each export
    traces straight to core ATen (torch.export's ``_export`` with ``pre_dispatch=False`` and the table's
    non-CIA decompositions, which is what ``run_decompositions`` re-traces with), one trace, not two."""

    def __init__(self, table, cia, python):
        super().__init__(table)
        xp = torch.export.exported_program
        self._cia, self._python = cia, python
        self._decompose = xp._disable_prexisiting_fake_mode(xp._decompose_exported_program)

    def run(self, ep):
        return self._decompose(ep, cia_to_decomp=self._cia, python_decomp_table=dict(self._python),
                               joint_loss_index=None, decompose_custom_triton_ops=False)

    def export(self, mod, args, kwargs=None, dynamic_shapes=None):
        from torch.export import _trace
        to_aten = _trace._export_to_aten_ir
        _trace._export_to_aten_ir = functools.partial(to_aten, decomp_table=dict(self._python))
        try:
            ep = _trace._export(mod, args, kwargs, dynamic_shapes, strict=False, pre_dispatch=False)
        finally:
            _trace._export_to_aten_ir = to_aten
        _tied_as_retraced(ep)
        _constants_inlined(ep)
        # What run_decompositions does after its re-trace: a buffer's new value is the value itself,
        # not a copy_ into the buffer.
        torch.export.exported_program._remove_unnecessary_copy_op_pass(ep.graph_module, ep.graph_signature)
        return ep


def _constants_inlined(ep) -> None:
    """A constant input (``k: int``, bound to its example's value) is its value where it is used, as in
    a re-traced program (the re-trace is fed the value); a direct trace reads the placeholder."""
    from torch.export.graph_signature import ConstantArgument, InputKind
    phs = [n for n in ep.graph.nodes if n.op == "placeholder"]
    changed = False
    for spec, ph in zip(ep.graph_signature.input_specs, phs):
        if spec.kind == InputKind.USER_INPUT and isinstance(spec.arg, ConstantArgument) and ph.users:
            value = spec.arg.value
            for user in list(ph.users):
                user.args = torch.fx.node.map_arg(user.args, lambda n: value if n is ph else n)
                user.kwargs = torch.fx.node.map_arg(user.kwargs, lambda n: value if n is ph else n)
            changed = True
    if changed:
        ep.graph_module.recompile()


def _tied_as_retraced(ep) -> None:
    """Every use of a tensor the model holds under several names (tied embeddings: ``lm_head.weight``
    and ``model.embed_tokens.weight``) reads the placeholder of its last name, as in a program that
    ``run_decompositions`` re-traced (its re-trace binds both names to one fake tensor, and the last
    binding wins); a direct trace reads the first. Both placeholders stay, as they do there."""
    from torch.export.graph_signature import InputKind
    phs = [n for n in ep.graph.nodes if n.op == "placeholder"]
    names: dict[int, list] = {}
    for spec, ph in zip(ep.graph_signature.input_specs, phs):
        if spec.kind in (InputKind.PARAMETER, InputKind.BUFFER) and spec.target is not None:
            t = ep.state_dict.get(spec.target)
            if t is None:
                t = ep.constants.get(spec.target)
            if isinstance(t, torch.Tensor):
                names.setdefault(id(t), []).append(ph)
    changed = False
    for group in names.values():
        for ph in group[:-1]:
            changed |= bool(ph.replace_all_uses_with(group[-1]))
    if changed:
        ep.graph_module.recompile()


@contextlib.contextmanager
def decompositions(table: dict) -> Iterator[Decomposer]:
    """Yields a Decomposer whose runs and exports share one CIA override."""
    xp = torch.export.exported_program
    from torch.export import _trace
    if not all(hasattr(xp, name) for name in _PRIVATE) or not all(
            hasattr(_trace, name) for name in ("_export", "_export_to_aten_ir")):
        yield Decomposer(table)
        return
    with _lock:
        cia, python = xp._split_decomp_table_to_cia_and_python_decomp(dict(table))
        override = xp._override_composite_implicit_decomp
        with override(cia):
            # Entered above for every run below: each run's own entry is then the same state again.
            xp._override_composite_implicit_decomp = _entered
            try:
                yield _Shared(table, cia, python)
            finally:
                xp._override_composite_implicit_decomp = override


@contextlib.contextmanager
def _entered(cia_ops_to_callable) -> Iterator[None]:
    yield
