"""The torch.compile backend: ``torch.compile(model, backend="ostinato")``.

Sits above replay in the import order (it uses export and compile); not part of ``ostinato``'s
public names. ``stats()`` says which graphs ostinato took and which ran eagerly, and why.
"""
from .backend import ostinato_backend, settings_from
from .stats import compiled_graphs, reset_stats, stats

__all__ = ["ostinato_backend", "settings_from", "stats", "reset_stats", "compiled_graphs"]


def _register() -> None:
    """Make ``backend="ostinato"`` resolve where the package is not installed (a checkout on PYTHONPATH):
    installed copies are found through the ``torch_dynamo_backends`` entry point, whose loading imports
    this module while torch registers the name itself, so registering is only done when torch has not
    listed the name yet (torch refuses a name registered twice)."""
    from torch._dynamo.backends import registry
    if "ostinato" not in getattr(registry, "_BACKENDS", {}):
        registry.register_backend(compiler_fn=ostinato_backend, name="ostinato")


_register()
