"""The benchmark suite: a matrix of configurations (dispatch-heavy decoders to GPU-bound prefill,
encoders, vision backbones, speech, diffusion, a state-space model), each run by torch eager, a CUDA
graph of eager, torch.compile (default and reduce-overhead), AOTInductor (with and without a CUDA graph),
ExecuTorch with XNNPACK (CPU) and ostinato with and without replay, in one process (the AOT peers' files
made in fresh ones), so every claim is a ratio measured in one run.

Entry points: ``python bench/run_suite.py`` and ``ostinato bench`` (same options).
"""
from __future__ import annotations

import os

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
