"""MLX handlers of elementwise ATen ops (unary, binary, comparisons, activations)."""
from __future__ import annotations

import math

import mlx.core as mx

from .ops import as_float, handles, is_float

# -- unary ------------------------------------------------------------------------------------------
_FLOAT_UNARY = {
    "aten.exp": mx.exp, "aten.expm1": mx.expm1, "aten.log": mx.log, "aten.log2": mx.log2,
    "aten.log10": mx.log10, "aten.log1p": mx.log1p, "aten.sqrt": mx.sqrt, "aten.rsqrt": mx.rsqrt,
    "aten.reciprocal": mx.reciprocal, "aten.sin": mx.sin, "aten.cos": mx.cos, "aten.tan": mx.tan,
    "aten.asin": mx.arcsin, "aten.acos": mx.arccos, "aten.atan": mx.arctan, "aten.sinh": mx.sinh,
    "aten.cosh": mx.cosh, "aten.tanh": mx.tanh, "aten.asinh": mx.arcsinh, "aten.acosh": mx.arccosh,
    "aten.atanh": mx.arctanh, "aten.sigmoid": mx.sigmoid, "aten.erf": mx.erf, "aten.erfinv": mx.erfinv,
}


def _float_unary(fn):
    return lambda x: fn(as_float(x))


for _name, _fn in _FLOAT_UNARY.items():
    handles(_name)(_float_unary(_fn))


@handles("aten.exp2")
def exp2(x):
    return mx.power(2.0, as_float(x))


@handles("aten.erfc")
def erfc(x):
    return 1 - mx.erf(as_float(x))


@handles("aten.abs")
def abs_(x):
    return mx.abs(x) if x.dtype != mx.bool_ else x


@handles("aten.neg")
def neg(x):
    return mx.negative(x)


@handles("aten.sign", "aten.sgn")
def sign(x):
    return mx.sign(x) if x.dtype != mx.bool_ else x


@handles("aten.floor")
def floor(x):
    return mx.floor(x) if is_float(x) else x


@handles("aten.ceil")
def ceil(x):
    return mx.ceil(x) if is_float(x) else x


@handles("aten.round")
def round_(x):
    return mx.round(x) if is_float(x) else x


@handles("aten.round.decimals")
def round_decimals(x, decimals=0):
    # x * 10**d in half precision loses the digit being rounded: scale in float32, as torch does
    h = x.astype(mx.float32) if x.dtype in (mx.float16, mx.bfloat16) else x
    return mx.round(h, decimals)


@handles("aten.trunc")
def trunc(x):
    return mx.trunc(x) if is_float(x) else x


@handles("aten.frac")
def frac(x):
    return x - mx.trunc(x)


@handles("aten.relu")
def relu(x):
    return mx.maximum(x, 0) if x.dtype != mx.bool_ else x


def gelu_of(x, approximate: str = "none"):
    if approximate == "tanh":
        return 0.5 * x * (1 + mx.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x * x * x)))
    return x * (1 + mx.erf(x * (1 / math.sqrt(2)))) * 0.5


@handles("aten.gelu")
def gelu(x, approximate="none"):
    return gelu_of(x, approximate)


def silu_of(x):
    return x * mx.sigmoid(x)


@handles("aten.silu")
def silu(x):
    return silu_of(x)


@handles("aten.hardtanh")
def hardtanh(x, min_val=-1.0, max_val=1.0):
    return mx.clip(x, min_val, max_val)


@handles("aten.leaky_relu")
def leaky_relu(x, negative_slope=0.01):
    return mx.where(x > 0, x, x * negative_slope)


@handles("aten.elu")
def elu(x, alpha=1.0, scale=1.0, input_scale=1.0):
    return mx.where(x > 0, x * scale, (mx.expm1(x * input_scale)) * (alpha * scale))


@handles("aten.softplus")
def softplus(x, beta=1.0, threshold=20.0):
    bx = x * beta
    return mx.where(bx > threshold, x, mx.log1p(mx.exp(bx)) / beta)


@handles("aten.hardsigmoid")
def hardsigmoid(x):
    return mx.clip(x / 6 + 0.5, 0, 1)


@handles("aten.hardswish")
def hardswish(x):
    return x * mx.clip(x + 3, 0, 6) / 6


@handles("aten.mish")
def mish(x):
    return x * mx.tanh(mx.logaddexp(x, mx.zeros_like(x)))


@handles("aten.logit")
def logit(x, eps=None):
    x = as_float(x)
    if eps is not None:
        x = mx.clip(x, eps, 1 - eps)
    return mx.log(x / (1 - x))


@handles("aten.isnan")
def isnan(x):
    return mx.isnan(x) if is_float(x) else mx.zeros(x.shape, mx.bool_)


@handles("aten.isinf")
def isinf(x):
    return mx.isinf(x) if is_float(x) else mx.zeros(x.shape, mx.bool_)


@handles("aten.isfinite")
def isfinite(x):
    return mx.isfinite(x) if is_float(x) else mx.ones(x.shape, mx.bool_)


@handles("aten.logical_not")
def logical_not(x):
    return mx.logical_not(x.astype(mx.bool_))


@handles("aten.bitwise_not")
def bitwise_not(x):
    return mx.logical_not(x) if x.dtype == mx.bool_ else mx.bitwise_invert(x)


@handles("aten.nan_to_num")
def nan_to_num(x, nan=0.0, posinf=None, neginf=None):
    return mx.nan_to_num(x, nan=0.0 if nan is None else nan, posinf=posinf, neginf=neginf)


@handles("aten.clamp", "aten.clamp.Tensor")
def clamp(x, min=None, max=None):
    if min is not None:
        x = mx.maximum(x, min)
    if max is not None:
        x = mx.minimum(x, max)
    return x


@handles("aten.signbit")
def signbit(x):
    if not is_float(x):
        return x < 0
    return (x < 0) | ((x == 0) & (mx.reciprocal(x) < 0))


# -- binary -----------------------------------------------------------------------------------------
@handles("aten.add.Tensor", "aten.add.Scalar")
def add(a, b, alpha=1):
    return a + (b if alpha == 1 else b * alpha)


@handles("aten.sub.Tensor", "aten.sub.Scalar")
def sub(a, b, alpha=1):
    return a - (b if alpha == 1 else b * alpha)


@handles("aten.rsub.Scalar")
def rsub(a, b, alpha=1):
    return b - (a if alpha == 1 else a * alpha)


@handles("aten.mul.Tensor", "aten.mul.Scalar")
def mul(a, b):
    if type(a) is mx.array and a.dtype == mx.bool_ and (type(b) is not mx.array or b.dtype == mx.bool_):
        return mx.logical_and(a, b)
    return a * b


@handles("aten.div.Tensor", "aten.div.Scalar")
def div(a, b):
    return mx.divide(as_float(a), b)


@handles("aten.div.Tensor_mode", "aten.div.Scalar_mode")
def div_mode(a, b, rounding_mode=None):
    if rounding_mode is None:
        return div(a, b)
    integral = not mx.issubdtype(mx.array(a).dtype if type(a) is not mx.array else a.dtype, mx.inexact) and \
        (type(b) is int or (type(b) is mx.array and not mx.issubdtype(b.dtype, mx.inexact)))
    if rounding_mode == "floor":
        return mx.floor_divide(a, b) if integral else mx.floor(mx.divide(a, b))
    q = mx.divide(as_float(a), b)
    return _int_trunc_div(a, b) if integral else mx.trunc(q)


def _int_trunc_div(a, b):
    """Integer division rounding toward zero, exactly (no float round trip)."""
    q = mx.floor_divide(a, b)
    r = a - q * b
    return mx.where((r != 0) & ((a < 0) != (b < 0)), q + 1, q)


@handles("aten.floor_divide")
def floor_divide(a, b):
    return mx.floor_divide(a, b)


@handles("aten.pow.Tensor_Tensor", "aten.pow.Tensor_Scalar")
def pow_(a, b):
    if isinstance(b, (int, float)) and not isinstance(b, bool):
        if b == 2:
            return a * a
        if b == 0.5 and is_float(a):
            return mx.sqrt(a)
    return mx.power(a, b)


@handles("aten.pow.Scalar")
def pow_scalar(a, b):
    return mx.power(a, as_float(b) if isinstance(a, float) else b)


@handles("aten.remainder.Tensor", "aten.remainder.Scalar")
def remainder(a, b):
    return mx.remainder(a, b)


@handles("aten.fmod.Tensor", "aten.fmod.Scalar")
def fmod(a, b):
    if type(a) is mx.array and not is_float(a) and (type(b) is int or not is_float(b)):
        return a - _int_trunc_div(a, b) * b
    return a - mx.trunc(mx.divide(a, b)) * b


@handles("aten.maximum")
def maximum(a, b):
    return mx.maximum(a, b)


@handles("aten.minimum")
def minimum(a, b):
    return mx.minimum(a, b)


@handles("aten.fmax")
def fmax(a, b):
    return mx.where(mx.isnan(a), b, mx.where(mx.isnan(b), a, mx.maximum(a, b))) if is_float(a) else mx.maximum(a, b)


@handles("aten.fmin")
def fmin(a, b):
    return mx.where(mx.isnan(a), b, mx.where(mx.isnan(b), a, mx.minimum(a, b))) if is_float(a) else mx.minimum(a, b)


@handles("aten.atan2")
def atan2(a, b):
    return mx.arctan2(as_float(a), as_float(b))


@handles("aten.hypot")
def hypot(a, b):
    return mx.sqrt(a * a + b * b)


@handles("aten.copysign.Tensor", "aten.copysign.Scalar")
def copysign(a, b):
    neg = signbit(b) if type(b) is mx.array else (math.copysign(1.0, b) < 0)
    return mx.where(neg, -mx.abs(as_float(a)), mx.abs(as_float(a)))


@handles("aten.ldexp.Tensor")
def ldexp(a, b):
    return as_float(a) * mx.power(2.0, as_float(b))


@handles("aten.lerp.Tensor", "aten.lerp.Scalar")
def lerp(a, b, w):
    # torch's form: exact at both ends (a + w * (b - a) below one half, b - (b - a) * (1 - w) above)
    d = b - a
    return mx.where(mx.abs(w) < 0.5, a + w * d, b - d * (1 - w)) if type(w) is mx.array else \
        (a + w * d if abs(w) < 0.5 else b - d * (1 - w))


@handles("aten.where.self", "aten.where.ScalarSelf", "aten.where.ScalarOther")
def where(cond, a, b):
    return mx.where(cond, a, b)


for _name, _fn in {"eq": mx.equal, "ne": mx.not_equal, "lt": mx.less, "le": mx.less_equal, "gt": mx.greater,
                   "ge": mx.greater_equal}.items():
    handles(f"aten.{_name}.Tensor", f"aten.{_name}.Scalar")(_fn)


def _bool(x):
    return x.astype(mx.bool_) if type(x) is mx.array else bool(x)


@handles("aten.logical_and")
def logical_and(a, b):
    return mx.logical_and(_bool(a), _bool(b))


@handles("aten.logical_or")
def logical_or(a, b):
    return mx.logical_or(_bool(a), _bool(b))


@handles("aten.logical_xor")
def logical_xor(a, b):
    return mx.not_equal(_bool(a), _bool(b))


handles("aten.bitwise_and.Tensor", "aten.bitwise_and.Scalar")(lambda a, b: mx.bitwise_and(a, b))
handles("aten.bitwise_or.Tensor", "aten.bitwise_or.Scalar")(lambda a, b: mx.bitwise_or(a, b))
handles("aten.bitwise_xor.Tensor", "aten.bitwise_xor.Scalar")(lambda a, b: mx.bitwise_xor(a, b))
handles("aten.bitwise_left_shift.Tensor")(lambda a, b: mx.left_shift(a, b))
handles("aten.bitwise_right_shift.Tensor")(lambda a, b: mx.right_shift(a, b))


@handles("aten.masked_fill.Scalar", "aten.masked_fill.Tensor")
def masked_fill(x, mask, value):
    if type(value) is mx.array:
        value = value.astype(x.dtype)
    return mx.where(mask, value, x)


@handles("aten.addcmul")
def addcmul(x, a, b, value=1):
    return x + (a * b if value == 1 else a * b * value)


@handles("aten.addcdiv")
def addcdiv(x, a, b, value=1):
    return x + (a / b if value == 1 else a / b * value)


@handles("aten.xlogy.Tensor")
def xlogy(x, y):
    x = as_float(x)
    return mx.where(mx.isnan(y), y, mx.where(x == 0, 0.0, x * mx.log(y)))


@handles("aten.sigmoid_backward")
def sigmoid_backward(grad, y):
    return grad * (1 - y) * y


@handles("aten.heaviside")
def heaviside(x, values):
    return mx.where(x == 0, values, (x > 0).astype(x.dtype))
