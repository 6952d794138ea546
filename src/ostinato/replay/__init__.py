"""Capture and replay: a Plan frozen on static buffers (a tape on the CPU, a CUDA graph on CUDA)."""
from .capture import Captured
from .compile import compile
from .graph import Graph, graph
from .runner import ReplayRunner, bucket_ladders

__all__ = ["Captured", "Graph", "graph", "compile", "ReplayRunner", "bucket_ladders"]
