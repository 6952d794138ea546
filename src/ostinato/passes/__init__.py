"""Graph rewrites between export and lowering; one pass per file, run in order by ``manager``."""
from .canonicalize import canonicalize
from .cse import eliminate_common_subexpressions
from .dce import eliminate_dead_code
from .manager import DEFAULT_PIPELINE, GENERIC_PIPELINE, PassRecord, default_pipeline, run_passes
from .reinplace import reinplace_state_writes

__all__ = ["DEFAULT_PIPELINE", "GENERIC_PIPELINE", "PassRecord", "default_pipeline", "run_passes", "canonicalize", "eliminate_common_subexpressions",
           "eliminate_dead_code", "reinplace_state_writes"]
