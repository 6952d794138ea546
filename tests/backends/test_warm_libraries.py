"""CUDA's library warm-up (backends/cuda/warm.py): which libraries a program gets warmed (CPU); that
compile joins a backend's warm-up thread before it returns, also when lowering fails (CPU, a backend
with a thread of its own); and on the GPU that compile warms, leaves no thread running, gives eager's
results through step, capture and replay, and that the switch turns it off."""
from __future__ import annotations

import threading
import time

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import ostinato
from helpers import assert_same
from ostinato.backends.cpu.backend import CPUBackend
from ostinato.backends.cuda import warm
from ostinato.runtime.executable import Executable


class Attention(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(32, 32)

    def forward(self, q, k, v):
        return self.proj(F.scaled_dot_product_attention(q, k, v, is_causal=q.shape[-2] > 1).transpose(1, 2).flatten(-2))


class Conv(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)

    def forward(self, x):
        return self.conv(x).relu()


def _qkv(rows: int, dtype) -> tuple:
    g = torch.Generator().manual_seed(0)
    return tuple(torch.randn(1, 2, rows, 16, generator=g).to(dtype) for _ in range(3))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
def test_jobs_follow_the_programs_library_ops_and_dtypes(dtype):
    torch.manual_seed(0)
    linear = ostinato.export(nn.Sequential(nn.Linear(8, 8), nn.GELU()).to(dtype), (torch.randn(2, 8).to(dtype),))
    assert warm.jobs_for(linear.graph, 99) == [("gemm", dtype)]
    from ostinato.backends.cuda.kernels.common import SHORT_QUERIES
    prefill = ostinato.export(Attention().to(dtype), _qkv(SHORT_QUERIES + 1, dtype))
    assert warm.jobs_for(prefill.graph, 99) == [("gemm", dtype), ("attention", dtype)]
    # one query row, or a short prompt's few: the Triton attention kernel takes them, no cuDNN to warm
    for rows in (1, 4, SHORT_QUERIES):
        short = ostinato.export(Attention().to(dtype), _qkv(rows, dtype))
        assert warm.jobs_for(short.graph, 99) == [("gemm", dtype)], rows
    conv = ostinato.export(Conv().to(dtype), (torch.randn(1, 3, 8, 8).to(dtype),))
    assert warm.jobs_for(conv.graph, 99) == [("conv", dtype)]
    # nothing a library runs: nothing to warm
    plain = ostinato.export(nn.ReLU(), (torch.randn(4),))
    assert warm.jobs_for(plain.graph, 99) == []


class _SlowWarming(CPUBackend):
    """A CPU backend whose warm-up thread takes 0.2 s and records that it finished."""

    def __init__(self, fail: bool = False):
        super().__init__()
        self.fail, self.finished = fail, []

    def warm_libraries(self, graph):
        t = threading.Thread(target=lambda: (time.sleep(0.2), self.finished.append(True)), daemon=True)
        t.start()
        return t

    def lower_graph(self, graph):
        if self.fail:
            raise RuntimeError("lowering failed")
        return super().lower_graph(graph)


@pytest.mark.parametrize("fail", [False, True], ids=["compiled", "lowering-fails"])
def test_compile_joins_the_warm_up_before_it_returns(fail):
    prog = ostinato.export(nn.Linear(4, 4), (torch.randn(2, 4),))
    backend = _SlowWarming(fail)
    if fail:
        with pytest.raises(RuntimeError, match="lowering failed"):
            Executable(prog, backend, cache=False)
    else:
        Executable(prog, backend, cache=False)
    assert backend.finished == [True]


def _warm_threads() -> list:
    return [t for t in threading.enumerate() if t.name == "ostinato-warm-libraries" and t.is_alive()]


@pytest.mark.cuda
def test_compile_warms_and_leaves_no_thread(monkeypatch):
    monkeypatch.setenv("OSTINATO_WARM_LIBRARIES", "1")      # off by default (warm.py's note)
    torch.manual_seed(0)
    from ostinato.backends.cuda.kernels.common import SHORT_QUERIES
    model = Attention().to("cuda", torch.float16).eval()
    # more query rows than the Triton kernel takes: torch's SDPA, which the thread warms
    args = tuple(t.cuda() for t in _qkv(SHORT_QUERIES + 1, torch.float16))
    prog = ostinato.export(model, args)
    index = torch.cuda.current_device()
    monkeypatch.setattr(warm, "_started", set())        # as in a fresh process
    exe = ostinato.compile(prog, device="cuda", replay=True)
    assert {(index, "gemm", torch.float16), (index, "attention", torch.float16)} <= warm._started
    assert not _warm_threads()      # joined before compile returned
    with torch.no_grad():
        expected = model(*args)
    for _ in range(3):      # step by step, capture, replay
        assert_same(exe(*args), expected)
    monkeypatch.setattr(warm, "_started", set())
    monkeypatch.setenv("OSTINATO_WARM_LIBRARIES", "0")
    ostinato.compile(prog, device="cuda")
    assert not warm._started


def test_a_later_start_joins_the_warm_up_still_running(monkeypatch):
    """A warm-up started earlier (by load, for the current device) is handed to the next ``start`` for
    that device even with nothing left to warm, so compile joins it; once it is over, nothing is."""
    monkeypatch.setattr(warm, "_started", set())
    monkeypatch.setattr(warm, "_in_flight", {})
    monkeypatch.setattr(warm, "enabled", lambda: True)
    ran, release = [], threading.Event()
    monkeypatch.setattr(warm, "_run", lambda jobs, device: (release.wait(30), ran.append(jobs)))
    prog = ostinato.export(nn.Linear(4, 4), (torch.randn(2, 4),))
    device = torch.device("cuda", 99)
    first = warm.start(prog.graph, device)
    assert first is not None and len(first.threads) == 1
    again = warm.start(prog.graph, device)            # nothing new to warm: the running one
    assert again is not None and again.threads == first.threads and first.threads[0].is_alive()
    release.set()
    again.join()
    assert ran == [[("gemm", torch.float32)]]
    assert warm.start(prog.graph, device) is None


def test_load_hands_the_decoded_graph_to_its_hooks(tmp_path, monkeypatch):
    """load calls each of reader.DECODED_HOOKS with the program's graph, before the weights' hash: a file
    with a damaged data segment reaches the hooks and is still refused; a hook that raises does not stop
    the load."""
    from ostinato.program.format import ChecksumError
    from ostinato.program.reader import read_header
    from ostinato.program import reader
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU())
    path = str(tmp_path / "m.ost")
    ostinato.export(model, (torch.randn(2, 8),)).save(path)
    seen = []

    def broken(graph):
        raise RuntimeError("hook failed")
    monkeypatch.setattr(reader, "DECODED_HOOKS", [broken, lambda g: seen.append(g)])
    prog = ostinato.load(path)
    assert seen == [prog.graph]
    header, _ = read_header(path)
    data = bytearray(open(path, "rb").read())
    data[header.data_offset + int(torch.randint(0, header.data_size, ()).item())] ^= 0x40
    damaged = tmp_path / "damaged.ost"
    damaged.write_bytes(bytes(data))
    with pytest.raises(ChecksumError, match="data segment"):
        ostinato.load(damaged)
    assert len(seen) == 2 and seen[1] is not prog.graph


def test_a_process_without_cuda_loads_with_no_warm_up(tmp_path):
    """load's hook starts nothing where CUDA is not set up (a CPU process, or one that has not touched
    the GPU yet): no warm-up thread, and CUDA's backend modules are not even imported."""
    import subprocess
    import sys
    torch.manual_seed(0)
    path = str(tmp_path / "m.ost")
    ostinato.export(nn.Sequential(nn.Linear(8, 8), nn.GELU()), (torch.randn(2, 8),)).save(path)
    code = ("import sys, threading, torch, ostinato; ostinato.load(sys.argv[1]); "
            "print(torch.cuda.is_initialized(), 'ostinato.backends.cuda.warm' in sys.modules, "
            "any(t.name == 'ostinato-warm-libraries' for t in threading.enumerate()))")
    out = subprocess.run([sys.executable, "-c", code, path], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["False", "False", "False"]


def test_kinds_limit_what_is_warmed(monkeypatch):
    conv = ostinato.export(Conv(), (torch.randn(1, 3, 8, 8),))
    assert warm.jobs_for(conv.graph, 98) == [("conv", torch.float32)]
    monkeypatch.setattr(warm, "KINDS", ("gemm", "attention"))
    assert warm.jobs_for(conv.graph, 98) == []


def test_the_warm_up_is_off_by_default(monkeypatch):
    monkeypatch.delenv("OSTINATO_WARM_LIBRARIES", raising=False)
    assert not warm.enabled()
    monkeypatch.setenv("OSTINATO_WARM_LIBRARIES", "1")
    assert warm.enabled()
    monkeypatch.setenv("OSTINATO_WARM_LIBRARIES", "0")
    assert not warm.enabled()
