import random

import pytest
import sympy
import torch

import ostinato
from ostinato.errors import GraphError, OstinatoError
from ostinato.ir import Graph, SymbolRange, SymDim, TensorMeta, verify


def small_graph(n_extra: int = 0):
    """x[s0,8] @ w[8,8] + b, with a state buffer written by the sum."""
    g = Graph()
    g.symbols["s0"] = SymbolRange("s0", 1, 32)
    s0 = SymDim("s0")
    w = g.new_value("w", TensorMeta(torch.float32, (8, 8)), "constant")
    x = g.new_value("x", TensorMeta(torch.float32, (s0, 8)), "input")
    st = g.new_value("acc", TensorMeta(torch.float32, (8,)), "state")
    mm = g.add_node("aten.mm", (x, w), {}, [TensorMeta(torch.float32, (s0, 8))], "mm").outputs[0]
    red = g.add_node("aten.sum.dim_IntList", (mm, [0]), {}, [TensorMeta(torch.float32, (8,))], "red").outputs[0]
    new = g.add_node("aten.add.Tensor", (st, red), {}, [TensorMeta(torch.float32, (8,))], "acc_new").outputs[0]
    cur = mm
    for i in range(n_extra):
        cur = g.add_node("aten.relu", (cur,), {}, [TensorMeta(torch.float32, (s0, 8))], f"r{i}").outputs[0]
    g.outputs = [cur, 3]
    g.mutations = [(st, new)]
    return g, (w, x, st, mm, red, new, cur)


def test_valid_graph_passes_with_shape_check():
    g, _ = small_graph(3)
    verify(g, check_shapes=True, hints={"s0": 5})


def test_slot_order_is_constants_inputs_outputs_state_temps():
    g, (w, x, st, mm, red, new, cur) = small_graph(2)
    n = g.assign_slots()
    assert n == 3 + 3 + 2
    assert (w.slot, x.slot, cur.slot, st.slot) == (0, 1, 2, 3)
    temps = [v.slot for v in (mm, red, new)]
    assert sorted(temps) == temps and min(temps) > st.slot


def test_use_before_definition_is_rejected():
    g, (w, x, st, mm, red, new, cur) = small_graph()
    g.nodes[0], g.nodes[1] = g.nodes[1], g.nodes[0]
    with pytest.raises(GraphError, match=r"node red .*reads %mm before it is defined"):
        verify(g)


def test_unknown_op_is_rejected():
    g, _ = small_graph()
    g.nodes[0].op = "aten.does_not_exist"
    with pytest.raises(GraphError, match="unknown op 'aten.does_not_exist'"):
        verify(g)


def test_undeclared_symbol_is_rejected():
    g, _ = small_graph()
    del g.symbols["s0"]
    with pytest.raises(GraphError, match=r"undeclared size symbol"):
        verify(g)


def test_mutation_must_keep_dtype_and_shape():
    g, (w, x, st, mm, red, new, cur) = small_graph()
    g.mutations = [(st, mm)]
    with pytest.raises(GraphError, match="changes its dtype or shape"):
        verify(g)


def test_mutation_of_a_constant_is_rejected():
    g, (w, x, st, mm, red, new, cur) = small_graph()
    g.mutations = [(w, mm)]
    with pytest.raises(GraphError, match="is a constant"):
        verify(g)


def test_wrong_recorded_shape_is_caught_by_shape_check():
    g, (w, x, st, mm, red, new, cur) = small_graph()
    red.meta = TensorMeta(torch.float32, (7,))
    g.mutations = []
    with pytest.raises(GraphError, match=r"node red .*recorded as f32\[7\]"):
        verify(g, check_shapes=True, hints={"s0": 4})


def test_wrong_recorded_dtype_is_caught_by_shape_check():
    g, (w, x, st, mm, red, new, cur) = small_graph()
    mm.meta = TensorMeta(torch.float16, mm.meta.shape)
    with pytest.raises(GraphError, match=r"node mm .*gives torch.float32"):
        verify(g, check_shapes=True, hints={"s0": 4})


def test_graph_errors_are_ostinato_errors():
    assert issubclass(GraphError, OstinatoError)


@pytest.mark.parametrize("seed", range(5))
def test_symdim_evaluates_like_python(seed):
    rnd = random.Random(seed)
    a, b = sympy.Symbol("s0", integer=True), sympy.Symbol("s1", integer=True)
    for _ in range(20):
        k, m = rnd.randint(1, 9), rnd.randint(0, 9)
        va, vb = rnd.randint(1, 100), rnd.randint(1, 100)
        d = SymDim(k * a + m * b + 1)
        assert d.evaluate({"s0": va, "s1": vb}) == k * va + m * vb + 1
        assert set(d.symbols) == ({"s0", "s1"} if m else {"s0"})
    assert SymDim("s0").is_symbol and not SymDim(2 * a).is_symbol
    assert SymDim("2*s0 + 1").evaluate({"s0": 7}) == 15


def test_printer_shows_one_node_a_line_with_shapes():
    class M(torch.nn.Module):
        def forward(self, x):
            y = torch.relu(x) * 2
            return y.sum(-1)

    prog = ostinato.export(M(), (torch.randn(3, 4),))
    text = str(prog)
    body = [line for line in text.splitlines() if " = aten." in line]
    assert len(body) == prog.num_nodes == 3
    assert "f32[3,4] = aten.relu(%x)" in text
    assert "f32[3] = aten.sum.dim_IntList" in text
    assert "test_graph.py" in text  # source line of each node
