"""The torch.compile backend: ``torch.compile(model, backend="ostinato")``.

Sits above replay in the import order (it uses export and compile); not part of ``ostinato``'s
public names. ``stats()`` says which graphs ostinato took and which ran eagerly, and why.
"""
from .backend import ostinato_backend, settings_from
from .stats import compiled_graphs, reset_stats, stats

__all__ = ["ostinato_backend", "settings_from", "stats", "reset_stats", "compiled_graphs"]
