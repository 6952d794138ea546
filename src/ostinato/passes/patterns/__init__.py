"""Pattern passes: each file raises one chain of core ATen ops to one fused ``ost.*`` op."""
from .rms_norm import fuse_rms_norm

__all__ = ["fuse_rms_norm"]
