"""State write-back (runtime.session.write_state): batched where it is safe, pair by pair where the order
of the copies matters, and the same values either way."""
import torch

import ostinato
from ostinato.runtime import session as session_mod
from ostinato.runtime.session import write_state


def _count_foreach(monkeypatch) -> list:
    calls = []
    real = torch._foreach_copy_

    def spy(targets, sources):
        calls.append(len(targets))
        return real(targets, sources)
    monkeypatch.setattr(session_mod.torch, "_foreach_copy_", spy)
    return calls


def test_same_shaped_writes_are_one_batched_copy(monkeypatch):
    calls = _count_foreach(monkeypatch)
    g = torch.Generator().manual_seed(3)
    targets = [torch.zeros((), dtype=torch.int64) for _ in range(5)] + [torch.zeros(4, 3) for _ in range(3)]
    news = [torch.randint(1, 1000, (), generator=g) for _ in range(5)] + [torch.randn(4, 3, generator=g) for _ in range(3)]
    done_in_place = torch.randn(2, generator=g)
    write_state(list(zip(targets, news)) + [(done_in_place, done_in_place)])
    assert sorted(calls) == [3, 5]      # one copy per (device, dtype) group, the in-place write skipped
    for t, n in zip(targets, news):
        assert torch.equal(t, n)


def test_writes_reading_another_target_keep_their_order(monkeypatch):
    calls = _count_foreach(monkeypatch)
    a, b = torch.arange(4.0), torch.arange(4.0) + 10
    # a takes b's view, then b takes a new value: as sequential copies do
    new_b = torch.full((4,), -1.0)
    write_state([(a, b[:]), (b, new_b)])
    assert calls == []
    assert torch.equal(a, torch.arange(4.0) + 10) and torch.equal(b, new_b)


def test_mismatched_pairs_still_copy(monkeypatch):
    calls = _count_foreach(monkeypatch)
    t1, t2 = torch.zeros(3), torch.zeros(2, 2, dtype=torch.float64)
    n1, n2 = torch.randn(1), torch.randn(2, 2, dtype=torch.float32)     # broadcast; a cast
    write_state([(t1, n1), (t2, n2)])
    assert calls == []
    assert torch.equal(t1, n1.expand(3)) and torch.equal(t2, n2.double())


class Counters(torch.nn.Module):
    """Several small counters and a buffer, written out of place every call (what transformers' static
    cache does with its per-layer cumulative_length)."""

    def __init__(self, n: int = 4):
        super().__init__()
        for i in range(n):
            self.register_buffer(f"count{i}", torch.zeros((), dtype=torch.int64))
        self.register_buffer("acc", torch.zeros(3))
        self.n = n

    def forward(self, x, step):
        for i in range(self.n):
            getattr(self, f"count{i}").copy_(step[0] + i)
        self.acc.copy_(self.acc * 0.5 + x.sum(0))
        return x * 2 + self.acc


def test_model_state_counters_match_eager(monkeypatch):
    calls = _count_foreach(monkeypatch)
    model = Counters()
    g = torch.Generator().manual_seed(0)
    x, step = torch.randn(2, 3, generator=g), torch.tensor([7])
    prog = ostinato.export(Counters(), (x, step))
    exe = ostinato.compile(prog, device="cpu")
    for k in range(3):
        x, step = torch.randn(2, 3, generator=g), torch.tensor([7 + k])
        want, got = model(x, step), exe(x, step)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
        for name, buf in model.named_buffers():
            torch.testing.assert_close(exe.session.state[name], buf, rtol=1e-5, atol=1e-5)
    assert calls and max(calls) >= 4    # the counters' write-backs were batched


def test_a_target_written_twice_keeps_the_last_value(monkeypatch):
    calls = _count_foreach(monkeypatch)
    t, u = torch.zeros(3), torch.zeros(3)
    n1, m1, n2 = torch.randn(3), torch.randn(3), torch.randn(3, dtype=torch.float64)
    write_state([(t, n1), (u, m1), (t, n2)])
    assert calls == []          # the order decides: copied one by one
    assert torch.equal(t, n2.float()) and torch.equal(u, m1)


def test_targets_sharing_storage_are_copied_in_order(monkeypatch):
    calls = _count_foreach(monkeypatch)
    base = torch.zeros(4)
    a, b = base[:3], base[1:]       # overlapping views of one buffer
    na, nb = torch.full((3,), 1.0), torch.full((3,), 2.0)
    write_state([(a, na), (b, nb)])
    assert calls == []
    assert base.tolist() == [1.0, 2.0, 2.0, 2.0]
