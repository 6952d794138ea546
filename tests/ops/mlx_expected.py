"""What the op table expects of the MLX backend (tests/ops/test_op_table.py, device "mlx").

MLX_TORCH_OPS: ops the MLX backend runs through torch (no MLX handler), each with the reason. Their
rows compile without strict and must still match eager; every other row compiles with strict=True.
MLX_SKIPS: rows that cannot run on MLX at all, by case id, with the reason (kept as short as we can).
"""
from __future__ import annotations

MLX_TORCH_OPS: dict[str, str] = {
    "aten.repeat_interleave.Tensor": "output size depends on the repeats' values",
    "aten.masked_scatter": "output depends on the mask's count of True values (host sync)",
    "aten.upsample_bicubic2d.vec": "not mapped yet",
    "aten.col2im": "not mapped yet",
    "aten.im2col": "not mapped yet",
    "aten.diag_embed": "not mapped yet",
    "aten.view_as_real": "MLX complex views of real data are not supported",
    "aten.view_as_complex": "MLX complex views of real data are not supported",
    "aten.nonzero": "data-dependent output shape (host sync)",
    "aten.masked_select": "data-dependent output shape (host sync)",
    "aten.diagonal_scatter": "not mapped yet",
    "aten.as_strided_scatter": "not mapped yet",
    "aten.scatter.reduce": "not mapped yet",
    "aten.scatter.value_reduce": "not mapped yet",
    "aten._trilinear": "not mapped yet",
    "aten.grid_sampler_3d": "not mapped yet",
    "aten._native_batch_norm_legit.no_stats": "training-mode batch statistics: not mapped",
}

# Rows whose op has an MLX handler, but not for this form of it: they run through torch too.
MLX_TORCH_CASES: dict[str, str] = {
    "index.Tensor-f32-boolmask": "a boolean mask index has a data-dependent output shape",
}

MLX_SKIPS: dict[str, str] = {}


def mlx_skip_reason(case) -> str:
    return MLX_SKIPS.get(case.id, "")


def mlx_through_torch(case) -> bool:
    """Whether the row runs (partly) through torch on MLX, rather than compiling with strict=True."""
    return case.op in MLX_TORCH_OPS or case.id in MLX_TORCH_CASES
