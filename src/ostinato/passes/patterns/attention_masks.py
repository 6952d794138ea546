"""The masks an attention written out eagerly is given (passes/patterns/eager_attention.py): a boolean
mask as the attention reads it, or biases and a boolean mask summed in q's dtype; each made once for every
attention reading the same, right after the latest producer of what it is made from."""
from __future__ import annotations

import math

import torch

from ...ir import Graph, Node, TensorMeta, Value
from .sdpa import _additive, _int


def _broadcast(a: tuple, b: tuple) -> tuple:
    """The shape two broadcasting shapes give (neither makes the other larger but where it is 1)."""
    n = max(len(a), len(b))
    a, b = (1,) * (n - len(a)) + tuple(a), (1,) * (n - len(b)) + tuple(b)
    return tuple(y if _int(x) == 1 else x for x, y in zip(a, b))



class _Masks:
    """The attention masks made from boolean ones and biases, each once for all the attention nodes reading
    it, to go right after the latest producer of what it is made from (``None``: first, for inputs)."""

    def __init__(self, g: Graph):
        self.g, self.made, self.after = g, {}, {}
        self.order = {id(n): i for i, n in enumerate(g.nodes)}

    def _put(self, made: list[Node], sources: list[Value]) -> None:
        producers = [v.producer for v in sources if v.producer is not None]
        last = max(producers, key=lambda n: self.order.get(id(n), -1), default=None)
        self.after.setdefault(None if last is None else id(last), []).extend(made)

    def value(self, spec: tuple[Value, bool, float], dtype: torch.dtype, at: Node, additive: bool = False) -> Value:
        """The mask for a boolean mask's (source, hides, fill): the source itself or its negation for -inf
        (the attention reads it as visibility), ``where`` of 0 and the fill otherwise or when ``additive``."""
        m, hides, fill = spec
        if fill == -math.inf and not hides and not additive:
            return m
        boolean = fill == -math.inf and not additive
        key = (m.id, hides, fill, None if boolean else dtype)
        if key not in self.made:
            if boolean:
                made = [Node("aten.bitwise_not", (m,), {}, f"{at.name}_shown", at.source)]
                made[0].outputs = [self.g.new_value(made[0].name, TensorMeta(torch.bool, tuple(m.meta.shape)), "temp",
                                                    made[0])]
            else:
                made = _additive(self.g, m, dtype, at, fill, hides)[1]
            self._put(made, [m])
            self.made[key] = made[-1].outputs[0]
        return self.made[key]

    def combine(self, terms: list[tuple[Value, list | None]], spec, dtype: torch.dtype, at: Node) -> Value | None:
        """The attention's mask for the biases ``terms`` (each with the [B, H, ...] view of a flattened one, or
        None) and the boolean mask ``spec``: their sum in ``dtype`` (q's, as every term is) when there are
        several, made once for every attention adding the same. Where all but one term hide keys (HF's
        causal mask: 0 or ``finfo.min``), the sum is exact on the visible keys."""
        if not terms:
            return None if spec is None else self.value(spec, dtype, at)
        if spec is None and len(terms) == 1 and terms[0][1] is None:
            return terms[0][0]
        key = ("sum", dtype, *((m.id, None if s is None else tuple(map(str, s))) for m, s in terms),
               None if spec is None else (spec[0].id, spec[1], spec[2]))
        if key not in self.made:
            parts, made = [], []
            for i, (m, shape) in enumerate(terms):
                if shape is not None:
                    view = Node("aten.view", (m, shape), {}, f"{at.name}_bias{i}", at.source)
                    view.outputs = [self.g.new_value(view.name, TensorMeta(m.meta.dtype, tuple(shape)), "temp", view)]
                    made.append(view)
                    m = view.outputs[0]
                parts.append(m)
            self._put(made, [m for m, _ in terms])
            if spec is not None:
                parts.append(self.value(spec, dtype, at, additive=True))
            made, total = [], parts[0]
            for i, p in enumerate(parts[1:]):
                add = Node("aten.add.Tensor", (total, p), {}, f"{at.name}_mask_sum{i}", at.source)
                add.outputs = [self.g.new_value(add.name, TensorMeta(dtype, _broadcast(total.meta.shape, p.meta.shape)),
                                                "temp", add)]
                made.append(add)
                total = add.outputs[0]
            self._put(made, [m for m, _ in terms] + ([spec[0]] if spec is not None else []))
            self.made[key] = total
        return self.made[key]
