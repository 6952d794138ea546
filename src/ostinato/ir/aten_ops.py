"""The ATen ops ostinato claims: the core ATen set that torch.export decomposes to, plus the
composite ops the frontend keeps whole because passes and backends want them as one op."""
from __future__ import annotations

from .ops import register_aten

register_aten("""
    aten.abs aten.neg aten.exp aten.exp2 aten.expm1 aten.log aten.log2 aten.log10 aten.log1p aten.sqrt
    aten.rsqrt aten.reciprocal aten.sin aten.cos aten.tan aten.asin aten.acos aten.atan aten.sinh
    aten.cosh aten.tanh aten.asinh aten.acosh aten.atanh aten.sigmoid aten.erf aten.erfc aten.erfinv
    aten.sign aten.sgn aten.floor aten.ceil aten.round aten.round.decimals aten.trunc aten.frac
    aten.relu aten.gelu aten.silu aten.hardtanh aten.leaky_relu aten.elu aten.softplus
    aten.hardsigmoid aten.hardswish aten.mish aten.logit aten.isnan aten.isinf aten.isfinite
    aten.logical_not aten.bitwise_not aten.nan_to_num aten.clamp aten.clamp.Tensor
    aten.add.Tensor aten.add.Scalar aten.sub.Tensor aten.sub.Scalar aten.mul.Tensor aten.mul.Scalar
    aten.div.Tensor aten.div.Scalar aten.div.Tensor_mode aten.div.Scalar_mode aten.pow.Tensor_Tensor
    aten.pow.Tensor_Scalar aten.pow.Scalar aten.remainder.Tensor aten.remainder.Scalar aten.fmod.Tensor
    aten.fmod.Scalar aten.maximum aten.minimum aten.fmax aten.fmin aten.atan2 aten.hypot
    aten.copysign.Tensor aten.lerp.Tensor aten.lerp.Scalar aten.where.self aten.where.ScalarSelf
    aten.where.ScalarOther aten.eq.Tensor aten.eq.Scalar aten.ne.Tensor aten.ne.Scalar aten.lt.Tensor
    aten.lt.Scalar aten.le.Tensor aten.le.Scalar aten.gt.Tensor aten.gt.Scalar aten.ge.Tensor
    aten.ge.Scalar aten.logical_and aten.logical_or aten.logical_xor aten.bitwise_and.Tensor
    aten.bitwise_and.Scalar aten.bitwise_or.Tensor aten.bitwise_or.Scalar aten.bitwise_xor.Tensor
    aten.bitwise_xor.Scalar aten.bitwise_left_shift.Tensor aten.bitwise_right_shift.Tensor
    aten.masked_fill.Scalar aten.masked_fill.Tensor aten.addcmul aten.addcdiv aten.rsub.Scalar
    aten.floor_divide aten.xlogy.Tensor aten.sigmoid_backward aten.heaviside
""", "elementwise")

register_aten("""
    aten.sum aten.sum.dim_IntList aten.mean aten.mean.dim aten.prod aten.prod.dim_int aten.amax
    aten.amin aten.max aten.min aten.max.dim aten.min.dim aten.argmax aten.argmin aten.any aten.any.dim
    aten.any.dims aten.all aten.all.dim aten.all.dims aten.var.correction aten.var_mean.correction
    aten.std.correction aten.logsumexp aten.linalg_vector_norm aten.cumsum aten.cumprod aten.cummax
    aten.cummin aten.logcumsumexp
""", "reduction")

register_aten("""
    aten.view aten.reshape aten._unsafe_view aten.permute aten.transpose.int aten.t aten.expand
    aten.squeeze aten.squeeze.dim aten.squeeze.dims aten.unsqueeze aten.flatten.using_ints
    aten.unflatten.int aten.clone aten.contiguous aten.alias aten.slice.Tensor aten.slice_scatter
    aten.select.int aten.select_scatter aten.narrow aten.cat aten.stack aten.split.Tensor
    aten.split_with_sizes aten.unbind.int aten.chunk aten.repeat aten.repeat_interleave.self_int
    aten.repeat_interleave.Tensor aten.flip aten.roll aten.diagonal aten.diag_embed
    aten.constant_pad_nd aten.reflection_pad1d aten.reflection_pad2d aten.replication_pad1d
    aten.replication_pad2d aten.as_strided aten.unfold aten.tril aten.triu aten.pixel_shuffle
    aten.pixel_unshuffle aten.view_as_real aten.view_as_complex aten.movedim.int aten.lift_fresh_copy
    aten.detach aten.empty_like aten.copy
""", "view")

register_aten("""
    aten.index.Tensor aten.index_put aten.index_select aten.index_copy aten.index_add aten.index_fill.int_Scalar
    aten.gather aten.scatter.src aten.scatter.value aten.scatter_add aten.scatter_reduce.two
    aten.masked_scatter aten.take_along_dim aten.embedding aten.topk aten.sort aten.sort.stable
    aten.argsort aten.argsort.stable aten.kthvalue aten.bucketize.Tensor aten.searchsorted.Tensor
""", "indexing")

register_aten("""
    aten.mm aten.bmm aten.addmm aten.baddbmm aten.matmul aten.linear aten.dot aten.mv aten.outer
    aten.convolution aten.scaled_dot_product_attention
""", "matmul")

register_aten("""
    aten.max_pool2d_with_indices aten.max_pool3d_with_indices aten.avg_pool1d aten.avg_pool2d
    aten.avg_pool3d aten._adaptive_avg_pool2d aten.adaptive_max_pool2d aten._adaptive_avg_pool3d
    aten.upsample_nearest1d.vec aten.upsample_nearest2d.vec aten.upsample_bilinear2d.vec
    aten.upsample_linear1d.vec aten.upsample_bicubic2d.vec aten.upsample_nearest2d aten.upsample_bilinear2d
    aten.grid_sampler_2d aten.col2im aten.im2col
""", "pooling")

register_aten("""
    aten._softmax aten._log_softmax aten.softmax.int aten.log_softmax.int aten.layer_norm
    aten.native_layer_norm aten.rms_norm aten.native_group_norm aten._native_batch_norm_legit_no_training
    aten._native_batch_norm_legit.no_stats aten.native_batch_norm aten._weight_norm_interface
""", "norm")

register_aten("""
    aten.arange aten.arange.start aten.arange.start_step aten.full aten.full_like aten.zeros
    aten.zeros_like aten.ones aten.ones_like aten.empty.memory_format aten.empty_strided
    aten.scalar_tensor aten.empty_permuted aten.linspace aten.eye aten.new_zeros aten.new_ones aten.new_full aten.new_empty
    aten._to_copy aten.to.dtype aten.fill.Scalar aten.fill.Tensor aten.tril_indices aten.triu_indices
    aten.sym_size.int aten.sym_numel aten.sym_stride.int aten.sym_storage_offset
""", "creation")

register_aten("aten.nonzero aten._local_scalar_dense", "data-dependent", host_sync=True)
register_aten("""
    aten.rand aten.randn aten.rand_like aten.randn_like aten.randint aten.randint.low
    aten.randint_like aten.bernoulli aten.bernoulli.p aten.multinomial aten.normal.Tensor_float
    aten.uniform aten.randperm aten.native_dropout
""", "random", random=True, pure=False)

# Not tagged core, but torch.export's default decompositions leave them in graphs (found by the OpInfo sweep).
register_aten("""
    aten.addmv aten.addbmm aten.copysign.Scalar aten.ldexp.Tensor aten.signbit aten.diagonal_scatter
    aten.as_strided_scatter aten.scatter.reduce aten.scatter.value_reduce aten._trilinear
    aten.grid_sampler_3d prims.convert_element_type
""", "misc")
register_aten("aten.masked_select", "data-dependent", host_sync=True)
register_aten("aten.randint_like.low_dtype", "random", random=True, pure=False)

# In-place forms, produced only by passes.reinplace for state writes: they mutate their first argument.
register_aten("aten.index_put_ aten.index_copy_ aten.copy_", "inplace", pure=False)
