"""CUDA backend: ATen ops through torch's CUDA kernels, fused ops through Triton kernels (ops.py;
their references where a kernel is missing or Triton is not installed). Plans run step by step or
replay as CUDA graphs."""
from __future__ import annotations

import torch

from ... import codegen
from ...codegen.attention import attention_fusion_enabled
from ...codegen.conv import conv_bias_fusion_enabled
from ...codegen.linear import dot_key, linear_fusion_enabled, lone_gemv_enabled, tiled_linear_enabled
from ...codegen.schedule import strided_copies_enabled
from ...errors import BackendError
from ..base import Launch, fused_launches
from ..cpu.backend import CPUBackend
from . import warm
from .layout import ConvLayouts, conv_layout_mode
from .library_ops import LIBRARY_OPS
from .ops import triton_kernels


class CUDABackend(ConvLayouts, CPUBackend):
    name = "cuda"

    def __init__(self, device: torch.device | None = None):
        if not torch.cuda.is_available():
            raise BackendError("device 'cuda' asked for, but torch sees no CUDA device here "
                               f"(torch {torch.__version__}); use device='cpu'")
        dev = torch.device("cuda") if device is None else device
        super().__init__(torch.device("cuda", torch.cuda.current_device() if dev.index is None else dev.index))

    def lower_graph(self, graph) -> list[Launch]:
        """Nodes the scheduler groups (ostinato.codegen) become one ``ost.fused`` launch each, running a
        generated Triton kernel; the rest lower one by one. Off without Triton, with
        OSTINATO_CUDA_REFERENCE=1 or OSTINATO_FUSION=0. fp16/bf16 convolutions run channels-last
        (layout.py)."""
        if not self._fuses():
            return self.with_layouts(graph, lambda: super(CUDABackend, self).lower_graph(graph))
        return self.with_layouts(graph, lambda: fused_launches(self, graph, self.kernel("ost.fused")))

    def plan_key_parts(self) -> dict[str, str]:
        conv = {"conv": conv_layout_mode()}
        if not self._fuses():
            return {"fusion": "off", **conv}
        return {"fusion": codegen.codegen_digest()[:16] + ("" if linear_fusion_enabled() else "-nolinear")
                + ("" if lone_gemv_enabled() else "-nolonegemv")
                + dot_key()
                + ("-tiled" if tiled_linear_enabled() else "")
                + ("" if attention_fusion_enabled() else "-noattention")
                + ("" if conv_bias_fusion_enabled() else "-noconvbias")
                + ("" if strided_copies_enabled() else "-nocopies"), **conv}

    @staticmethod
    def _fuses() -> bool:
        return codegen.fusion_enabled() and "ost.fused" in triton_kernels()

    def kernel(self, op: str):
        return triton_kernels().get(op) or LIBRARY_OPS.get(op) or super().kernel(op)

    def synchronize(self) -> None:
        torch.cuda.synchronize(self.device)

    def upload_bytes(self, src: torch.Tensor) -> torch.Tensor:
        from .upload import upload
        return upload(src, self.device)

    def warm_libraries(self, graph):
        return warm.start(graph, self.device)

    def kernel_stats(self) -> dict[str, float]:
        """Binaries of Triton kernels in this process: compiled (in workers or in-process), read from a
        cache tier, the seconds their compiles took (summed over workers: the serial equivalent), the op
        calls that ran their reference while a compile was in flight, and the compiles in flight now."""
        from .compile_workers import in_flight
        from .runtime import KernelLibrary
        c = KernelLibrary.counts
        return {"kernels_compiled": c["compiled"], "kernels_from_cache": c["cache"],
                "kernel_compile_seconds": c["seconds"], "kernel_calls_deferred": c["deferred"],
                "kernel_compiles_in_flight": in_flight()}
