"""codegen.reference's scalars: made by a fill (a reference may run inside a CUDA graph capture, where a
host copy is refused), with the values torch.tensor(x, dtype=...) gives: rounding, overflow to inf, NaN,
ints and bools."""
import math

import pytest
import torch

from ostinato.codegen.reference import _scalar

VALUES = [0.0, -0.0, 0.1, 1.0 / 3.0, 1e40, -1e40, 65520.0, 1e-45, math.inf, -math.inf, math.nan, 3, -7, True, False]
DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int64, torch.int32, torch.bool]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_scalars_as_torch_tensor_gives_them(dtype):
    cpu = torch.device("cpu")
    for x in VALUES:
        if not dtype.is_floating_point and isinstance(x, float) and not (math.isfinite(x) and abs(x) < 2**31):
            continue        # torch.tensor refuses those too
        try:
            want = torch.tensor(x, dtype=dtype)
        except (RuntimeError, OverflowError):
            continue
        got = _scalar(x, dtype, cpu)
        assert got.dtype == dtype and got.shape == ()
        assert torch.equal(got, want) or (want.is_floating_point() and bool(want.isnan()) and bool(got.isnan())), \
            (x, dtype, got, want)
