"""OpInfo sweep: PyTorch's own OpInfo samples for the ops ostinato claims, exported, compiled for the CPU
and compared against eager.

One test per OpInfo named in OPS. It takes a spread of the OpInfo's sample inputs in float32 (int64 for
integer-only ops) and a smaller spread in a second dtype the op supports (int64, else bfloat16, else
bool), wraps ``opinfo.op(sample.input, *sample.args, **sample.kwargs)`` in an nn.Module whose forward
takes the samples' tensors (every non-tensor argument baked in), runs ``ostinato.export`` →
``ostinato.compile(device="cpu")`` → ``exe(*tensors)`` and compares each sample's result with eager's
through ``helpers.assert_same`` (helpers.TOL: 1e-5 for float32, 1e-2 for bfloat16; TOLERANCE below
loosens it per op with a reason).

Each sample ends as one of:
  passed          ostinato's output equals eager's (structure, dtype, shape, values within tolerance);
  not exportable  torch.export itself cannot trace it (ostinato's ExportError chained from torch's error,
                  *not* UnsupportedOpError): counted and printed, not failed;
  skipped         it matches an entry of SKIP_SAMPLES (each with its reason);
  failed          anything else: UnsupportedOpError, GraphError, a runtime error, a mismatch.

Reading the counts: each test prints ``opinfo <name> [<dtypes>]: passed a/b, not exportable m, failed f,
skipped s`` (see them with ``-s`` without xdist, or in ``-rA``'s captured-output sections), and
tests/conftest.py's pytest_terminal_summary prints the totals at the end of every run, xdist or not:
  ``OpInfo sweep: N samples passed, M not exportable by torch.export, F failed, S skipped (skip list),
  K ops skipped; E OpInfo entries``

Speed: one torch.export + run_decompositions costs ~0.2 s whatever the graph's size, so each test first
exports all its samples together, as one module returning a tuple with every sample's result, and checks
each sample's result separately. Only when that export/compile/run raises are the samples redone one by
one, to say which fail and how. The whole sweep takes about 2 minutes with ``-n 2`` on 2 cores.
"""
from __future__ import annotations

import itertools
import zlib

import pytest
import torch
from torch.testing._internal.common_methods_invocations import op_db
from torch.utils import _pytree as pytree

import ostinato
from ostinato.errors import ExportError, UnsupportedOpError

from helpers import assert_same

# ---------------------------------------------------------------------------------------------------
# The OpInfo entries swept ("name" or "name.variant_test_name", as in op_db).
# Chosen for the ops in ostinato/ir/aten_ops.py: each one's export reaches those ops (directly or
# through torch.export's decompositions). Not chosen: linear algebra beyond matmul (linalg.* solvers,
# decompositions), FFT, special functions without a core decomposition, sparse, quantized, the
# functional `*_copy` variants of views (view_copy, permute_copy, ...: torch.export keeps them as
# aten.*_copy, which ostinato does not claim and models only reach by calling torch.*_copy by name).
# ---------------------------------------------------------------------------------------------------
OPS = [
    # -- elementwise unary --
    "abs", "acos", "acosh", "asin", "asinh", "atan", "atanh", "ceil", "cos", "cosh", "deg2rad",
    "erf", "erfc", "erfinv", "exp", "exp2", "expm1", "floor", "frac", "isfinite", "isinf", "isnan",
    "isneginf", "isposinf", "isreal", "log", "log10", "log1p", "log2", "logical_not", "logit",
    "nan_to_num", "neg", "positive", "rad2deg", "reciprocal", "round", "round.decimals_0",
    "round.decimals_3", "round.decimals_neg_3", "rsqrt", "sgn", "sigmoid", "sign", "signbit", "sin",
    "sinc", "sinh", "sqrt", "square", "tan", "tanh", "trunc", "bitwise_not",
    "special.entr", "special.ndtr", "special.xlog1py",
    # -- elementwise binary / ternary --
    "add", "sub", "rsub", "mul", "div.no_rounding_mode", "div.trunc_rounding", "div.floor_rounding",
    "true_divide", "floor_divide", "remainder", "fmod", "pow", "float_power", "atan2", "hypot",
    "copysign", "ldexp", "maximum", "minimum", "fmax", "fmin", "max.binary", "min.binary", "heaviside",
    "xlogy", "logaddexp", "logaddexp2", "lerp", "addcmul", "addcdiv", "where", "clamp", "clamp_min",
    "clamp_max", "eq", "ne", "lt", "le", "gt", "ge", "isclose", "logical_and", "logical_or",
    "logical_xor", "bitwise_and", "bitwise_or", "bitwise_xor", "bitwise_left_shift",
    "bitwise_right_shift", "masked_fill",
    # -- activations --
    "nn.functional.relu", "nn.functional.relu6", "nn.functional.gelu", "nn.functional.silu",
    "nn.functional.elu", "nn.functional.celu", "nn.functional.selu", "nn.functional.leaky_relu",
    "nn.functional.hardtanh", "nn.functional.hardsigmoid", "nn.functional.hardswish",
    "nn.functional.hardshrink", "nn.functional.softshrink", "nn.functional.tanhshrink",
    "nn.functional.softplus", "nn.functional.softsign", "nn.functional.mish",
    "nn.functional.logsigmoid", "nn.functional.threshold", "nn.functional.glu", "nn.functional.prelu",
    # -- reductions and scans --
    "sum", "nansum", "mean", "nanmean", "prod", "amax", "amin", "aminmax", "max.reduction_no_dim",
    "max.reduction_with_dim", "min.reduction_no_dim", "min.reduction_with_dim", "argmax", "argmin",
    "all", "any", "count_nonzero", "var", "var.unbiased", "var_mean", "var_mean.unbiased", "std",
    "std.unbiased", "std_mean", "std_mean.unbiased", "logsumexp", "linalg.vector_norm", "renorm",
    "cumsum", "cumprod", "cummax", "cummin", "logcumsumexp", "diff", "trace",
    # -- softmax and norms --
    "softmax", "softmax.with_dtype", "log_softmax", "log_softmax.with_dtype", "nn.functional.softmin",
    "nn.functional.softmin.with_dtype", "nn.functional.layer_norm", "native_layer_norm",
    "nn.functional.rms_norm", "nn.functional.group_norm", "native_group_norm",
    "nn.functional.batch_norm", "native_batch_norm", "nn.functional.instance_norm",
    "nn.functional.local_response_norm", "nn.functional.normalize",
    # -- views, shape manipulation, concatenation --
    "view", "view_as", "reshape", "reshape_as", "flatten", "unflatten", "ravel", "permute", "movedim",
    "transpose", "t", "mT", "mH", "expand", "expand_as", "broadcast_to", "broadcast_tensors",
    "squeeze", "squeeze.multiple", "unsqueeze", "atleast_1d", "atleast_2d", "atleast_3d", "clone",
    "contiguous", "slice", "select", "narrow", "diagonal", "as_strided", "unfold", "chunk",
    "unsafe_chunk", "split", "split.list_args", "split_with_sizes", "unsafe_split", "tensor_split",
    "hsplit", "vsplit", "dsplit", "unbind", "cat", "stack", "hstack", "vstack", "dstack",
    "column_stack", "repeat", "tile", "repeat_interleave", "flip", "fliplr", "flipud", "roll",
    "rot90", "tril", "triu", "diag", "diag_embed", "diagflat", "block_diag", "view_as_real",
    "view_as_complex", "constant_pad_nd", "nn.functional.pad.constant", "nn.functional.pad.reflect",
    "nn.functional.pad.replicate", "nn.functional.pad.replicate_negative",
    "nn.functional.pad.circular", "nn.functional.pixel_shuffle", "nn.functional.pixel_unshuffle",
    "nn.functional.channel_shuffle", "meshgrid.list_of_tensors", "meshgrid.variadic_tensors",
    "cartesian_prod", "sum_to_size",
    # -- scatter-style writes into views --
    "slice_scatter", "select_scatter", "diagonal_scatter", "as_strided_scatter",
    # -- indexing, gather/scatter, sort --
    "index_select", "index_add", "index_fill", "index_put", "gather", "scatter", "scatter_add",
    "scatter_reduce.sum", "scatter_reduce.prod", "scatter_reduce.mean", "scatter_reduce.amax",
    "scatter_reduce.amin", "masked_scatter", "take_along_dim", "nn.functional.embedding", "topk",
    "sort", "argsort", "msort", "kthvalue", "bucketize", "searchsorted", "nn.functional.one_hot",
    # -- data-dependent output shapes (ostinato's host_sync ops) --
    "nonzero", "argwhere", "masked_select",
    # -- matmul family --
    "mm", "bmm", "matmul", "addmm", "addmm.decomposed", "baddbmm", "addbmm", "addmv", "addr", "dot",
    "mv", "outer", "inner", "linalg.vecdot", "kron", "tensordot", "einsum", "cross",
    "nn.functional.linear", "nn.functional.bilinear", "nn.functional.scaled_dot_product_attention",
    "nn.functional.multi_head_attention_forward",
    # -- convolution --
    "nn.functional.conv1d", "nn.functional.conv2d", "nn.functional.conv3d",
    "nn.functional.conv_transpose1d", "nn.functional.conv_transpose2d",
    "nn.functional.conv_transpose3d", "nn.functional.unfold",
    # -- pooling, resampling --
    "nn.functional.max_pool1d", "nn.functional.max_pool2d", "nn.functional.max_pool3d",
    "nn.functional.avg_pool1d", "nn.functional.avg_pool2d", "nn.functional.avg_pool3d",
    "nn.functional.adaptive_avg_pool1d", "nn.functional.adaptive_avg_pool2d",
    "nn.functional.adaptive_avg_pool3d", "nn.functional.adaptive_max_pool1d",
    "nn.functional.adaptive_max_pool2d", "nn.functional.interpolate.nearest",
    "nn.functional.interpolate.nearest-exact", "nn.functional.interpolate.linear",
    "nn.functional.interpolate.bilinear", "nn.functional.interpolate.bicubic",
    "nn.functional.interpolate.trilinear", "nn.functional.interpolate.area",
    "nn.functional.upsample_nearest", "nn.functional.upsample_bilinear", "nn.functional.grid_sample",
    "grid_sampler_2d",
    # -- losses and distances (compositions of the ops above) --
    "nn.functional.mse_loss", "nn.functional.l1_loss", "nn.functional.smooth_l1_loss",
    "nn.functional.huber_loss", "nn.functional.binary_cross_entropy",
    "nn.functional.binary_cross_entropy_with_logits", "nn.functional.cross_entropy",
    "nn.functional.nll_loss", "nn.functional.kl_div", "nn.functional.soft_margin_loss",
    "nn.functional.margin_ranking_loss", "nn.functional.hinge_embedding_loss",
    "nn.functional.cosine_embedding_loss", "nn.functional.multilabel_soft_margin_loss",
    "nn.functional.poisson_nll_loss", "nn.functional.gaussian_nll_loss",
    "nn.functional.triplet_margin_loss", "nn.functional.cosine_similarity",
    "nn.functional.pairwise_distance",
    # -- creation and conversion --
    "zeros", "ones", "full", "arange", "linspace", "eye", "scalar_tensor", "tril_indices",
    "triu_indices", "zeros_like", "ones_like", "full_like", "empty_like", "new_zeros", "new_ones",
    "new_full", "new_empty", "fill", "to", "double", "half", "bfloat16", "long", "bool",
    # -- random ops: values compared on dtype/shape only (META_ONLY) --
    "nn.functional.dropout", "bernoulli", "rand_like", "randn_like", "randint_like", "multinomial",
]

# ---------------------------------------------------------------------------------------------------
# Skips. Whole OpInfo entries: {name: reason}. Every entry needs a comment saying why it cannot be
# tested this way; a missing op or an ostinato bug is never a reason.
# ---------------------------------------------------------------------------------------------------
SKIP_OPS: dict[str, str] = {
    # none at present: every chosen entry has at least some samples that must pass
}

# Samples: {(name, reason_class): reason}; SAMPLE_CLASSES[reason_class] says which samples it covers.
SAMPLE_CLASSES = {
    # Training-mode batch norm updates running_mean/running_var in place (torch.export lowers it to
    # aten._native_batch_norm_legit_functional plus input mutations): a training graph, and
    # ostinato exports inference graphs. Eval-mode samples (training=False) are still run.
    "training_batch_norm": lambda s: (s.kwargs.get("training") is True
                                      or (len(s.args) >= 5 and s.args[4] is True)),
    # instance_norm with running stats (and the default use_input_stats=True) updates the running
    # stats in place: the same training-mode batch norm. Samples without running stats still run.
    "instance_norm_running_stats": lambda s: (s.kwargs.get("running_mean") is not None
                                              and s.kwargs.get("use_input_stats", True)),
    # Dropout inside the op with training=True / dropout_p > 0: random, not comparable with eager.
    "dropout": lambda s: (s.kwargs.get("training") is True and _positive(_arg(s, 9, "dropout_p")))
    or _positive(s.kwargs.get("dropout_p")),
    # F.embedding(max_norm=...) renormalizes rows of the *weight* in place (aten.embedding_renorm_,
    # functionalized by torch.export to aten.embedding_renorm + a write-back): it rewrites the
    # embedding table on every call, which is training-time state, not an inference op.
    "embedding_max_norm": lambda s: s.kwargs.get("max_norm") is not None,
}


def _arg(s, i, key):
    return s.kwargs.get(key, s.args[i] if len(s.args) > i else None)


def _positive(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and x > 0


def _other_device(s) -> bool:
    """The sample names a device (or passes a tensor) other than the CPU; OpInfo adds these where CUDA is
    available."""
    def names_device(x):
        if isinstance(x, torch.device):
            return x.type != "cpu"
        if isinstance(x, torch.Tensor):  # Tensor.to(other) takes other's device
            return x.device.type != "cpu"
        if isinstance(x, str):
            return x.startswith(("cuda", "mps", "xpu"))
        if isinstance(x, (list, tuple)):
            return any(names_device(y) for y in x)
        return False
    return names_device(list(s.args)) or names_device(list(s.kwargs.values()))


# Samples skipped for every op: {reason_class: reason}.
SKIP_ALL_SAMPLES: dict[str, str] = {
    # An ostinato executable runs on the one device it was compiled for: device arguments of creation
    # ops are replaced by it. Eager moves these samples' results to the other device.
    "other_device": "moves data to another device; an ostinato executable runs on one device",
}
SAMPLE_CLASSES["other_device"] = _other_device

SKIP_SAMPLES: dict[tuple[str, str], str] = {
    ("nn.functional.batch_norm", "training_batch_norm"): "training-mode batch norm (mutates running stats)",
    ("native_batch_norm", "training_batch_norm"): "training-mode batch norm (mutates running stats)",
    ("nn.functional.instance_norm", "instance_norm_running_stats"):
        "instance norm updating running stats in place (training-mode batch norm)",
    ("nn.functional.multi_head_attention_forward", "dropout"): "training=True with dropout_p > 0: random",
    ("nn.functional.scaled_dot_product_attention", "dropout"): "dropout_p > 0: random",
    ("nn.functional.embedding", "embedding_max_norm"): "max_norm renormalizes the weight in place",
}

# Outputs whose values are not defined, so only dtype and shape are compared: {name: reason}.
META_ONLY: dict[str, str] = {
    "empty_like": "uninitialized memory",
    "new_empty": "uninitialized memory",
    "nn.functional.dropout": "random op",
    "bernoulli": "random op",
    "rand_like": "random op",
    "randn_like": "random op",
    "randint_like": "random op",
    "multinomial": "random op",
}

# Tolerances looser than helpers.TOL, per (name, dtype): {(name, dtype): (tol, reason)}.
TOLERANCE: dict[tuple[str, torch.dtype], tuple[float, str]] = {
    # ostinato does not claim aten.upsample_trilinear3d, so torch.export decomposes it into gathers
    # and lerps that round every step to bfloat16; eager's kernel accumulates in float32. Observed:
    # 0.047 at values up to 9 (under one bfloat16 ulp at 8, which is 0.0625).
    ("nn.functional.interpolate.trilinear", torch.bfloat16): (5e-2, "decomposition rounds in bf16"),
}

N_SAMPLES = (8, 4)      # samples per op in its first and second dtype: a spread over the first MAX_GENERATED
MAX_GENERATED = 60

_DB = {(o.name + ("." + o.variant_test_name if o.variant_test_name else "")): o for o in op_db}


def _dtypes(opinfo) -> list[torch.dtype]:
    """float32 (int64 where the op has no float32), then one more dtype the op supports on the CPU."""
    supported = opinfo.supported_dtypes("cpu")
    order = [torch.float32, torch.int64, torch.bfloat16, torch.bool]
    return [d for d in order if d in supported][:2]


# ---------------------------------------------------------------------------------------------------
# Wrapping samples in modules
# ---------------------------------------------------------------------------------------------------
def _map_tensors(obj, fn):
    """``fn`` applied to every tensor in nested lists/tuples/dicts; everything else kept as is."""
    if isinstance(obj, torch.Tensor):
        return fn(obj)
    if type(obj) in (list, tuple):
        return type(obj)(_map_tensors(x, fn) for x in obj)
    if type(obj) is dict:
        return {k: _map_tensors(v, fn) for k, v in obj.items()}
    return obj


def _tensors(tree) -> list[torch.Tensor]:
    out: list[torch.Tensor] = []
    _map_tensors(tree, lambda t: out.append(t) or t)
    return out


class SamplesModule(torch.nn.Module):
    """``forward(*tensors)`` returns ``[op(input, *args, **kwargs) for each sample]`` with the samples'
    tensors replaced by the inputs, in order; sizes, dims, dtypes and Python scalars are baked in."""

    def __init__(self, op, trees):
        super().__init__()
        self.op = op
        self.trees = trees

    def forward(self, *tensors):
        it = iter(tensors)
        outs = []
        for tree in self.trees:
            inp, args, kwargs = _map_tensors(tree, lambda _: next(it))
            outs.append(self.op(inp, *args, **kwargs))
        return tuple(outs)


def _trees(samples):
    """Each sample's (input, args, kwargs), detached; a tensor object passed twice is cloned the second
    time so that no two module inputs are the same tensor."""
    seen: set[int] = set()

    def fresh(t):
        if id(t) in seen:
            return t.clone()
        seen.add(id(t))
        return t.detach()

    return [_map_tensors((s.input, tuple(s.args), dict(s.kwargs)), fresh) for s in samples]


def describe(tree) -> str:
    def d(x):
        text = f"{str(x.dtype).replace('torch.', '')}{list(x.shape)}"
        return text if x.is_contiguous() else text + "(non-contiguous)"
    inp, args, kwargs = _map_tensors(tree, d)
    return f"input={inp} args={args} kwargs={kwargs}"


def _is_torch_export_failure(e: ExportError) -> bool:
    """ostinato.export wraps what torch.export / run_decompositions raise as ExportError("torch.export
    could not trace ...") chained from torch's error. UnsupportedOpError and the converter's own
    ExportErrors are ostinato's verdicts, not torch's."""
    return (not isinstance(e, UnsupportedOpError) and e.__cause__ is not None
            and str(e).startswith("torch.export could not trace"))


def _check(out, ref, tol, meta_only: bool) -> None:
    if meta_only:
        o_leaves, o_spec = pytree.tree_flatten(out)
        r_leaves, r_spec = pytree.tree_flatten(ref)
        assert o_spec == r_spec, f"structure differs: {o_spec} vs {r_spec}"
        for o, r in zip(o_leaves, r_leaves):
            assert type(o) is type(r), f"{type(o).__name__} vs {type(r).__name__}"
            if isinstance(r, torch.Tensor):
                assert (o.dtype, o.shape) == (r.dtype, r.shape), \
                    f"{o.dtype}{list(o.shape)} vs {r.dtype}{list(r.shape)}"
    else:
        assert_same(out, ref, tol)


def run_samples(op, items, meta_only: bool):
    """Export the samples ``items`` ([(tree, tol)]) as one module, compile it for the CPU, run it and
    compare each sample's result with eager's. Returns ("not_exportable", torch's error) or
    ("ran", [None or the comparison's exception, per sample]); any other error propagates."""
    trees = [tree for tree, _ in items]
    inputs = _tensors(trees)
    model = SamplesModule(op, trees)
    with torch.no_grad():
        ref = model(*inputs)
    try:
        prog = ostinato.export(model, tuple(inputs), strict=True)   # ostinato's own kernels, no fallback
    except ExportError as e:
        if _is_torch_export_failure(e):
            return "not_exportable", e.__cause__
        raise
    exe = ostinato.compile(prog, device="cpu")
    out = exe(*inputs)
    assert isinstance(out, tuple) and len(out) == len(items), f"outputs: {type(out).__name__}"
    results = []
    for o, r, (_, tol) in zip(out, ref, items):
        try:
            _check(o, r, tol, meta_only)
            results.append(None)
        except AssertionError as e:
            results.append(e)
    return "ran", results


def _first_line(e: BaseException, limit: int = 400) -> str:
    text = str(e).strip()
    return f"{type(e).__name__}: {text.splitlines()[0][:limit] if text else ''}"


def _error_text(e: BaseException) -> str:
    """The lines of an error worth reading: the first few, without ostinato's generic 'Fix:' advice."""
    lines = [ln for ln in str(e).strip().splitlines() if ln.strip() and not ln.startswith("Fix:")]
    return f"  {type(e).__name__}: " + "\n    ".join(ln[:300] for ln in lines[:8])


# ---------------------------------------------------------------------------------------------------
# The test
# ---------------------------------------------------------------------------------------------------
@pytest.fixture
def _one_thread():
    """Tiny tensors: intra-op threads only oversubscribe the cores xdist's workers already share."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def _pick(samples: list, n: int) -> list:
    """An even spread of ``n`` samples: OpInfo lists simple samples first, broadcasting etc. later."""
    if len(samples) <= n:
        return samples
    return [samples[round(i * (len(samples) - 1) / (n - 1))] for i in range(n)]


@pytest.mark.parametrize("name", OPS)
def test_opinfo(name, record_property, _one_thread):
    if name in SKIP_OPS:
        record_property("opinfo", {"op_skipped": 1})
        pytest.skip(f"{name}: {SKIP_OPS[name]}")
    opinfo = _DB.get(name)
    if opinfo is None:  # the OpInfo database changes between torch releases (2.11 lacks some entries)
        record_property("opinfo", {"op_skipped": 1})
        pytest.skip(f"no OpInfo named {name!r} in torch {torch.__version__}'s op_db")
    torch.manual_seed(zlib.crc32(name.encode()))

    items, skipped = [], 0      # items: (tree, tolerance or None for helpers.TOL's)
    for dtype, n in zip(_dtypes(opinfo), N_SAMPLES):
        generated = itertools.islice(opinfo.sample_inputs("cpu", dtype, requires_grad=False),
                                     MAX_GENERATED)
        kept = []
        for s in generated:
            if any(n_ == name and SAMPLE_CLASSES[cls](s) for n_, cls in SKIP_SAMPLES) or \
                    any(SAMPLE_CLASSES[cls](s) for cls in SKIP_ALL_SAMPLES):
                skipped += 1
            else:
                kept.append(s)
        tol = TOLERANCE.get((name, dtype), (None, ""))[0]
        items += [(tree, tol) for tree in _trees(_pick(kept, n))]
    meta_only = name in META_ONLY

    passed, not_exportable, failures = 0, [], []
    try:
        kind, results = run_samples(opinfo.op, items, meta_only) if items else ("ran", [])
    except Exception:  # noqa: BLE001 - retried one sample at a time below, to say which one fails
        kind, results = "retry", None
    if kind == "ran":
        for (tree, _), err in zip(items, results):
            if err is None:
                passed += 1
            else:
                failures.append((describe(tree), _error_text(err)))
    else:
        for item in items:
            tree = item[0]
            try:
                kind, res = run_samples(opinfo.op, [item], meta_only)
                if kind == "ran" and res[0] is not None:
                    raise res[0]
            except Exception as e:  # noqa: BLE001 - every exception is a failure to report
                failures.append((describe(tree), _error_text(e)))
                continue
            if kind == "ran":
                passed += 1
            else:
                not_exportable.append(f"  {describe(tree)}\n      {_first_line(res)}")

    counts = {"passed": passed, "total": len(items), "not_exportable": len(not_exportable),
              "failed": len(failures), "skipped": skipped}
    record_property("opinfo", counts)
    dts = "/".join(str(d).replace("torch.", "") for d in _dtypes(opinfo))
    print(f"opinfo {name} [{dts}]: passed {passed}/{len(items)}, not exportable "
          f"{len(not_exportable)}, failed {len(failures)}, skipped {skipped}")
    for line in not_exportable:
        print(f"not exportable by torch.export:\n{line}")
    if failures:
        pytest.fail(f"{name}: {len(failures)} of {len(items)} samples failed\n" + _grouped(failures),
                    pytrace=False)


def _grouped(failures: list[tuple[str, str]]) -> str:
    """Failures that share an error, listed once under it: ``error\n  sample\n  sample``."""
    by_error: dict[str, list[str]] = {}
    for sample, error in failures:
        by_error.setdefault(error, []).append(sample)
    return "\n".join(f"{error}\n" + "\n".join(f"    {s}" for s in samples)
                     for error, samples in by_error.items())
