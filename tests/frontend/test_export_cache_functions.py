"""The export cache tells modules apart by the functions they hold: two lambdas of one module, two
closures of one factory, one function with other defaults. Each must export its own graph (a key by
name alone gave one op's graph to another: the op table's one-op modules on the GPU)."""
from __future__ import annotations

import torch

import ostinato


class Holder(torch.nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, x):
        return self.fn(x)


def _scaled(k):
    return lambda x: x * k


def _offset(x, b=1.0):
    return x + b


def _offset_by(b):
    return lambda x, b=b: _offset(x, b)


def test_functions_held_by_a_module_key_the_export_cache():
    g = torch.Generator().manual_seed(7)
    x = torch.randn(4, 5, generator=g)
    cases = [lambda x: torch.relu(x), lambda x: torch.tanh(x), _scaled(2.0), _scaled(-3.0), _offset,
             _offset_by(2.5), _offset_by(-1.5)]
    for fn in cases:
        model = Holder(fn)
        for _ in range(2):       # the second export of each may come from the cache, never another's
            out = ostinato.compile(ostinato.export(model, (x,)))(x)
            torch.testing.assert_close(out, fn(x), rtol=0, atol=0)


def test_a_model_defined_without_a_source_file_exports_uncached():
    """Classes from exec'd code (a notebook cell, stdin, python -c) have no file whose content could key
    them: export must work, and two such classes of one name with different code must not share a graph."""
    x = torch.randn(3, 4, generator=torch.Generator().manual_seed(2))
    outs = []
    for body in ("return x.sin()", "return x.cos() * 2"):
        ns: dict = {"torch": torch}
        exec(f"class Cell(torch.nn.Module):\n    def forward(self, x):\n        {body}\n", ns)
        model = ns["Cell"]()
        out = ostinato.compile(ostinato.export(model, (x,)))(x)
        torch.testing.assert_close(out, model(x), rtol=0, atol=0)
        outs.append(out)
    assert not torch.equal(outs[0], outs[1])
