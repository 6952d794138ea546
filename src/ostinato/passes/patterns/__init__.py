"""Pattern passes: each file raises one chain of core ATen ops to one fused ``ost.*`` op."""
from .gated_mlp import fuse_gated_mlp
from .rms_norm import fuse_rms_norm

__all__ = ["fuse_gated_mlp", "fuse_rms_norm"]
