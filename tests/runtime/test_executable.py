import pytest
import torch
from torch.export import Dim

import ostinato
from ostinato.errors import BackendError, InputError, OstinatoError
from helpers import assert_same


class Affine(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 4)

    def forward(self, x, ids, flag: bool = True):
        return self.lin(x)[..., :2] + ids.unsqueeze(-1).float()


@pytest.fixture(scope="module")
def exe():
    torch.manual_seed(0)
    prog = ostinato.export(Affine(), (torch.randn(3, 5, 8), torch.randint(0, 9, (3, 5))),
                           dynamic_shapes=({1: Dim("seq", min=2, max=16)}, {1: Dim("seq", min=2, max=16)}))
    return ostinato.compile(prog, device="cpu")


def test_runs_dynamic_sizes(exe):
    for t in (2, 7, 16):
        x, ids = torch.randn(3, t, 8), torch.randint(0, 9, (3, t))
        out = exe(x, ids)
        assert out.shape == (3, t, 2)


@pytest.mark.parametrize("args, match", [
    ((torch.randn(3, 5, 8),), r"expected 2 input\(s\).*got 1"),
    ((torch.randn(3, 5, 8), torch.randint(0, 9, (3, 5)), torch.randn(1)), r"expected 2 input\(s\).*got 3"),
    ((torch.randn(3, 5, 8).double(), torch.randint(0, 9, (3, 5))), r"input 0 \(x\): wrong dtype; expected f32"),
    ((torch.randn(3, 5, 8), torch.randint(0, 9, (3, 5)).int()), r"input 1 \(ids\): wrong dtype.*got i32"),
    ((torch.randn(5, 8), torch.randint(0, 9, (3, 5))), r"input 0 \(x\): wrong rank"),
    ((torch.randn(3, 40, 8), torch.randint(0, 9, (3, 40))), r"dim 1 = 40 is outside the range.*seq.*\[2, 16\]"),
    ((torch.randn(3, 5, 8), torch.randint(0, 9, (3, 6))), r"input 1 \(ids\): dim 1 is 6 but s\d+ = 5"),
    ((torch.randn(4, 5, 8), torch.randint(0, 9, (3, 5))), r"input 0 \(x\): dim 0 is 4, not 3"),
    ((1.5, torch.randint(0, 9, (3, 5))), r"input 0 \(x\): not a tensor.*got float 1.5"),
])
def test_bad_inputs_name_the_input_and_expected_spec(exe, args, match):
    with pytest.raises(InputError, match=match):
        exe(*args)


def test_input_errors_are_ostinato_and_type_errors():
    assert issubclass(InputError, OstinatoError) and issubclass(InputError, TypeError)


def test_constant_inputs_are_checked():
    class Scale(torch.nn.Module):
        def forward(self, x, k: int):
            return x * k

    prog = ostinato.export(Scale(), (torch.randn(3), 4))
    exe = ostinato.compile(prog)
    x = torch.randn(3)
    assert_same(exe(x, 4), x * 4)
    with pytest.raises(InputError, match="baked in at export"):
        exe(x, 5)


def test_unknown_device_is_a_backend_error():
    prog = ostinato.export(Affine(), (torch.randn(3, 5, 8), torch.randint(0, 9, (3, 5))))
    with pytest.raises(BackendError, match="no ostinato backend for device type 'xpu'"):
        ostinato.compile(prog, device="xpu")
    with pytest.raises(BackendError, match="not a device name"):
        ostinato.compile(prog, device="gpu0")


class Accumulate(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("acc", torch.zeros(4, 4))
        self.register_buffer("steps", torch.zeros((), dtype=torch.int64))

    def forward(self, x):
        self.acc.mul_(0.5).add_(x)
        self.steps.add_(1)
        return self.acc.sum(0), self.steps.clone()


def test_state_evolves_like_eager_and_sessions_are_independent():
    eager = Accumulate()
    exe = ostinato.compile(ostinato.export(Accumulate(), (torch.randn(4, 4),)))
    other = exe.new_session()
    xs = [torch.randn(4, 4) for _ in range(6)]
    for x in xs:
        assert_same(exe(x), eager(x))
    assert int(exe.session.state["steps"]) == 6
    assert int(other.state["steps"]) == 0
    fresh = Accumulate()
    assert_same(other(xs[0]), fresh(xs[0]))
    other.reset()
    assert int(other.state["steps"]) == 0 and float(other.state["acc"].abs().sum()) == 0.0
    # Initial values in the program are untouched by runs.
    assert float(exe.program.state_init["acc"].abs().sum()) == 0.0


def test_weights_are_shared_not_copied():
    model = Affine()
    prog = ostinato.export(model, (torch.randn(3, 5, 8), torch.randint(0, 9, (3, 5))))
    exe = ostinato.compile(prog)
    w = prog.weights["lin.weight"]
    assert w.data_ptr() == model.lin.weight.data_ptr()
    slot = next(v.slot for v in prog.graph.constants if v.name == "lin.weight")
    assert exe._template[slot].data_ptr() == w.data_ptr()


def test_non_contiguous_inputs_give_eager_results():
    class Flat(torch.nn.Module):
        def forward(self, x):
            return x.view(x.shape[0], -1) * 2  # view relies on the contiguous example layout

    prog = ostinato.export(Flat(), (torch.randn(4, 3, 5),))
    exe = ostinato.compile(prog)
    x = torch.randn(5, 3, 4).permute(2, 1, 0)
    assert not x.is_contiguous()
    assert_same(exe(x), x.reshape(4, -1) * 2)
