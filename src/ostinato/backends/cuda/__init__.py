"""The CUDA backend. ``CUDABackend`` is imported on first use, so that ``compile`` can start the library
warm-up (``warm``, which needs torch only) before it imports the backend's modules."""


def __getattr__(name: str):
    if name == "CUDABackend":
        from .backend import CUDABackend
        return CUDABackend
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["CUDABackend"]
