"""Programs and (with the program file) their serialized form."""
from .program import InputSlot, Program

__all__ = ["InputSlot", "Program"]
