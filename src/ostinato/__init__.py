"""ostinato: export a PyTorch model once, compile it once, replay it with no per-op overhead."""
__version__ = "0.1.0"

from . import errors  # noqa: E402
from .program import Program, load  # noqa: E402
from .replay import Graph, compile, graph  # noqa: E402
from .runtime import Executable, Session  # noqa: E402

__all__ = ["__version__", "errors", "export", "compile", "load", "Program", "Executable", "Session", "Graph",
           "graph"]


def __getattr__(name: str):
    # ``ostinato.export`` imports torch.export and the decompositions (~0.2 s, more on some builds), which a
    # process that only loads and runs a program never needs: imported on first use.
    if name == "export":
        from .frontend import export
        globals()["export"] = export
        return export
    if name == "llm":   # causal LMs (transformers optional): imported on first use too
        import importlib
        return importlib.import_module(".llm", __name__)
    raise AttributeError(f"module 'ostinato' has no attribute {name!r}")
