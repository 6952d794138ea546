"""verify(check_shapes=True) and ``dim`` arguments: torch's shape functions do not check some of them
(softmax's, among others), so a damaged program with a dim far out of range passed verification and
failed at its first call with IndexError; the verifier now refuses it, naming the node."""
from __future__ import annotations

import random

import pytest
import torch

import ostinato
from ostinato.errors import GraphError
from ostinato.ir import verify


class Ops(torch.nn.Module):
    def forward(self, x):
        h = x.softmax(-1) + x.log_softmax(1)
        return h.sum(0), torch.cumsum(h, 1), h.unsqueeze(2), torch.cat([h, x], 0), h.transpose(0, 1)


@pytest.fixture(scope="module")
def prog():
    return ostinato.export(Ops(), (torch.randn(3, 5),))


def test_exported_dims_verify(prog):
    verify(prog.graph, check_shapes=True, hints=prog.hints)    # no valid program is refused
    for n in (n for n in prog.graph.nodes if n.op == "aten.unsqueeze"):
        assert n.args[1] in (2, -1)                             # a dim up to the rank, as unsqueeze takes


@pytest.mark.parametrize("op", ["aten._softmax", "aten._log_softmax", "aten.cumsum"])
def test_dim_far_out_of_range_is_refused(prog, op):
    rng = random.Random(op)
    node = next(n for n in prog.graph.nodes if n.op == op)
    saved = node.args
    try:
        for d in (2**32 - 1, -(2**32) + 1, 2**63 - 1, rng.randint(3, 2**40), -rng.randint(4, 2**40)):
            node.args = (saved[0], d, *saved[2:])
            with pytest.raises(GraphError, match=rf"dim {d} is out of range for the rank-2 input"):
                verify(prog.graph, check_shapes=True, hints=prog.hints)
    finally:
        node.args = saved
    verify(prog.graph, check_shapes=True, hints=prog.hints)
