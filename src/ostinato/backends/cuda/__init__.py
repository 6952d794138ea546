from .backend import CUDABackend

__all__ = ["CUDABackend"]
