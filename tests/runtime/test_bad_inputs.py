"""Bad input at the API: every wrong call raises InputError before anything runs (state untouched), its
message names the input, what was expected, what was given and the fix; and odd but valid inputs
(non-contiguous, expanded, zero-size) give eager's result, step by step and with replay."""
from __future__ import annotations

import random
import re

import pytest
import torch
from torch.export import Dim

import ostinato
from helpers import assert_same
from ostinato.errors import InputError, ReplayError


class Mlp(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 4)

    def forward(self, x):
        return self.lin(x).softmax(-1)


class Tokens(torch.nn.Module):
    """Two inputs sharing a dynamic size (seq), an int64 one and a float one, plus state."""

    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(16, 6)
        self.register_buffer("total", torch.zeros(6))

    def forward(self, ids, mask):
        h = self.emb(ids) * mask.unsqueeze(-1)
        self.total.add_(h.sum((0, 1)))
        return h.mean(1), self.total.clone()


class InPlace(torch.nn.Module):
    def forward(self, x, y):
        x.add_(y)
        return x * 2.0


class Prefix(torch.nn.Module):
    def forward(self, x, n: int):
        return x[:n] * 2.0


def _export(name: str):
    torch.manual_seed(0)
    if name == "mlp":
        m = Mlp().eval()
        return m, ostinato.export(m, (torch.randn(3, 8),), dynamic_shapes=({0: Dim("batch", min=1, max=32)},))
    if name == "tokens":
        seq = Dim("seq", min=2, max=24)
        m = Tokens()
        prog = ostinato.export(m, (torch.randint(0, 16, (2, 5)), torch.rand(2, 5)),
                               dynamic_shapes=({1: seq}, {1: seq}))
        return m, prog
    if name == "inplace":
        return InPlace(), ostinato.export(InPlace(), (torch.randn(4, 5), torch.randn(4, 5)))
    if name == "prefix":
        return Prefix(), ostinato.export(Prefix(), (torch.randn(8, 4), 3), dynamic_shapes=(None, Dim.DYNAMIC))
    raise KeyError(name)


MODELS = ["mlp", "tokens", "inplace", "prefix"]


@pytest.fixture(scope="module")
def programs():
    return {name: _export(name) for name in MODELS}


def good_args(name: str, rng: random.Random) -> tuple:
    if name == "mlp":
        return (torch.randn(rng.randint(1, 32), 8),)
    if name == "tokens":
        t = rng.randint(2, 24)
        return torch.randint(0, 16, (2, t)), torch.rand(2, t)
    if name == "inplace":
        return torch.randn(4, 5), torch.randn(4, 5)
    return torch.randn(8, 4), rng.randint(1, 8)


def _other_dtype(t: torch.Tensor, rng: random.Random) -> torch.Tensor:
    choices = [d for d in (torch.float16, torch.bfloat16, torch.float64, torch.float32, torch.int32,
                           torch.int64, torch.bool) if d != t.dtype]
    return t.to(rng.choice(choices))


def corrupt(name: str, args: tuple, rng: random.Random) -> tuple[tuple, int, str]:
    """A bad call made from a good one: (args, the input position the error must name, what's wrong)."""
    args = list(args)
    tensor_pos = [i for i, a in enumerate(args) if isinstance(a, torch.Tensor)]
    kinds = ["dtype", "device", "rank_up", "rank_down", "not_tensor"]
    if name == "mlp":
        kinds += ["above_max", "below_min", "static_dim"]
    if name == "tokens":
        kinds += ["above_max", "below_min", "mismatch"]
    if name == "inplace":
        kinds += ["static_dim", "expanded"]
    if name == "prefix":
        kinds += ["scalar_float", "scalar_range", "static_dim"]
    kind = rng.choice(kinds)
    pos = rng.choice(tensor_pos)
    x = args[pos]
    if kind == "dtype":
        args[pos] = _other_dtype(x, rng)
    elif kind == "device":
        args[pos] = torch.empty(x.shape, dtype=x.dtype, device="meta")
    elif kind == "rank_up":
        args[pos] = x.unsqueeze(rng.randint(0, x.dim()))
    elif kind == "rank_down":
        args[pos] = x.flatten()
    elif kind == "not_tensor":
        args[pos] = rng.choice([1.5, 3, [1.0, 2.0], x.numpy()])
    elif kind in ("above_max", "below_min"):
        dim = 0 if name == "mlp" else 1
        size = rng.randint(33 if name == "mlp" else 25, 64) if kind == "above_max" else (0 if name == "mlp"
                                                                                          else rng.randint(0, 1))
        shape = list(x.shape)
        shape[dim] = size
        for p in (tensor_pos if name == "tokens" else [pos]):   # shared symbol: resize both
            shape_p = list(args[p].shape)
            shape_p[dim] = size
            args[p] = torch.zeros(shape_p, dtype=args[p].dtype) if args[p].dtype == torch.int64 else \
                torch.rand(shape_p)
        pos = tensor_pos[0]
    elif kind == "static_dim":
        dim = 1 if name == "mlp" else rng.randint(0, x.dim() - 1)
        shape = list(x.shape)
        shape[dim] += rng.randint(1, 5)
        args[pos] = torch.randn(shape)
    elif kind == "mismatch":
        pos = 1
        args[1] = torch.rand(2, args[0].shape[1] + rng.randint(1, 3))
    elif kind == "expanded":
        pos = 0
        args[0] = torch.randn(1, 5).expand(4, 5)
    elif kind == "scalar_float":
        pos = 1
        args[1] = args[1] + 0.5
    elif kind == "scalar_range":
        pos = 1
        args[1] = rng.choice([-rng.randint(1, 8), rng.randint(9, 100)])
    return tuple(args), pos, kind


def check_message(e: InputError, prog, pos: int) -> None:
    msg = str(e)
    name = prog.inputs[pos].name
    assert msg.startswith(f"input {pos} ({name}): "), msg
    assert "; expected " in msg and ", got " in msg, msg
    fix = msg.split(", got ", 1)[1].split(". ", 1)
    assert len(fix) == 2 and len(fix[1]) > 10, f"no fix in: {msg}"


def _snapshot(session) -> dict:
    return {k: v.clone() for k, v in session.state.items()}


@pytest.mark.parametrize("replay", [False, True], ids=["step", "replay"])
def test_random_bad_inputs_raise_input_error_and_run_nothing(programs, replay):
    rng = random.Random(17 + replay)
    exes = {name: ostinato.compile(prog, device="cpu", replay=replay) for name, (_, prog) in programs.items()}
    seen = set()
    for case in range(240):
        name = rng.choice(MODELS)
        exe, (model, prog) = exes[name], programs[name]
        exe(*good_args(name, rng))     # a capture exists (replay) and state is not initial
        bad, pos, kind = corrupt(name, good_args(name, rng), rng)
        before = _snapshot(exe.session)
        copies = [a.clone() if isinstance(a, torch.Tensor) and a.device.type == "cpu" else a for a in bad]
        with pytest.raises(InputError) as info:
            exe(*bad)
        check_message(info.value, prog, pos)
        seen.add(kind)
        for k, v in before.items():
            assert torch.equal(exe.session.state[k], v), f"case {case} ({name}, {kind}): state {k} was written"
        for a, c in zip(bad, copies):
            if isinstance(c, torch.Tensor) and c.device.type == "cpu" and not (a.dim() and a.stride(0) == 0):
                assert torch.equal(a, c), f"case {case} ({name}, {kind}): an input was written"
    assert len(seen) >= 12, seen
    # Refused calls left every executable usable: a good call still equals eager.
    for name, (model, prog) in programs.items():
        fresh = ostinato.compile(prog, device="cpu", replay=replay)
        eager_model = _export(name)[0]
        for _ in range(3):
            args = good_args(name, rng)
            mine = [a.clone() if isinstance(a, torch.Tensor) else a for a in args]
            assert_same(fresh(*mine), eager_model(*args))


def test_structure_errors_name_the_inputs(programs):
    exe = ostinato.compile(programs["tokens"][1], device="cpu")
    ids, mask = good_args("tokens", random.Random(0))
    for args, kwargs in [((ids,), {}), ((ids, mask, mask), {}), ((ids,), {"mask": mask})]:
        with pytest.raises(InputError, match=r"expected 2 input\(s\).*Pass the inputs as at export \(ids, mask\)"):
            exe(*args, **kwargs)


def test_scalar_bound_to_a_tensor_size_must_agree():
    """torch.export gives an int input and a tensor size that were equal in the example one symbol (it
    duck-sizes): the program is only right while they stay equal, so a call where they differ is refused
    (it used to run with the tensor's size and return a wrong result). Different examples: two symbols."""
    class Take(torch.nn.Module):
        def forward(self, x, n: int):
            return x[:, :n] + x.shape[1]

    dims = ({1: Dim("t", min=2, max=16)}, Dim.DYNAMIC)
    exe = ostinato.compile(ostinato.export(Take(), (torch.randn(2, 6), 6), dynamic_shapes=dims))
    x = torch.randn(2, 9)
    assert_same(exe(x, 9), Take()(x, 9))
    with pytest.raises(InputError, match=r"input 1 \(n\): 4 but s\d+ = 9 from input 0 dim 1; expected an int "
                                         r"equal to s\d+, got int 4\. These sizes must be equal"):
        exe(x, 4)
    exe = ostinato.compile(ostinato.export(Take(), (torch.randn(2, 6), 3), dynamic_shapes=dims))
    rng = random.Random(2)
    for _ in range(5):
        x, n = torch.randn(2, rng.randint(2, 16)), rng.randint(1, 6)
        assert_same(exe(x, n), Take()(x, n))
    with pytest.raises(InputError, match=r"input 1 \(n\): -3 is outside the range"):
        exe(x, -3)


# -- odd but valid inputs: eager's result ---------------------------------------------------------

def _layouts(x: torch.Tensor, rng: random.Random) -> list[torch.Tensor]:
    """The same values as x in other memory layouts."""
    out = [x.t().contiguous().t() if x.dim() == 2 else x.transpose(0, -1).contiguous().transpose(0, -1)]
    big = torch.empty([d * 2 for d in x.shape], dtype=x.dtype)
    view = big[tuple(slice(None, None, 2) for _ in x.shape)]
    view.copy_(x)
    out.append(view)                                            # strided
    off = torch.empty(x.numel() + 7, dtype=x.dtype)[7:].view(x.shape)
    off.copy_(x)
    out.append(off)                                             # storage offset
    if x.dim() >= 1 and x.shape[0] > 0:
        row = x[:1]
        out.append(row.expand(x.shape))                          # stride 0 (values differ from x)
    return out


@pytest.mark.parametrize("replay", [False, True], ids=["step", "replay"])
def test_non_contiguous_expanded_and_offset_inputs_equal_eager(programs, replay):
    rng = random.Random(3)
    for name in ("mlp", "tokens", "prefix"):
        model, prog = programs[name]
        exe = ostinato.compile(prog, device="cpu", replay=replay)
        eager_model = _export(name)[0]
        for _ in range(4):
            args = good_args(name, rng)
            for pos, a in enumerate(args):
                if not isinstance(a, torch.Tensor):
                    continue
                for alt in _layouts(a, rng):
                    call = list(args)
                    call[pos] = alt
                    assert_same(exe(*call), eager_model(*[c.clone() if isinstance(c, torch.Tensor) else c
                                                          for c in call]),
                                msg=f"{name} input {pos} strides {alt.stride()}:")


@pytest.mark.parametrize("replay", [False, True], ids=["step", "replay"])
def test_mutated_non_contiguous_input_receives_the_write(programs, replay):
    _, prog = programs["inplace"]
    exe = ostinato.compile(prog, device="cpu", replay=replay)
    rng = random.Random(5)
    for _ in range(4):
        x, y = good_args("inplace", rng)
        for alt in _layouts(x, rng)[:3]:          # not the expanded one: it cannot be written
            mine, theirs = alt.clone(), x.clone()
            mine.copy_(x)
            mine = alt.copy_(x)
            out = exe(mine, y)
            ref = InPlace()(theirs, y)
            assert_same(out, ref)
            assert torch.equal(mine, theirs), "the caller's (strided) tensor must hold the in-place write"


def test_expanded_mutated_input_is_refused_like_eager():
    _, prog = _export("inplace")
    exe = ostinato.compile(prog)
    x, y = torch.randn(1, 5).expand(4, 5), torch.randn(4, 5)
    with pytest.raises(RuntimeError):       # eager refuses too
        InPlace()(x, y)
    with pytest.raises(InputError, match=r"input 0 \(x\): written in place by the model, but its elements share "
                                         r"memory.*strides \[0, 1\]\. Pass x\.clone\(\)"):
        exe(x, y)


class Reduce(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 3)

    def forward(self, x, y):
        h = torch.cat([self.lin(x), y], 0)
        return h.relu().sum(0), h * 2.0, self.lin(x).softmax(-1)


@pytest.mark.parametrize("replay", [False, True], ids=["step", "replay"])
def test_zero_size_dims_equal_eager(replay):
    torch.manual_seed(1)
    model = Reduce().eval()
    # Static zero-size input.
    prog = ostinato.export(model, (torch.randn(0, 4), torch.randn(3, 3)))
    exe = ostinato.compile(prog, replay=replay)
    for _ in range(2):
        x, y = torch.randn(0, 4), torch.randn(3, 3)
        assert_same(exe(x, y), model(x, y))
    # A dynamic size whose range includes 0, called at 0 and at other sizes in random order.
    prog = ostinato.export(model, (torch.randn(5, 4), torch.randn(3, 3)),
                           dynamic_shapes=({0: Dim("n", min=0, max=16)}, None))
    exe = ostinato.compile(prog, replay=replay)
    rng = random.Random(0)
    for n in [0, 5, 0, *rng.sample(range(17), 6), 0]:
        x, y = torch.randn(n, 4), torch.randn(3, 3)
        assert_same(exe(x, y), model(x, y), msg=f"n={n}:")
    # A range starting at 1 refuses 0, naming it.
    prog = ostinato.export(model, (torch.randn(5, 4), torch.randn(3, 3)),
                           dynamic_shapes=({0: Dim("n", min=1, max=16)}, None))
    with pytest.raises(InputError, match=r"input 0 \(x\): dim 0 = 0 is outside the range of s\d+;.*\(n\) in \[1, 16\]"):
        ostinato.compile(prog, replay=replay)(torch.randn(0, 4), torch.randn(3, 3))


# -- replay: reallocated inputs, another shape ------------------------------------------------------

def test_graph_replay_after_random_reallocations():
    model, prog = _export("mlp")
    exe = ostinato.compile(prog)
    rng = random.Random(11)
    for case in range(40):
        x = torch.randn(rng.randint(1, 32), 8)
        g = ostinato.Graph()
        with ostinato.graph(g):
            exe(x)
        how = rng.choice(["resize", "set", "restride", "dtype", "inplace", "view_of_static", "shape"])
        if how == "resize":
            x.resize_(x.shape[0] + rng.randint(1, 40), 8)
        elif how == "set":
            x.set_(torch.randn(x.shape))
        elif how == "restride":
            x.set_(torch.empty(x.numel() * 2)[::2].clone().untyped_storage(), 0, (x.shape[0], 8), (1, x.shape[0]))
        elif how == "dtype":
            x.data = x.data.view(torch.int32)
        if how in ("resize", "set", "restride", "dtype"):
            with pytest.raises(ReplayError, match=r"input 0 \(x\): its storage was reallocated since capture.*"
                                                  r"update it in place with x\.copy_\(new\)"):
                g.replay()
        elif how == "shape":
            other = torch.randn(x.shape[0] % 32 + 1, 8)
            with pytest.raises(ReplayError, match=r"input 0 \(x\): captured f32\[.*given f32\[.*capture another "
                                                  r"graph for this one, or compile\(\.\.\., replay=True\)"):
                g.replay(other)
        elif how == "inplace":
            x.mul_(rng.uniform(-3, 3))
            assert_same(g.replay(), model(x))
        else:   # new values given as a view of the static input itself
            new = x.flip(0)
            ref = model(new.clone())
            assert_same(g.replay(new), ref)


class SizeBranch(torch.nn.Module):
    """A branch on a size: torch.export takes one side and records the condition (a guard)."""

    def forward(self, x):
        return x * 2 if x.shape[1] % 4 == 0 else x * 3


@pytest.mark.parametrize("replay", [False, True], ids=["step", "replay"])
def test_sizes_breaking_an_export_guard_are_refused(tmp_path, replay):
    """Sizes on the other side of the export's branch raise InputError naming the condition (they ran the
    exported side and answered wrong); sizes keeping it match eager; the guard survives save and load.
    The input dim is 2*k, so k is solved from it: an odd size is refused too."""
    model = SizeBranch().eval()
    spec = ({1: 2 * Dim("k", min=1, max=32)},)
    prog = ostinato.export(model, (torch.randn(2, 8),), dynamic_shapes=spec, cache=False)
    assert [g[0] for g in prog.info["guards"]] == ["=="] and "Mod(" in prog.info["guards"][0][1], prog.info
    prog.save(tmp_path / "m.ost")
    for p in (prog, ostinato.load(tmp_path / "m.ost")):
        exe = ostinato.compile(p, cache=False, replay=replay)
        for width in (4, 12, 8, 16, 4):
            x = torch.randn(2, width)
            assert_same(exe(x), model(x))
        for width, why in ((6, "which the model's export assumed"), (10, "which the model's export assumed"),
                           (7, "is not 2"), (66, "is not 2")):
            with pytest.raises(InputError, match=why):
                exe(torch.randn(2, width))


def test_malformed_guards_are_refused():
    """A damaged file's guard list is an error at compile, not a check quietly dropped."""
    from ostinato.errors import ProgramFormatError
    prog = ostinato.export(SizeBranch().eval(), (torch.randn(2, 8),),
                           dynamic_shapes=({1: 2 * Dim("k", min=1, max=32)},), cache=False)
    for bad in ([["~", "s6", "0"]], [["==", "__import__('os')", "0"]], [["==", "t9", "1"]], ["=="]):
        prog.info["guards"] = bad
        with pytest.raises(ProgramFormatError, match="guards are malformed"):
            ostinato.compile(prog, cache=False)


class PaddedHalvings(torch.nn.Module):
    """Swin's window padding and patch merging, repeated: the size conditions grow past what a program
    file may hold."""

    def forward(self, x):
        for _ in range(3):
            x = torch.nn.functional.pad(x, (0, (4 - x.shape[1] % 4) % 4))
            x = x.view(x.shape[0], -1, 2).sum(-1)
        return x


def test_conditions_too_long_to_record_leave_a_program_that_compiles_and_loads(tmp_path):
    model = PaddedHalvings().eval()
    prog = ostinato.export(model, (torch.randn(2, 128),), dynamic_shapes=({1: 2 * Dim("k", min=1, max=64)},),
                           cache=False)
    from ostinato.ir.types import parse_expr
    for _, lhs, rhs in prog.info.get("guards", []):
        parse_expr(lhs), parse_expr(rhs)
    exe = ostinato.compile(prog, cache=False)
    x = torch.randn(2, 128)
    assert_same(exe(x), model(x))

