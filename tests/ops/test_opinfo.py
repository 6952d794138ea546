"""OpInfo sweep: PyTorch's own OpInfo samples for the ops ostinato claims, exported, compiled for the CPU
and compared against eager.

For every OpInfo named in OPS, one test per dtype (float32, plus a second dtype the op supports: int64,
else bfloat16, else bool) takes a spread of the OpInfo's sample inputs, wraps
``opinfo.op(sample.input, *sample.args, **sample.kwargs)`` in an nn.Module whose forward takes the
sample's tensors (every non-tensor argument baked in), runs ``ostinato.export`` → ``ostinato.compile``
→ ``exe(*tensors)`` and compares with eager through ``helpers.assert_same``.

Each sample ends as one of:
  passed          ostinato's output equals eager's (dtype, shape, values within tolerance);
  not exportable  torch.export itself cannot trace it (ostinato's ExportError chained from torch's error,
                  *not* UnsupportedOpError): counted and printed, not failed;
  skipped         it matches an entry of SKIP_SAMPLES (a reason is given for each);
  failed          anything else: UnsupportedOpError, a GraphError, a runtime error, a mismatch.

Reading the counts: each test prints ``opinfo <name> [<dtype>]: passed a/b ...``; with ``-s`` (no xdist)
or ``-rA`` (in the captured-output sections) you see them per op, and tests/conftest.py prints the
totals at the end of every run, with or without xdist:
  ``OpInfo sweep: N samples passed, M not exportable by torch.export, F failed, S skipped, K ops skipped``

Speed: torch.export + run_decompositions costs ~0.3 s per call whatever the graph's size, so all the
samples of one test are first exported together, as one module returning every sample's result; only
when that fails are the samples run one by one, to say which sample fails and how.
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
    # F.embedding(max_norm=...) renormalizes rows of the *weight* in place (aten.embedding_renorm_):
    # it mutates a parameter on every call, which an inference export cannot express faithfully.
    "embedding_max_norm": lambda s: s.kwargs.get("max_norm") is not None,
}


def _arg(s, i, key):
    return s.kwargs.get(key, s.args[i] if len(s.args) > i else None)


def _positive(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and x > 0


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
}

N_SAMPLES = {torch.float32: 6}   # samples per op: a spread over the first MAX_GENERATED
N_SAMPLES_OTHER = 3              # in the second dtype
MAX_GENERATED = 60

_DB = {(o.name + ("." + o.variant_test_name if o.variant_test_name else "")): o for o in op_db}


def _dtypes(opinfo) -> list[torch.dtype]:
    """float32 (int64 where the op has no float32), then one more dtype the op supports on the CPU."""
    supported = opinfo.supported_dtypes("cpu")
    order = [torch.float32, torch.int64, torch.bfloat16, torch.bool]
    return [d for d in order if d in supported][:2]


def _cases():
    cases = []
    for name in OPS:
        opinfo = _DB.get(name)
        if opinfo is None:          # keeps collection working on a torch that renamed an entry
            cases.append(pytest.param(name, torch.float32, id=f"{name}-missing"))
            continue
        for dtype in _dtypes(opinfo):
            cases.append(pytest.param(name, dtype, id=f"{name}-{str(dtype).replace('torch.', '')}"))
    return cases


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


def run_samples(op, trees, tol, meta_only: bool):
    """Export all ``trees`` as one module, compile for the CPU, run, compare with eager. Returns
    None when every sample passed, else the torch.export error (for "not exportable")."""
    inputs = _tensors(trees)
    model = SamplesModule(op, trees)
    with torch.no_grad():
        ref = model(*inputs)
    try:
        prog = ostinato.export(model, tuple(inputs))
    except ExportError as e:
        if _is_torch_export_failure(e):
            return e.__cause__
        raise
    exe = ostinato.compile(prog, device="cpu")
    out = exe(*inputs)
    _check(out, ref, tol, meta_only)
    return None


def _first_line(e: BaseException, limit: int = 400) -> str:
    text = str(e).strip()
    return f"{type(e).__name__}: {text.splitlines()[0][:limit] if text else ''}"


def _error_text(e: BaseException) -> str:
    """The lines of an error worth reading: the first few, without ostinato's generic 'Fix:' advice."""
    lines = [ln for ln in str(e).strip().splitlines() if ln.strip() and not ln.startswith("Fix:")]
    return f"{type(e).__name__}: " + "\n      ".join(ln[:300] for ln in lines[:6])


# ---------------------------------------------------------------------------------------------------
# The test
# ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name,dtype", _cases())
def test_opinfo(name, dtype, record_property):
    if name in SKIP_OPS:
        record_property("opinfo", {"op_skipped": 1})
        pytest.skip(f"{name}: {SKIP_OPS[name]}")
    opinfo = _DB.get(name)
    assert opinfo is not None, f"no OpInfo named {name!r} in this torch's op_db"

    torch.manual_seed(zlib.crc32(f"{name}-{dtype}".encode()))
    generated = list(itertools.islice(opinfo.sample_inputs("cpu", dtype, requires_grad=False),
                                      MAX_GENERATED))
    skipped = []
    kept = []
    for s in generated:
        reason = next((r for (n, cls), r in SKIP_SAMPLES.items()
                       if n == name and SAMPLE_CLASSES[cls](s)), None)
        (skipped if reason else kept).append(s)
    n = N_SAMPLES.get(dtype, N_SAMPLES_OTHER)
    if len(kept) > n:    # an even spread: OpInfo lists simple samples first, broadcasting etc. later
        kept = [kept[round(i * (len(kept) - 1) / (n - 1))] for i in range(n)]
    tol_entry = TOLERANCE.get((name, dtype))
    tol = tol_entry[0] if tol_entry else None
    meta_only = name in META_ONLY

    trees = _trees(kept)
    passed, not_exportable, failures = 0, [], []
    try:
        batch_error = run_samples(opinfo.op, trees, tol, meta_only) if trees else None
        if batch_error is None:
            passed = len(trees)
    except Exception:  # noqa: BLE001 - retried one sample at a time below, to say which one fails
        batch_error = True
    if batch_error is not None:
        for tree in trees:
            try:
                err = run_samples(opinfo.op, [tree], tol, meta_only)
            except Exception as e:  # noqa: BLE001 - every exception is a failure to report
                failures.append(f"  {describe(tree)}\n      {_error_text(e)}")
                continue
            if err is None:
                passed += 1
            else:
                not_exportable.append(f"  {describe(tree)}\n      {_first_line(err)}")

    counts = {"passed": passed, "total": len(trees), "not_exportable": len(not_exportable),
              "failed": len(failures), "skipped": len(skipped)}
    record_property("opinfo", counts)
    dt = str(dtype).replace("torch.", "")
    print(f"opinfo {name} [{dt}]: passed {passed}/{len(trees)}, not exportable {len(not_exportable)}, "
          f"failed {len(failures)}, skipped {len(skipped)}")
    for line in not_exportable:
        print(f"not exportable by torch.export:\n{line}")
    if failures:
        pytest.fail(f"{name} [{dt}]: {len(failures)} of {len(trees)} samples failed:\n"
                    + "\n".join(failures), pytrace=False)
