from collections import namedtuple

import pytest
import torch
from torch.export import Dim

import ostinato
from ostinato.errors import ExportError, OstinatoError, UnsupportedOpError
from helpers import assert_same, export_and_compare

Pair = namedtuple("Pair", "first second")


@torch.library.custom_op("ostinato_test::mystery", mutates_args=())
def mystery(x: torch.Tensor) -> torch.Tensor:
    return x * 3 + 1


@mystery.register_fake
def _(x):
    return torch.empty_like(x)


@torch.library.custom_op("ostinato_test::enigma", mutates_args=())
def enigma(x: torch.Tensor) -> torch.Tensor:
    return x - 1


@enigma.register_fake
def _(x):
    return torch.empty_like(x)


class UsesCustomOps(torch.nn.Module):
    def forward(self, x):
        y = torch.ops.ostinato_test.mystery(x)
        z = torch.ops.ostinato_test.enigma(y)
        return torch.ops.ostinato_test.mystery(z).relu()


def test_unsupported_ops_are_all_listed_with_source_lines_under_strict():
    with pytest.raises(UnsupportedOpError) as info:
        ostinato.export(UsesCustomOps(), (torch.randn(4),), strict=True)
    err = info.value
    names = {op for op, _ in err.ops}
    assert names == {"ostinato_test.mystery", "ostinato_test.enigma"}
    assert len(err.ops) == 3  # two call sites of mystery, one of enigma
    text = str(err)
    assert "test_export.py" in text and "torch.ops.ostinato_test.enigma(y)" in text
    assert "Fix:" in text and "strict=False" in text
    assert isinstance(err, OstinatoError)


def test_non_module_is_rejected():
    with pytest.raises(ExportError, match="takes a torch.nn.Module, got function"):
        ostinato.export(lambda x: x + 1, (torch.randn(2),))


def test_untraceable_model_gives_export_error_with_cause():
    class DataDependent(torch.nn.Module):
        def forward(self, x):
            if x.sum() > 0:
                return x * 2
            return x - 2

    with pytest.raises(ExportError, match="torch.export could not trace DataDependent") as info:
        ostinato.export(DataDependent(), (torch.randn(4),))
    assert info.value.__cause__ is not None
    assert "Fix:" in str(info.value)


def test_bad_dynamic_shapes_spec_gives_export_error():
    class M(torch.nn.Module):
        def forward(self, x):
            return x + 1

    with pytest.raises(ExportError):
        ostinato.export(M(), (torch.randn(4, 3),), dynamic_shapes=({5: Dim("d")},))


def test_outputs_keep_pytree_structure_and_constants():
    class M(torch.nn.Module):
        def forward(self, x, y):
            return {"sum": x + y, "pair": Pair(x * y, [x.shape[0], None]), "k": 7}

    x, y = torch.randn(3, 2), torch.randn(3, 2)
    prog, exe = export_and_compare(M(), (x, y), more_inputs=[(torch.randn(3, 2), torch.randn(3, 2))])
    out = exe(x, y)
    assert isinstance(out["pair"], Pair) and out["k"] == 7 and out["pair"].second == [3, None]


def test_kwargs_inputs():
    class M(torch.nn.Module):
        def forward(self, x, *, scale, bias=None):
            return x * scale + (0 if bias is None else bias)

    x, s, b = torch.randn(4), torch.randn(4), torch.randn(4)
    prog = ostinato.export(M(), (x,), {"scale": s, "bias": b})
    exe = ostinato.compile(prog)
    assert_same(exe(x, scale=s, bias=b), x * s + b)
    x2, s2, b2 = torch.randn(4), torch.randn(4), torch.randn(4)
    assert_same(exe(x2, scale=s2, bias=b2), x2 * s2 + b2)


def test_dynamic_dims_become_symbols_with_ranges_and_labels():
    class M(torch.nn.Module):
        def forward(self, x, y):
            return torch.cat([x, y], dim=0).softmax(-1)

    rows = Dim("rows", min=2, max=40)
    prog, exe = export_and_compare(
        M(), (torch.randn(5, 8), torch.randn(3, 8)), dynamic_shapes=({0: rows}, {0: Dim("other", max=10)}),
        more_inputs=[(torch.randn(17, 8), torch.randn(9, 8)), (torch.randn(2, 8), torch.randn(1, 8))])
    ranges = {r.label: (r.min, r.max) for r in prog.graph.symbols.values()}
    assert ranges["rows"] == (2, 40)
    assert ranges["other"][1] == 10
    out_meta = prog.graph.outputs[0].meta
    assert "+" in str(out_meta.shape[0])  # rows + other, symbolic


def test_user_input_mutation_is_applied_to_the_callers_tensor():
    class M(torch.nn.Module):
        def forward(self, x, y):
            x.add_(y)
            return x * 2

    x, y = torch.randn(6), torch.randn(6)
    prog = ostinato.export(M(), (x.clone(), y))
    exe = ostinato.compile(prog)
    mine, ref = x.clone(), x.clone()
    out = exe(mine, y)
    expected = M()(ref, y)
    assert_same(out, expected)
    assert_same(mine, ref)


def test_buffers_the_model_mutates_become_state():
    class Counter(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("total", torch.zeros(3))
            self.register_buffer("scale", torch.full((3,), 2.0))

        def forward(self, x):
            self.total.copy_(self.total + x)
            return self.total * self.scale

    prog = ostinato.export(Counter(), (torch.randn(3),))
    assert [v.name for v in prog.graph.state] == ["total"]
    assert "scale" in prog.weights and "total" not in prog.weights
    export_and_compare(Counter(), (torch.randn(3),), more_inputs=[(torch.randn(3),) for _ in range(4)])
