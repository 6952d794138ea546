"""Programs and their file format (.ost): schema.fbs, writer, reader."""
from .program import InputSlot, Program, spec_structure


def load(path, verify: bool = True) -> Program:
    """Load a .ost file. Weights are mmapped, not read; ``verify=False`` skips the sha256 checks."""
    from .reader import load as _load
    return _load(path, verify_checksums=verify)


__all__ = ["InputSlot", "Program", "load", "spec_structure"]
