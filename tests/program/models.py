"""Small models whose programs the file tests save and load."""
import torch
from torch import nn
from torch.export import Dim

from examples.tiny_decoder import TinyDecoder

ALL_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int8, torch.int16,
              torch.int32, torch.int64, torch.uint8, torch.bool)


class AllDtypes(nn.Module):
    """One constant buffer per dtype the IR supports; forward uses each one."""

    def __init__(self):
        super().__init__()
        for i, dt in enumerate(ALL_DTYPES):
            if dt.is_floating_point:
                t = torch.randn(3, 4).to(dt)
            elif dt == torch.bool:
                t = torch.rand(3, 4) > 0.5
            else:
                t = torch.randint(0, 100, (3, 4)).to(dt)
            self.register_buffer(f"b{i}", t)

    def forward(self, x):
        return {f"o{i}": getattr(self, f"b{i}").to(torch.float32) * x for i in range(len(ALL_DTYPES))}


class Tied(nn.Module):
    """Embedding and output projection share one weight."""

    def __init__(self, vocab=512, dim=256):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.head = nn.Linear(dim, vocab, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, ids):
        return self.head(self.embed(ids).relu())


class WithConstants(nn.Module):
    def forward(self, x, k: int, mode: str):
        return (x * k).softmax(-1), [x.shape[0], None], mode


def tiny_decoder_program(seed=0):
    import ostinato
    torch.manual_seed(seed)
    m = TinyDecoder(dim=32, layers=2, heads=2, kv_heads=1, vocab=64, max_seq=16).eval()
    T = Dim("T", min=1, max=8)
    prog = ostinato.export(m, (torch.randint(0, 64, (1, 3)), torch.arange(3)), dynamic_shapes=({1: T}, {0: T}))
    return m, prog
