"""Measuring runners on one workload: outputs checked against eager first (a wrong runner is
reported with its error and never timed), warm-ups, then trials interleaved across the runners of the
configuration (a 10% trimmed mean with min and max), and the memory each runner needs.

Memory: on CUDA, ``torch.cuda.max_memory_allocated`` from the runner's creation to the end of its
warm-ups, above what was allocated before it, plus the model's own bytes (weights and caches, counted
once: the runners share the model's tensors). On the CPU, the process's resident set
(``/proc/self/statm``) after the warm-ups above before the runner, plus the model's bytes: a rough
figure, since the allocator keeps freed memory.
"""
from __future__ import annotations

import contextlib
import gc
import math
import os
import time
from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch.utils import _pytree as pytree

WARMUPS, TRIALS, TRIM = 5, 10, 0.1
CHECK_STEPS = 3
TRIAL_SECONDS = 0.05     # a trial runs enough steps to last about this long
TOLERANCE = {"float32": 1e-4, "bfloat16": 5e-2, "float16": 5e-3}   # max |out - ref| / max(1, max |ref|)
# fp32 on CUDA: two correct runners differ by more than 1e-4 there (Mamba-130M on an H100:
# reduce-overhead 3.6e-4 and ostinato 2.5e-4 from eager). It is not TF32, as once thought: eager with
# TF32 off everywhere gives the same outputs (bench/precision.py); float64 shows eager itself is 1.4e-3
# from the exact result there (a 24-layer scan amplifies rounding).
CUDA_FP32_TOLERANCE = 1e-3
# A float32 runner further than the tolerance from eager is still right when it is at most this many
# times as far from the float64 result as eager is (the rule of torch's own benchmark harness, dynamo's
# same(fp64_ref=...)): on an ill-conditioned model two correct fp32 orders of rounding differ by about
# the sum of their errors.
FLOAT64_MULTIPLIER = 2.0


def tolerance(dtype: str, device: str) -> float:
    return CUDA_FP32_TOLERANCE if device == "cuda" and dtype == "float32" else TOLERANCE[dtype]
MEMORY_METRIC = {"cuda": "torch.cuda.max_memory_allocated while the runner is built, checked and warmed up, above "
                         "the memory before it, plus the model's weights and caches",
                 "cpu": "resident set size after the runner's warm-ups above before it, plus the model's "
                        "weights and caches (rough: the CPU allocator keeps freed memory)"}


def trimmed_stats(samples: list[float], trim: float = TRIM) -> dict[str, float]:
    """Mean after dropping ``floor(trim * n)`` samples from each end, with min and max of all samples."""
    if not samples:
        raise ValueError("no samples")
    s = sorted(samples)
    k = int(math.floor(trim * len(s)))
    kept = s[k:len(s) - k] if len(s) - 2 * k > 0 else s
    return {"mean": sum(kept) / len(kept), "min": s[0], "max": s[-1], "n": len(s), "trimmed": 2 * k}


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _rss_bytes() -> int | None:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


class MemoryWatch:
    """Memory a runner adds, from ``start()`` to ``stop()`` (see the module's note)."""

    def __init__(self, device: torch.device):
        self.device = device

    def start(self) -> None:
        gc.collect()
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.empty_cache()
            self.base = torch.cuda.memory_allocated(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
        else:
            self.base = _rss_bytes()

    def stop(self) -> int | None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            return torch.cuda.max_memory_allocated(self.device) - self.base
        now = _rss_bytes()
        return None if now is None or self.base is None else max(0, now - self.base)


def _compared(out: Any, ref: Any) -> list[tuple[torch.Tensor, torch.Tensor, float]] | None:
    """The floating tensors of two outputs of the same structure as (out, ref, scale) pairs in float32
    (scale: max(1, max |ref|)); None when structure or shapes differ, integer outputs are not equal, or an
    output value is not finite."""
    o_leaves, o_spec = pytree.tree_flatten(out)
    r_leaves, r_spec = pytree.tree_flatten(ref)
    if o_spec != r_spec and len(o_leaves) != len(r_leaves):
        return None
    pairs = []
    for o, r in zip(o_leaves, r_leaves):
        if not isinstance(r, torch.Tensor):
            continue
        if not isinstance(o, torch.Tensor) or o.shape != r.shape:
            return None
        if not r.dtype.is_floating_point:
            if not torch.equal(o.cpu(), r.cpu()):
                return None
            continue
        of, rf = o.detach().float(), r.detach().float().to(o.device)
        if not torch.isfinite(of).all():
            return None
        pairs.append((of, rf, max(1.0, rf.abs().max().item())))
    return pairs


def max_error(out: Any, ref: Any) -> float:
    """Largest |out - ref| / max(1, max |ref|) over the tensors of two outputs of the same structure;
    inf when structure or shapes differ, integer outputs are not equal or an output is not finite."""
    pairs = _compared(out, ref)
    if pairs is None:
        return math.inf
    return max([(of - rf).abs().max().item() / scale for of, rf, scale in pairs if of.numel()], default=0.0)


def rows_missed(outs: list, refs: list, tolerance: float) -> float:
    """How many rows (indices along dim 0, over all steps and floating output tensors) are further than
    ``tolerance`` from eager's, each scaled as max_error scales its tensor; inf wherever max_error is inf
    (structure, shapes, integer values, a value not finite) or a 0-dim tensor is beyond the tolerance: only
    whole rows of finite floats apart can be excused."""
    missed: set[int] = set()
    if len(outs) != len(refs):
        return math.inf
    for out, ref in zip(outs, refs):
        pairs = _compared(out, ref)
        if pairs is None or len(pytree.tree_leaves(out)) != len(pytree.tree_leaves(ref)):
            return math.inf
        for of, rf, scale in pairs:
            if rf.dim() == 0:
                if (of - rf).abs().item() / scale > tolerance:
                    return math.inf
                continue
            err = (of - rf).abs().reshape(rf.shape[0], -1).amax(1) / scale
            missed.update(torch.nonzero(err > tolerance).flatten().tolist())
    return len(missed)


def describe_error(e: BaseException) -> str:
    lines = str(e).strip().splitlines()
    return f"{type(e).__name__}: {lines[0][:300] if lines else ''}"


def snapshot(out: Any) -> Any:
    """A copy of an output: replayed runners return their static buffers, overwritten by the next call."""
    return pytree.tree_map(lambda t: t.detach().clone() if isinstance(t, torch.Tensor) else t, out)


def call(fn: Callable, step: tuple[tuple, dict]) -> Any:
    args, kwargs = step
    with torch.no_grad():
        return fn(*args, **kwargs)


@dataclass
class Reference:
    """Eager's outputs for the first CHECK_STEPS steps, from the model's initial state. ``exact``: a
    callable giving the same steps' outputs from a float64 copy of the model (float32 configurations;
    called once, when a runner first misses the tolerance), or None."""

    outputs: list
    tolerance: float
    exact: Callable[[], list] | None = None
    _exact: Any = None
    # Sequences of a batch (rows along dim 0) whose outputs may miss the tolerance while every other row
    # meets it: a mixture of experts' routing is a discrete choice, and a near-tie between two experts
    # flips under any difference of rounding (reduce-overhead's as well as ours), changing that sequence's
    # output entirely. 0: none (every other configuration).
    row_slack: int = 0

    def float64(self) -> tuple[list | None, str | None]:
        """(the float64 outputs, or None and why there are none)."""
        if self._exact is None:
            if self.exact is None:
                self._exact = (None, "no float64 reference for this configuration")
            else:
                try:
                    self._exact = (self.exact(), None)
                except Exception as e:   # noqa: BLE001 - a model that cannot run in float64 keeps the plain check
                    self._exact = (None, f"float64 reference failed: {describe_error(e)}")
        return self._exact


def restorer(model: torch.nn.Module) -> Callable[[], None]:
    """A function that puts ``model``'s buffers (its caches) back to what they hold now."""
    initial = {n: b.detach().clone() for n, b in model.named_buffers()}

    def restore() -> None:
        with torch.no_grad():
            for n, b in model.named_buffers():
                b.copy_(initial[n])
    return restore


def float64_reference(model: torch.nn.Module, steps: list, restore: Callable[[], None]) -> Callable[[], list]:
    """A Reference's ``exact``: float64_outputs from the state ``restore`` puts back, which it puts back
    again after (a runner checked meanwhile may share the model's buffers)."""
    def exact() -> list:
        restore()
        try:
            return float64_outputs(model, steps)
        finally:
            restore()
    return exact


def float64_outputs(model: torch.nn.Module, steps: list, n: int = CHECK_STEPS) -> list:
    """The first ``n`` steps' outputs of a float64 copy of ``model`` on float64 copies of the floating
    inputs, TF32 off (from the model's current state)."""
    import copy
    m64 = copy.deepcopy(model).double()
    to64 = lambda t: t.double() if isinstance(t, torch.Tensor) and t.is_floating_point() else t   # noqa: E731
    with no_tf32():
        return [snapshot(call(m64, pytree.tree_map(to64, steps[i % len(steps)]))) for i in range(n)]


@contextlib.contextmanager
def no_tf32():
    """TF32 off in cuDNN (through its flags context: assignments are refused once torch's tests call
    torch.backends.disable_global_flags) and in cuBLAS, for a block."""
    cudnn, matmul = torch.backends.cudnn, torch.backends.cuda.matmul
    old = matmul.allow_tf32
    matmul.allow_tf32 = False
    try:
        with cudnn.flags(enabled=cudnn.enabled, benchmark=cudnn.benchmark, benchmark_limit=cudnn.benchmark_limit,
                         deterministic=cudnn.deterministic, allow_tf32=False):
            yield
    finally:
        matmul.allow_tf32 = old


def check_runner(fn: Callable, steps: list, ref: Reference) -> tuple[float, list]:
    """The runner's worst error over the check steps (run from the initial state) and its outputs."""
    worst, outs = 0.0, []
    for i, expected in enumerate(ref.outputs):
        out = snapshot(call(fn, steps[i % len(steps)]))
        outs.append(out)
        worst = max(worst, max_error(out, expected))
    return worst, outs


def _right_by_float64(cell: dict, outs: list, ref: Reference) -> bool:
    """Whether every output tensor further than the tolerance from eager's is at most FLOAT64_MULTIPLIER
    times as far from the float64 result as eager's same tensor (tensor by tensor, step by step, as
    torch's rule: an ill-conditioned output cannot excuse a wrong well-conditioned one). The worst such
    tensor is recorded in ``cell``."""
    exact, why = ref.float64()
    if exact is None:
        if ref.exact is not None:
            cell["float64_check"] = why
        return False
    right, worst = True, None
    for out, eager, ex in zip(outs, ref.outputs, exact):
        for o, e, x in zip(pytree.tree_leaves(out), pytree.tree_leaves(eager), pytree.tree_leaves(ex)):
            if not isinstance(e, torch.Tensor) or not e.dtype.is_floating_point:
                continue
            if max_error(o, e) <= ref.tolerance:
                continue
            err, eager_err = max_error(o, x), max_error(e, x)
            ok = err <= FLOAT64_MULTIPLIER * eager_err
            right &= ok
            ratio = err / eager_err if eager_err else math.inf
            if worst is None or ratio > worst[0]:
                worst = (ratio, err, eager_err)
    if worst is None:       # no floating tensor missed: the miss was elsewhere (shapes, integers)
        return False
    _, err, eager_err = worst
    cell.update(float64_error=err, eager_float64_error=eager_err,
                float64_check=f"{'right' if right else 'wrong'}: {err:.3g} from float64, eager {eager_err:.3g}, "
                              f"allowed {FLOAT64_MULTIPLIER:g}x")
    return right


def prepare_cell(make: Callable[[], Callable], steps: list, ref: Reference | None, device: torch.device,
                 model_bytes: int, warmups: int = WARMUPS) -> tuple[dict[str, Any], Callable | None]:
    """Build a runner with ``make()``, run its first call, check it (unless it is the reference) and warm
    it up: ``(cell, fn)``. ``fn`` is None when the cell failed or was wrong; such a runner is never timed.
    ``first_call_s`` is the first call's time, compilation or capture included; the peak memory is taken
    over building, checking and warming up."""
    t_start = time.perf_counter()
    cell: dict[str, Any] = {}
    watch = MemoryWatch(device)
    fn = None
    try:
        watch.start()
        t0 = time.perf_counter()
        fn = make()
        cell["build_s"] = time.perf_counter() - t0
        cell.update(getattr(fn, "suite_info", {}))   # a peer's export / compile / lower seconds
        t0 = time.perf_counter()
        snapshot(call(fn, steps[0]))
        sync(device)
        cell["first_call_s"] = time.perf_counter() - t0
        if ref is not None:
            err, outs = check_runner(fn, steps, ref)
            cell["max_error"] = err
            if not err <= ref.tolerance and ref.row_slack:
                cell["rows_missed"] = rows_missed(outs, ref.outputs, ref.tolerance)
            if not err <= ref.tolerance and not cell.get("rows_missed", math.inf) <= ref.row_slack \
                    and not _right_by_float64(cell, outs, ref):
                cell.update(status="wrong", tolerance=ref.tolerance)
                fn = None
        if fn is not None:
            for i in range(warmups):
                call(fn, steps[i % len(steps)])
            sync(device)
            mem = watch.stop()
            cell["peak_mem_bytes"] = None if mem is None else mem + model_bytes
            if hasattr(fn, "stats"):     # an ostinato executable: the device launches of one step
                cell["kernels_per_step"] = fn.stats()["kernels"]
            cell["status"] = "ok"
    except Exception as e:   # a runner that fails (compile error, OOM, capture error) is a result too
        cell.update(status="error", error=describe_error(e))
        fn = None
    cell["wall_s"] = time.perf_counter() - t_start
    return cell, fn


def time_interleaved(fns: dict[str, Callable], steps: list, device: torch.device, trials: int = TRIALS,
                     trial_seconds: float = TRIAL_SECONDS) -> dict[str, dict[str, Any]]:
    """Time warmed-up runners with their trials interleaved (trial t of every runner, then trial t + 1):
    a machine that speeds up or slows down during the run moves every runner alike, so the ratios of
    one run hold. Each trial runs k steps, k per runner so a trial lasts about ``trial_seconds``."""
    ks, per_step = {}, {name: [] for name in fns}
    for name, fn in fns.items():
        sync(device)
        t0 = time.perf_counter()
        call(fn, steps[0])
        sync(device)
        ks[name] = max(1, min(200, int(math.ceil(trial_seconds / max(time.perf_counter() - t0, 1e-6)))))
    for t in range(trials):
        for name, fn in fns.items():
            k = ks[name]
            sync(device)
            t0 = time.perf_counter()
            for i in range(k):
                call(fn, steps[(t * k + i) % len(steps)])
            sync(device)
            per_step[name].append((time.perf_counter() - t0) / k * 1e3)
    out = {}
    for name, samples in per_step.items():
        st = trimmed_stats(samples)
        out[name] = {"mean_ms": st["mean"], "min_ms": st["min"], "max_ms": st["max"], "steps_per_trial": ks[name],
                     "trials_ms": samples}
    return out


def measure_cell(make: Callable[[], Callable], steps: list, ref: Reference | None, device: torch.device,
                 model_bytes: int, warmups: int = WARMUPS, trials: int = TRIALS,
                 trial_seconds: float = TRIAL_SECONDS) -> dict[str, Any]:
    """One runner on its own: prepared (built, checked, warmed up), then timed. Failures become
    ``{"status": "error"}``, wrong outputs ``{"status": "wrong"}``; neither is timed."""
    t_start = time.perf_counter()
    cell, fn = prepare_cell(make, steps, ref, device, model_bytes, warmups)
    try:
        if fn is not None:
            cell.update(time_interleaved({"runner": fn}, steps, device, trials, trial_seconds)["runner"])
    except Exception as e:   # noqa: BLE001 - a runner failing while timed is a result too
        cell.update(status="error", error=describe_error(e))
    finally:
        cell["wall_s"] = time.perf_counter() - t_start
        del fn
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return cell
