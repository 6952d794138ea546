"""The benchmark suite: a matrix of configurations (dispatch-heavy decoders to GPU-bound prefill), each
run by torch eager, a CUDA graph of eager, torch.compile (default and reduce-overhead) and ostinato
with and without replay, in one process, so every claim is a ratio measured in one run.

Entry points: ``python bench/run_suite.py`` and ``ostinato bench`` (same options).
"""
from __future__ import annotations

import os

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
