"""Executables, plans of launches, sessions and input checking."""
from .executable import Executable, compile
from .session import Session

__all__ = ["Executable", "Session", "compile"]
