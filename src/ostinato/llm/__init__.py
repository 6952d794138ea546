"""Causal language models: ``export_causal_lm`` (a transformers model to one Program with ``prefill``
and ``decode`` entry points over a static KV cache) and generation over it (``generate``, ``stream``,
also ``exe.generate``). transformers is needed for the export only, and imported then."""
from .export import TESTED_FAMILIES, export_causal_lm
from .generate import generate, sample, stream

__all__ = ["TESTED_FAMILIES", "export_causal_lm", "generate", "sample", "stream"]
