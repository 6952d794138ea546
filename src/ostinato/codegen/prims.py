"""The primitive operations of a fusion group's expression: each one with its Triton expression and
its torch implementation, so the generated kernel and the reference interpreter (reference.py) share
one definition.

Values are held in a compute type: fp16, bf16 and fp32 as fp32, fp64 as fp64, integers and bool as
themselves. A primitive whose result dtype is fp16 or bf16 rounds to it (``round_to``), as eager
torch rounds every op's result; the fused kernel then computes what the chain of ATen ops computed.
"""
from __future__ import annotations

import math

import torch

DTYPES = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16, "f64": torch.float64,
          "i64": torch.int64, "i32": torch.int32, "i16": torch.int16, "i8": torch.int8, "u8": torch.uint8,
          "bool": torch.bool}
DTYPE_CODES = {v: k for k, v in DTYPES.items()}
TRITON_TYPES = {"f32": "tl.float32", "f16": "tl.float16", "bf16": "tl.bfloat16", "f64": "tl.float64",
                "i64": "tl.int64", "i32": "tl.int32", "i16": "tl.int16", "i8": "tl.int8", "u8": "tl.uint8",
                "bool": "tl.int1"}
FLOATS = ("f32", "f16", "bf16", "f64")
HALF = ("f16", "bf16")


def compute_code(code: str) -> str:
    """The dtype a value of ``code`` is held in while a kernel computes."""
    return "f32" if code in HALF else code


def compute_dtype(code: str) -> torch.dtype:
    return DTYPES[compute_code(code)]


# Unary primitives: name -> (Triton expression of {0}, torch function). Float-only unless listed in INT_OK.
UNARY = {
    "neg": ("-{0}", torch.neg),
    "abs": ("tl.abs({0})", torch.abs),
    "exp": ("tl.exp({0})", torch.exp),
    "exp2": ("tl.exp2({0})", torch.exp2),
    "expm1": ("libdevice.expm1({0})", torch.expm1),
    "log": ("tl.log({0})", torch.log),
    "log2": ("tl.log2({0})", torch.log2),
    "log1p": ("libdevice.log1p({0})", torch.log1p),
    "sqrt": ("tl.sqrt_rn({0})", torch.sqrt),
    "rsqrt": ("tl.rsqrt({0})", torch.rsqrt),
    "recip": ("(1.0 / {0})", torch.reciprocal),
    "sin": ("tl.sin({0})", torch.sin),
    "cos": ("tl.cos({0})", torch.cos),
    "tan": ("libdevice.tan({0})", torch.tan),
    "tanh": ("libdevice.tanh({0})", torch.tanh),
    "sigmoid": ("(1.0 / (1.0 + tl.exp(-{0})))", torch.sigmoid),
    "erf": ("libdevice.erf({0})", torch.erf),
    "floor": ("tl.floor({0})", torch.floor),
    "ceil": ("tl.ceil({0})", torch.ceil),
    "trunc": ("libdevice.trunc({0})", torch.trunc),
    "round": ("libdevice.nearbyint({0})", torch.round),
    "sign": ("(({0} > 0).to({t}) - ({0} < 0).to({t}))", torch.sign),
    "not": ("({0} == 0)", torch.logical_not),
    "isnan": ("({0} != {0})", torch.isnan),
}
INT_OK_UNARY = {"neg", "abs", "sign", "not"}

# Binary primitives: name -> (Triton expression of {0}, {1}, torch function).
BINARY = {
    "add": ("({0} + {1})", torch.add),
    "sub": ("({0} - {1})", torch.sub),
    "mul": ("({0} * {1})", torch.mul),
    "div": ("({0} / {1})", torch.div),
    "floordiv": ("libdevice.floor({0} / {1})", lambda a, b: torch.div(a, b, rounding_mode="floor")),
    "truncdiv": ("libdevice.trunc({0} / {1})", lambda a, b: torch.div(a, b, rounding_mode="trunc")),
    "max": ("tl.maximum({0}, {1}, propagate_nan=tl.PropagateNan.ALL)", torch.maximum),
    "min": ("tl.minimum({0}, {1}, propagate_nan=tl.PropagateNan.ALL)", torch.minimum),
    "pow": ("libdevice.pow({0}, {1})", torch.pow),
    "atan2": ("libdevice.atan2({0}, {1})", torch.atan2),
    "eq": ("({0} == {1})", torch.eq),
    "ne": ("({0} != {1})", torch.ne),
    "lt": ("({0} < {1})", torch.lt),
    "le": ("({0} <= {1})", torch.le),
    "gt": ("({0} > {1})", torch.gt),
    "ge": ("({0} >= {1})", torch.ge),
    "and": ("({0} & {1})", torch.logical_and),
    "or": ("({0} | {1})", torch.logical_or),
    "xor": ("({0} ^ {1})", torch.logical_xor),
}
INT_OK_BINARY = {"add", "sub", "mul", "max", "min", "eq", "ne", "lt", "le", "gt", "ge", "and", "or", "xor"}
COMPARE = {"eq", "ne", "lt", "le", "gt", "ge"}
LOGICAL = {"and", "or", "xor", "not", "isnan"}

# Triton's interpreter (TRITON_INTERPRET=1, the CPU tests) runs no libdevice function: there these
# primitives are written with tl.* math (less precise near 0 for tanh, expm1 and log1p; pow for a
# positive base only). Kernels for a GPU always use the libdevice forms above.
INTERPRETED = {
    "tanh": "(2.0 * tl.sigmoid(2.0 * {0}) - 1.0)",
    "erf": "tl.erf({0})",
    "expm1": "(tl.exp({0}) - 1.0)",
    "log1p": "tl.log(1.0 + {0})",
    "tan": "(tl.sin({0}) / tl.cos({0}))",
    "trunc": "tl.where({0} < 0, tl.ceil({0}), tl.floor({0}))",
    "round": "tl.floor({0} + 0.5)",
    "pow": "tl.exp2({1} * tl.log2({0}))",
    "floordiv": "tl.floor({0} / {1})",
    "truncdiv": "tl.where({0} / {1} < 0, tl.ceil({0} / {1}), tl.floor({0} / {1}))",
}


def template(name: str, interpreted: bool) -> str:
    """The Triton expression of a unary or binary primitive."""
    if interpreted and name in INTERPRETED:
        return INTERPRETED[name]
    return (UNARY.get(name) or BINARY[name])[0]


# Reductions over the group's reduced dims: name -> (identity, Triton combine of the tile along axis 1,
# torch function over dims with keepdim).
REDUCTIONS = {
    "sum": ("0.0", "tl.sum({0}, axis=1)", lambda x, dims: x.sum(dims, keepdim=True)),
    "rmax": ("float('-inf')", "tl.max({0}, axis=1)", lambda x, dims: x.amax(dims, keepdim=True)),
    "rmin": ("float('inf')", "tl.min({0}, axis=1)", lambda x, dims: x.amin(dims, keepdim=True)),
}


def literal(value) -> str:
    """Python/Triton source of a constant (inf and nan through float())."""
    if isinstance(value, bool):
        return "True" if value else "False"
    if isinstance(value, int):
        return repr(value)
    value = float(value)
    if math.isnan(value):
        return "float('nan')"
    if math.isinf(value):
        return "float('inf')" if value > 0 else "float('-inf')"
    return repr(value)


def encode_const(value):
    """A constant in JSON form (inf and nan as strings)."""
    if isinstance(value, float) and not math.isfinite(value):
        return repr(value)
    return value


def decode_const(value):
    if isinstance(value, str):
        if value not in ("inf", "-inf", "nan"):
            raise ValueError(f"unknown constant {value!r}")
        return float(value)
    if not isinstance(value, (bool, int, float)):
        raise ValueError(f"unknown constant {value!r}")
    return value
