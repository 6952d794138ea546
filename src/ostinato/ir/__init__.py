"""ostinato's intermediate representation."""
from .graph import Graph, Node, Value, iter_values, map_values
from .ops import OpDef, get_op, register_op, registered_ops
from .types import DTYPE_NAMES, ScalarMeta, SymbolRange, SymDim, TensorMeta, dtype_name
from .verify import verify

__all__ = ["Graph", "Node", "Value", "iter_values", "map_values", "OpDef", "get_op", "register_op",
           "registered_ops", "DTYPE_NAMES", "ScalarMeta", "SymbolRange", "SymDim", "TensorMeta",
           "dtype_name", "verify"]
