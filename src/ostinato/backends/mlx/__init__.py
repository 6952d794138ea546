"""The MLX backend (Apple GPUs through MLX; MLX's CPU build elsewhere)."""
from .backend import MLXBackend, runs_through_torch

__all__ = ["MLXBackend", "runs_through_torch"]
