import copy
import logging

import pytest
import torch

import ostinato
from ostinato.errors import GraphError
from ostinato.ir import Graph
from ostinato.passes import DEFAULT_PIPELINE, reinplace_state_writes, run_passes
from examples.tiny_decoder import TinyDecoder, decode_inputs
from helpers import assert_decode_matches
from pass_harness import f32, op


def test_reinplace_is_the_last_default_pass():
    assert DEFAULT_PIPELINE[-1] == ("reinplace", reinplace_state_writes)
    assert [n for n, _ in DEFAULT_PIPELINE] == ["canonicalize", "cse", "dce", "matmul_linear", "rms_norm", "layer_norm",
                                                 "add_rms_norm", "rope",
                                                 "kv_update", "eager_attention", "sdpa", "multi_linear", "gated_mlp", "moe", "linear", "fold_norms",
                                                 "small_matvec",
                                                 "canonicalize_after_fusion", "sink_permutes",
                                                 "sink_unit_views", "dce_after_fusion",
                                                 "reinplace"]


def _chain(n: int) -> Graph:
    g = Graph()
    v = g.new_value("x", f32(3), "input")
    for _ in range(n):
        v = op(g, "aten.neg", (v,), f32(3))
    g.outputs = [v]
    return g


def _drop_first(g: Graph) -> Graph:
    g.nodes = g.nodes[1:]
    return g


def test_report_counts_nodes_after_each_pass_and_logs_it(caplog, monkeypatch):
    monkeypatch.delenv("OSTINATO_LOG_PASSES", raising=False)
    trim = lambda g: (setattr(g, "nodes", g.nodes[:-2]), g)[1]  # noqa: E731
    with caplog.at_level(logging.INFO, logger="ostinato"):
        g, report = run_passes(_chain(5), [("trim", trim), ("noop", lambda g: g), ("trim2", trim)])
    assert [(r.name, r.nodes) for r in report] == [("trim", 3), ("noop", 3), ("trim2", 1)]
    assert all(r.seconds >= 0 for r in report) and len(g.nodes) == 1
    lines = [r for r in caplog.records if r.name == "ostinato"]
    assert [r.levelno for r in lines] == [logging.INFO] * 3
    assert "trim2: 1 nodes" in lines[-1].getMessage()


def test_env_var_logs_at_warning(caplog, monkeypatch):
    monkeypatch.setenv("OSTINATO_LOG_PASSES", "1")
    with caplog.at_level(logging.WARNING, logger="ostinato"):
        run_passes(_chain(2), [("noop", lambda g: g)])
    assert [r.levelno for r in caplog.records if r.name == "ostinato"] == [logging.WARNING]


def test_verify_each_names_the_pass_that_broke_the_graph():
    with pytest.raises(GraphError, match="after pass drop_first"):
        run_passes(_chain(3), [("noop", lambda g: g), ("drop_first", _drop_first)], verify_each=True)


def test_tiny_decoder_through_the_default_pipeline():
    torch.manual_seed(0)
    model = TinyDecoder(dim=32, layers=4, heads=2, kv_heads=1, vocab=64, max_seq=16).eval()
    ref = copy.deepcopy(model)
    prog = ostinato.export(model, decode_inputs(0, vocab=64), passes=[])
    exported = prog.num_nodes
    _, report = run_passes(prog.graph, verify_each=True, hints=prog.hints)
    counts = [exported] + [r.nodes for r in report]
    # The decoder is already minimal (mask built once, no no-op views): the generic passes (and matmul_linear: the decoder uses nn.Linear) keep all
    # 206 nodes. Then per pattern: rms_norm 6 nodes → 1 for each of the 9 norms; add_rms_norm takes
    # the residual add into each of the 8 norms that read one (all but the first); rope 6 → 1 for Q
    # and K of each layer; kv_update 1 → 1 (index_put → ost.kv_update); eager_attention finds no
    # written-out attention (the decoder calls SDPA); sdpa absorbs the two
    # repeat_interleaves of each layer; multi_linear makes q, k, v one op and gate, up another (3 nodes
    # fewer per layer); gated_mlp silu and mul → 1 per layer; moe finds no mixture of experts; fold_norms folds no norm (one
    # row: the matmul groups take them); the second DCE drops the mask (arange,
    # unsqueeze, le), now computed inside ost.sdpa; small_matvec finds no matvec, the second canonicalize
    # no no-op, sink_permutes and sink_unit_views nothing to move; reinplace changes no count.
    assert counts == [206, 206, 206, 206, 206, 161, 161, 153, 113, 113, 113, 105, 93, 89, 89, 89, 89, 89, 89, 89, 89, 86, 86], counts
    ops = prog.op_counts()
    assert ops["ost.kv_update_"] == 8 and not {"ost.kv_update", "aten.index_put", "aten.index_put_"} & set(ops)
    exe = ostinato.compile(prog)
    assert_decode_matches(exe, ref, 4)
