"""Programs and their file format (.ost): schema.fbs, writer, reader."""
from .program import InputSlot, Program, spec_structure


def load(path, verify: bool | str = True) -> Program:
    """Load a .ost file; weights are mmapped, not read.

    ``verify=True`` checks both segments' sha256 (the weights' once per unchanged file on this
    machine: a load that checked them records the file's device, inode, size and modification and
    status-change times in the local cache tiers (kind ``data-verified``), and a later load of the file
    with that identity hashes only the FlatBuffer; any write to the file changes it) and re-derives every shape (on fake tensors, which
    costs torch._dynamo's import, about a second, in a fresh process), once per file content: a
    program that passed is recorded in ostinato's cache (kind ``shapes-verified``, keyed by the
    FlatBuffer's sha256, ostinato's and torch's versions), and a later load of the same bytes only
    checks the sha256; ``save`` runs the same check on the file it wrote and records it too. ``verify="checksums"`` checks the sha256 only (the fast path for a file this
    fleet wrote); ``verify=False`` skips both. The bounded decoding and the IR's structural checks
    always run.
    """
    from ..ir.bulk import paused_gc
    from .reader import load as _load
    if verify not in (True, False, "checksums"):
        raise ValueError(f"verify must be True, False or 'checksums', not {verify!r}")
    with paused_gc():     # a full collection over every object in the process (ir/bulk.py)
        return _load(path, verify_checksums=bool(verify), check_shapes=verify is True)


__all__ = ["InputSlot", "Program", "load", "spec_structure"]
