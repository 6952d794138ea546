"""Programs and their file format (.ost): schema.fbs, writer, reader."""
from .program import InputSlot, Program, spec_structure


def load(path, verify: bool = True) -> Program:
    """Load a .ost file; weights are mmapped, not read.

    ``verify=True`` checks both segments' sha256 and re-derives every shape; ``verify=False`` skips
    both (the bounded decoding and the IR's structural checks always run).
    """
    from .reader import load as _load
    return _load(path, verify_checksums=verify)


__all__ = ["InputSlot", "Program", "load", "spec_structure"]
