"""CPU backends that lower fusion groups as the CUDA backend does, running each group through its
torch reference (``ost.fused``) or through the generated Triton kernel in Triton's interpreter."""
from __future__ import annotations

import torch

from ostinato.backends.base import fused_launches
from ostinato.backends.cuda.layout import ConvLayouts
from ostinato.backends.cpu.backend import CPUBackend
from ostinato.codegen.reference import fused
from ostinato.ir import get_op
from ostinato.program import Program
from ostinato.runtime.executable import Executable


class ReferenceFusionBackend(CPUBackend):
    """Groups run their torch reference: checks the scheduler and the expansions, fast."""

    def lower_graph(self, graph):
        return fused_launches(self, graph, fused)


class InterpretedFusionBackend(CPUBackend):
    """Groups run their generated Triton kernel on CPU tensors (needs TRITON_INTERPRET=1), and so does
    the decode attention the code generator merges (ost.decode_attention_)."""

    def lower_graph(self, graph):
        from ostinato.backends.cuda.kernels.fused import run_fused
        return fused_launches(self, graph, run_fused)

    def kernel(self, op: str):
        if op == "ost.decode_attention_":
            from ostinato.backends.cuda.kernels.attention import decode_attention_
            return decode_attention_
        return super().kernel(op)


class InterpretedCUDALowering(ConvLayouts, InterpretedFusionBackend):
    """The interpreted backend lowering as CUDA does around its kernels: fp16/bf16 convolutions
    channels-last through library_ops.convolution (torch's CPU kernel runs them), outputs restored."""

    def lower_graph(self, graph):
        return self.with_layouts(graph, lambda: InterpretedFusionBackend.lower_graph(self, graph))

    def kernel(self, op: str):
        if op == "aten.convolution":
            from ostinato.backends.cuda.library_ops import convolution
            return convolution
        return super().kernel(op)


def fused_executable(prog: Program, backend) -> Executable:
    return Executable(prog, backend, cache=False)


def fused_ops(exe: Executable) -> dict[str, int]:
    counts: dict[str, int] = {}
    for launch in exe.launches:
        counts[launch.op] = counts.get(launch.op, 0) + 1
    return counts


def unfused_compute(exe: Executable) -> list[str]:
    """Elementwise, reduction and norm ATen ops left as launches of their own."""
    return [l.op for l in exe.launches if get_op(l.op) is not None
            and get_op(l.op).category in ("elementwise", "reduction", "norm")]


def decode_dtype(dtype: torch.dtype) -> float:
    return {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 2e-2}[dtype]


def hf_decode_matches(family: str, backend, steps: int, tol: float | None = None):
    """transformers' ``family`` decoder (tests/models/test_hf_decoders.py) exported with its static cache,
    run for ``steps`` decode steps through ``backend`` against eager; returns the program."""
    import copy

    from helpers import assert_same
    from models.test_hf_decoders import decode_inputs, make_wrapper

    import ostinato
    wrapper = make_wrapper(family)
    ref = copy.deepcopy(wrapper)
    gen = torch.Generator().manual_seed(1)
    prog = ostinato.export(wrapper, (), decode_inputs(0, gen), trace_strict=True)
    exe = fused_executable(prog, backend)
    for pos in range(steps):
        kwargs = decode_inputs(pos, gen)
        with torch.no_grad():
            expected = ref(**kwargs)
        assert_same(exe(**kwargs), expected, tol=tol, msg=f"{family} step {pos}:")
    return prog


# tiny configurations of batched_llama's families: (transformers config class, its own settings)
BATCHED_FAMILIES = {"llama": ("LlamaConfig", {"num_key_value_heads": 2}),
                    # LayerNorm with a weight and a shift, q/k/v biases, a quarter of each head roped
                    "stablelm": ("StableLmConfig", {"num_key_value_heads": 4, "use_qkv_bias": True,
                                                    "partial_rotary_factor": 0.25}),
                    # LayerNorm without weights, in fp32
                    "olmo": ("OlmoConfig", {"num_key_value_heads": 4}),
                    # biased output projections (a lagging residual stream), LayerNorms with shifts
                    "starcoder2": ("Starcoder2Config", {"num_key_value_heads": 2}),
                    # the same with [in, out] Conv1D weights and q/k/v split from one biased product
                    "gpt2": ("GPT2Config", {})}


def batched_llama(batch: int, dtype: torch.dtype, layers: int = 3, device: str = "cpu", steps: int = 1,
                  family: str = "llama"):
    """A tiny transformers Llama (hidden 128; or another of BATCHED_FAMILIES) in ``dtype`` on ``device``
    behind its static-cache export wrapper, and the inputs of ``steps`` decode steps of ``batch`` sequences
    (from a seeded generator). Every 1-d parameter random: norms' weights in [0.5, 1.5], biases (shifts) in
    [-0.5, 0.5]."""
    import transformers
    from transformers import AutoModelForCausalLM, GenerationConfig
    from transformers.integrations.executorch import TorchExportableModuleWithStaticCache
    torch.manual_seed(0)
    cls, own = BATCHED_FAMILIES[family]
    config = getattr(transformers, cls)(hidden_size=128, intermediate_size=256, num_hidden_layers=layers,
                                        num_attention_heads=4, vocab_size=256, max_position_embeddings=64,
                                        pad_token_id=0, bos_token_id=1, eos_token_id=2, **own)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype).eval()
        with torch.no_grad():   # from_config leaves the norms at 1
            for name, p in model.named_parameters():
                if p.dim() == 1:
                    p.uniform_(-0.5, 0.5) if name.endswith("bias") else p.uniform_(0.5, 1.5)
        model.generation_config = GenerationConfig(use_cache=True, cache_implementation="static")
        wrapper = TorchExportableModuleWithStaticCache(model, batch_size=batch, max_cache_len=16, device=device).eval()
    gen = torch.Generator().manual_seed(1)
    inputs = [{"input_ids": torch.randint(0, 256, (batch, 1), generator=gen).to(device),
               "cache_position": torch.tensor([pos], device=device)} for pos in range(steps)]
    return wrapper, inputs
