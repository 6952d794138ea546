"""Running one OpInfo sample through ostinato and classifying the outcome (used by test_opinfo.py)."""
from __future__ import annotations

import traceback
from dataclasses import dataclass, field

import torch

import ostinato
from ostinato.errors import ExportError, UnsupportedOpError

from helpers import assert_same


def _map_tree(obj, fn):
    """Apply ``fn`` to every tensor in nested lists/tuples/dicts, keeping every other object as it is."""
    if isinstance(obj, torch.Tensor):
        return fn(obj)
    if type(obj) in (list, tuple):
        return type(obj)(_map_tree(x, fn) for x in obj)
    if type(obj) is dict:
        return {k: _map_tree(v, fn) for k, v in obj.items()}
    return obj


def tensor_leaves(tree) -> list[torch.Tensor]:
    out: list[torch.Tensor] = []
    _map_tree(tree, lambda t: out.append(t) or t)
    return out


class SampleModule(torch.nn.Module):
    """``forward(*tensors)`` calls ``op(input, *args, **kwargs)`` with the sample's tensors replaced by the
    inputs, in order; non-tensor arguments (sizes, dims, dtypes, scalars) are baked in."""

    def __init__(self, op, tree):
        super().__init__()
        self.op = op
        self.tree = tree

    def forward(self, *tensors):
        it = iter(tensors)
        inp, args, kwargs = _map_tree(self.tree, lambda _: next(it))
        return self.op(inp, *args, **kwargs)


def sample_tree(sample):
    """(input, args, kwargs) of a SampleInput, with a tensor passed twice cloned so inputs don't alias."""
    seen: set[int] = set()

    def dedupe(t: torch.Tensor) -> torch.Tensor:
        if id(t) in seen:
            return t.clone()
        seen.add(id(t))
        return t.detach()

    return _map_tree((sample.input, tuple(sample.args), dict(sample.kwargs)), dedupe)


@dataclass
class Outcome:
    kind: str            # "passed", "not_exportable", "failed"
    detail: str = ""


@dataclass
class OpResult:
    name: str
    passed: int = 0
    not_exportable: int = 0
    failures: list[str] = field(default_factory=list)
    export_errors: list[str] = field(default_factory=list)


def _is_torch_export_failure(e: ExportError) -> bool:
    """ostinato wraps errors raised inside torch.export / run_decompositions in ExportError
    ("torch.export could not trace ...") chained from the original; UnsupportedOpError and the
    converter's own ExportErrors are ostinato's verdicts, not torch's."""
    return (not isinstance(e, UnsupportedOpError) and e.__cause__ is not None
            and str(e).startswith("torch.export could not trace"))


def run_sample(op, sample, tol: float | None = None) -> Outcome:
    tree = sample_tree(sample)
    inputs = tensor_leaves(tree)
    model = SampleModule(op, tree)
    with torch.no_grad():
        ref = model(*[t.clone() for t in inputs])
    if not all(isinstance(x, torch.Tensor) for x in tensor_leaves_any(ref)):
        return Outcome("failed", f"eager returns non-tensor leaves: {type(ref).__name__}")
    try:
        prog = ostinato.export(model, tuple(inputs))
    except ExportError as e:
        if _is_torch_export_failure(e):
            cause = e.__cause__
            return Outcome("not_exportable", f"{type(cause).__name__}: {_first_line(cause)}")
        raise
    exe = ostinato.compile(prog, device="cpu")
    out = exe(*inputs)
    assert_same(out, ref, tol)
    return Outcome("passed")


def tensor_leaves_any(tree) -> list:
    from torch.utils import _pytree as pytree
    return pytree.tree_leaves(tree)


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return text[0][:300] if text else ""


def describe(sample) -> str:
    def d(x):
        if isinstance(x, torch.Tensor):
            return f"T{list(x.shape)}:{str(x.dtype).replace('torch.', '')}" + (
                "" if x.is_contiguous() else "(nc)")
        return repr(x)
    inp, args, kwargs = sample_tree(sample)
    return (f"input={_map_tree(inp, d)!s} args={_map_tree(args, d)!s} kwargs={_map_tree(kwargs, d)!s}")


def run_samples(opinfo, samples, tol=None) -> OpResult:
    res = OpResult(opinfo.full_name if hasattr(opinfo, "full_name") else opinfo.name)
    for s in samples:
        try:
            o = run_sample(opinfo.op, s, tol)
        except Exception as e:  # noqa: BLE001 - every other exception is a failure to report
            tb = traceback.format_exception_only(type(e), e)
            res.failures.append(f"{describe(s)}\n    {''.join(tb).strip()[:2000]}")
            continue
        if o.kind == "passed":
            res.passed += 1
        elif o.kind == "not_exportable":
            res.not_exportable += 1
            res.export_errors.append(f"{describe(s)}: {o.detail}")
        else:
            res.failures.append(f"{describe(s)}\n    {o.detail}")
    return res
