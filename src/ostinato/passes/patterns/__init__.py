"""Pattern passes: each file raises one chain of core ATen ops to one fused ``ost.*`` op."""
from .add_rms_norm import fuse_add_rms_norm
from .eager_attention import fuse_eager_attention
from .gated_mlp import fuse_gated_mlp
from .kv_update import fuse_kv_update
from .layer_norm import fuse_layer_norm
from .linear import fuse_linear
from .matmul_linear import rewrite_matmul_linears
from .moe import fuse_moe, fuse_moe_gathered
from .multi_linear import fuse_multi_linear
from .rms_norm import fuse_rms_norm
from .rope import fuse_rope
from .sdpa import fuse_sdpa

__all__ = ["fuse_add_rms_norm", "fuse_eager_attention", "fuse_gated_mlp", "fuse_kv_update", "fuse_layer_norm", "fuse_linear", "fuse_moe", "fuse_moe_gathered", "fuse_multi_linear", "fuse_rms_norm",
           "fuse_rope", "fuse_sdpa", "rewrite_matmul_linears"]
