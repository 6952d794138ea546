"""torch.export → ostinato IR."""
from .export import KEEP_WHOLE, decomposition_table, export

__all__ = ["KEEP_WHOLE", "decomposition_table", "export"]
