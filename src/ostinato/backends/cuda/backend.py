"""CUDA backend, first stage: every op through torch's CUDA kernels, fused ops through their
references (as on the CPU), so programs run and replay as CUDA graphs on NVIDIA GPUs. Triton kernels
for the fused ops and the op-level graph cache replace the references op by op (issue [cuda])."""
from __future__ import annotations

import torch

from ...errors import BackendError
from ..cpu.backend import CPUBackend


class CUDABackend(CPUBackend):
    name = "cuda"

    def __init__(self, device: torch.device | None = None):
        if not torch.cuda.is_available():
            raise BackendError("device 'cuda' asked for, but torch sees no CUDA device here "
                               f"(torch {torch.__version__}); use device='cpu'")
        dev = torch.device("cuda") if device is None else device
        super().__init__(torch.device("cuda", torch.cuda.current_device() if dev.index is None else dev.index))

    def synchronize(self) -> None:
        torch.cuda.synchronize(self.device)
