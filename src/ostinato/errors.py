"""Every exception a user of ostinato can see.

Each error says what went wrong, where (op, input, source line) and what to do about it.
"""
from __future__ import annotations


class OstinatoError(Exception):
    """Base class of every error ostinato raises on purpose."""


class ExportError(OstinatoError):
    """torch.export could not trace the model."""


class UnsupportedOpError(ExportError):
    """The exported graph uses ops ostinato has no implementation for.

    ``ops`` lists ``(op_name, source_line)`` pairs, one per distinct op and call site.
    """

    def __init__(self, ops: list[tuple[str, str]], hint: str = ""):
        self.ops = list(ops)
        lines = [f"  {op}  at {where}" for op, where in self.ops]
        names = sorted({op for op, _ in self.ops})
        msg = (
            f"{len(names)} unsupported op(s) in the exported graph: {', '.join(names)}\n"
            + "\n".join(lines)
        )
        msg += "\n" + (hint or (
            "Fix: rewrite those lines with supported ops, or register a decomposition for the op "
            "(torch.library / torch._decomp) so torch.export lowers it to core ATen ops."))
        super().__init__(msg)


class MissingOpError(OstinatoError, LookupError):
    """A program names an op this process cannot run: a fallback op whose torch.library registration
    was not imported, or an op of another ostinato version (the message names the op and the fix)."""


class GraphError(OstinatoError):
    """The IR graph is malformed (the verifier names the node and the rule it breaks)."""


class InputError(OstinatoError, TypeError):
    """Inputs given to an Executable do not match the exported input spec."""


class BackendError(OstinatoError):
    """A backend could not be found or could not lower or run a node."""


class ProgramFormatError(OstinatoError):
    """A program file is malformed, damaged or from an incompatible version."""


class CacheError(OstinatoError, ValueError):
    """A cache bundle or entry a user handed in is not usable (the reason says why)."""


class CaptureError(OstinatoError):
    """A Plan cannot be captured for replay (the message names the op and why)."""


class ReplayError(OstinatoError):
    """A replay was asked for with inputs or buffers that differ from what was captured."""


def first_line(e: BaseException) -> str:
    """The first line of an exception's message (its type's name when it has none): what a one-line
    error that wraps it quotes."""
    lines = str(e).strip().splitlines()
    return lines[0] if lines else type(e).__name__
