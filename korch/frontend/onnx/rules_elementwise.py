"""Fission rules for elementwise ONNX operators: arithmetic, activations, comparisons, casts."""

from __future__ import annotations

import math

from korch.errors import KorchError
from korch.frontend.lowering import Lowering, OnnxNode, fission
from korch.frontend.onnx.tensor_types import onnx_dtype
from korch.frontend.ops.elementwise import (
    acos_core,
    acosh_core,
    asin_core,
    asinh_core,
    atanh_core,
    clip_core,
    cosh_core,
    elu_core,
    gelu_core,
    hard_sigmoid_core,
    isnan_core,
    leaky_relu_core,
    mod_core,
    sinh_core,
    softplus_core,
    tan_core,
)
from korch.ir.prims import FLOAT_DTYPES, Prim

_BINARY = {
    "Add": Prim.ADD,
    "Sub": Prim.SUB,
    "Mul": Prim.MUL,
    "Div": Prim.DIV,
    "Equal": Prim.EQ,
    "Less": Prim.LT,
    "Greater": Prim.GT,
    "And": Prim.AND,
    "Or": Prim.OR,
    "Xor": Prim.XOR,
}
_UNARY = {
    "Neg": Prim.NEG,
    "Abs": Prim.ABS,
    "Exp": Prim.EXP,
    "Log": Prim.LOG,
    "Sqrt": Prim.SQRT,
    "Reciprocal": Prim.RECIPROCAL,
    "Erf": Prim.ERF,
    "Tanh": Prim.TANH,
    "Sigmoid": Prim.SIGMOID,
    "Floor": Prim.FLOOR,
    "Ceil": Prim.CEIL,
    "Round": Prim.ROUND,
    "Sin": Prim.SIN,
    "Cos": Prim.COS,
    "Atan": Prim.ATAN,
    "Sign": Prim.SIGN,
    "Not": Prim.NOT,
}


def _binary_rule(prim: Prim):
    def rule(ctx: Lowering, n: OnnxNode) -> list[str]:
        return [ctx.elementwise(prim, n.inputs[0], n.inputs[1])]

    return rule


def _unary_rule(prim: Prim):
    def rule(ctx: Lowering, n: OnnxNode) -> list[str]:
        return [ctx.unary(prim, n.inputs[0])]

    return rule


for _op, _prim in _BINARY.items():
    fission(_op, 1)(_binary_rule(_prim))
for _op, _prim in _UNARY.items():
    fission(_op, 1)(_unary_rule(_prim))


def _or_equal(strict: Prim):
    """a <= b as (a < b) or (a == b): NOT(a > b) would be true for NaN."""

    def rule(ctx: Lowering, n: OnnxNode) -> list[str]:
        a, b = n.inputs[0], n.inputs[1]
        return [ctx.elementwise(Prim.OR, ctx.elementwise(strict, a, b), ctx.elementwise(Prim.EQ, a, b))]

    return rule


fission("LessOrEqual", 12)(_or_equal(Prim.LT))
fission("GreaterOrEqual", 12)(_or_equal(Prim.GT))


@fission("Pow", 1)
def pow_(ctx: Lowering, n: OnnxNode) -> list[str]:
    x, y = n.inputs[0], n.inputs[1]
    e = ctx.const_value(y)
    if e is not None and e.size == 1 and e.ndim <= ctx.rank(x) and ctx.dtype(x) in FLOAT_DTYPES:
        # common exponents become cheaper, more accurate primitives
        e = float(e.reshape(-1)[0])
        if e == 1.0:
            return [x]
        if e == 2.0:
            return [ctx.elementwise(Prim.MUL, x, x)]
        if e == 0.5:
            return [ctx.unary(Prim.SQRT, x)]
    if ctx.dtype(x) in FLOAT_DTYPES:
        return [ctx.elementwise(Prim.POW, x, ctx.cast(y, ctx.dtype(x)))]
    # integer base: the power is taken in float64 and truncated, like ONNX Runtime
    wide = ctx.elementwise(Prim.POW, ctx.cast(x, "float64"), ctx.cast(y, "float64"))
    return [ctx.cast(wide, ctx.dtype(x))]


@fission("Cast", 1)
def cast(ctx: Lowering, n: OnnxNode) -> list[str]:
    return [ctx.cast(n.inputs[0], onnx_dtype(n.attr("to")))]


@fission("CastLike", 15)
def cast_like(ctx: Lowering, n: OnnxNode) -> list[str]:
    return [ctx.cast(n.inputs[0], ctx.dtype(n.inputs[1]))]


@fission("Identity", 1)
def identity(ctx: Lowering, n: OnnxNode) -> list[str]:
    return [n.inputs[0]]


@fission("Dropout", 1)
def dropout(ctx: Lowering, n: OnnxNode) -> list[str]:
    for unused in ("ratio", "seed"):  # attributes looked at, and of no effect at inference
        n.attr(unused, None)
    ratio, mode = ctx.const_value(n.input(1)), n.input(2)
    # the identity at inference, and in training with a ratio of 0 (the mask is then all true)
    never_drops = ratio is not None and float(ratio.reshape(-1)[0]) == 0.0
    training = ctx.const_value(mode)
    if mode is not None and training is None and not never_drops:
        ctx.unsupported("Dropout whose training_mode is known only at run time")
    if training is not None and bool(training.reshape(-1)[0]) and not never_drops:
        ctx.unsupported("Dropout in training mode is random")
    x = n.inputs[0]
    outs = [x]
    if n.n_outputs > 1 and n.opset >= 10:
        outs.append(ctx.broadcast_to(ctx.scalar(True, "bool"), ctx.shape(x)))
    elif n.n_outputs > 1:  # before opset 10 the mask has x's type, and ONNX Runtime fills it with 0
        outs.append(ctx.broadcast_to(ctx.scalar(0, ctx.dtype(x)), ctx.shape(x)))
    return outs


@fission("Where", 9)
def where(ctx: Lowering, n: OnnxNode) -> list[str]:
    return [ctx.elementwise(Prim.WHERE, *n.inputs[:3])]


def _variadic(prim: Prim):
    def rule(ctx: Lowering, n: OnnxNode) -> list[str]:
        acc = n.inputs[0]
        for v in n.inputs[1:]:
            acc = ctx.elementwise(prim, acc, v)
        return [acc]

    return rule


fission("Max", 1)(_variadic(Prim.MAX))
fission("Min", 1)(_variadic(Prim.MIN))
fission("Sum", 1)(_variadic(Prim.ADD))


@fission("Mean", 1)
def mean_(ctx: Lowering, n: OnnxNode) -> list[str]:
    total = _variadic(Prim.ADD)(ctx, n)[0]
    return [ctx.elementwise(Prim.DIV, total, ctx.scalar(len(n.inputs), ctx.dtype(total)))]


# ---------------------------------------------------------------- activations


def _s(ctx: Lowering, x: str, value: float) -> str:
    return ctx.scalar(value, ctx.dtype(x))


@fission("Relu", 1)
def relu(ctx: Lowering, n: OnnxNode) -> list[str]:
    x = n.inputs[0]
    return [ctx.elementwise(Prim.MAX, x, _s(ctx, x, 0))]


@fission("LeakyRelu", 1)
def leaky_relu(ctx: Lowering, n: OnnxNode) -> list[str]:
    return [leaky_relu_core(ctx, n.inputs[0], n.attr("alpha", 0.01))]


@fission("PRelu", 1)
def prelu(ctx: Lowering, n: OnnxNode) -> list[str]:
    x, slope = n.inputs[0], n.inputs[1]
    neg = ctx.elementwise(Prim.MUL, x, slope)
    is_neg = ctx.elementwise(Prim.LT, x, _s(ctx, x, 0))
    if ctx.shape(neg) != ctx.shape(x):
        is_neg = ctx.broadcast_to(is_neg, ctx.shape(neg))
    return [ctx.elementwise(Prim.WHERE, is_neg, neg, x)]


@fission("Elu", 1)
def elu(ctx: Lowering, n: OnnxNode) -> list[str]:
    return [elu_core(ctx, n.inputs[0], n.attr("alpha", 1.0))]


@fission("Celu", 12)
def celu(ctx: Lowering, n: OnnxNode) -> list[str]:
    x, alpha = n.inputs[0], n.attr("alpha", 1.0)
    scaled = ctx.elementwise(Prim.MUL, x, _s(ctx, x, 1.0 / alpha))
    em1 = ctx.elementwise(Prim.SUB, ctx.unary(Prim.EXP, scaled), _s(ctx, x, 1))
    neg = ctx.elementwise(Prim.MIN, ctx.elementwise(Prim.MUL, em1, _s(ctx, x, alpha)), _s(ctx, x, 0))
    return [ctx.elementwise(Prim.ADD, ctx.elementwise(Prim.MAX, x, _s(ctx, x, 0)), neg)]


@fission("Selu", 1)
def selu(ctx: Lowering, n: OnnxNode) -> list[str]:
    x = n.inputs[0]
    alpha = n.attr("alpha", 1.67326319217681884765625)
    gamma = n.attr("gamma", 1.05070102214813232421875)
    return [ctx.elementwise(Prim.MUL, elu_core(ctx, x, alpha), _s(ctx, x, gamma))]


@fission("HardSigmoid", 1)
def hard_sigmoid(ctx: Lowering, n: OnnxNode) -> list[str]:
    return [hard_sigmoid_core(ctx, n.inputs[0], n.attr("alpha", 0.2), n.attr("beta", 0.5))]


@fission("HardSwish", 14)
def hard_swish(ctx: Lowering, n: OnnxNode) -> list[str]:
    x = n.inputs[0]
    return [ctx.elementwise(Prim.MUL, x, hard_sigmoid_core(ctx, x, 1.0 / 6.0, 0.5))]


@fission("Softplus", 1)
def softplus(ctx: Lowering, n: OnnxNode) -> list[str]:
    return [softplus_core(ctx, n.inputs[0])]


@fission("Softsign", 1)
def softsign(ctx: Lowering, n: OnnxNode) -> list[str]:
    return [softsign_core(ctx, n.inputs[0])]


def softsign_core(ctx: Lowering, x: str) -> str:
    """x / (1 + |x|)."""
    return ctx.elementwise(Prim.DIV, x, ctx.elementwise(Prim.ADD, ctx.unary(Prim.ABS, x), _s(ctx, x, 1)))


@fission("Mish", 18)
def mish(ctx: Lowering, n: OnnxNode) -> list[str]:
    x = n.inputs[0]
    return [ctx.elementwise(Prim.MUL, x, ctx.unary(Prim.TANH, softplus_core(ctx, x)))]


@fission("Gelu", 20)
def gelu(ctx: Lowering, n: OnnxNode) -> list[str]:
    return [gelu_core(ctx, n.inputs[0], n.attr("approximate", "none"))]


@fission("ThresholdedRelu", 10)
def thresholded_relu(ctx: Lowering, n: OnnxNode) -> list[str]:
    return [thresholded_relu_core(ctx, n.inputs[0], n.attr("alpha", 1.0))]


def thresholded_relu_core(ctx: Lowering, x: str, alpha: float) -> str:
    """x where x > alpha, else 0."""
    return ctx.elementwise(Prim.WHERE, ctx.elementwise(Prim.GT, x, _s(ctx, x, alpha)), x, _s(ctx, x, 0))


@fission("Clip", 1)
def clip(ctx: Lowering, n: OnnxNode) -> list[str]:
    x = n.inputs[0]
    if n.opset < 11:
        lo, hi = n.attrs.get("min"), n.attrs.get("max")
        lo = None if lo is None else _s(ctx, x, lo)
        hi = None if hi is None else _s(ctx, x, hi)
    else:
        lo, hi = n.input(1), n.input(2)
    return [clip_core(ctx, x, lo, hi)]


@fission("Mod", 10)
def mod(ctx: Lowering, n: OnnxNode) -> list[str]:
    """fmod=1: C's fmod, a - b * trunc(a / b) (a finite dividend over an infinite divisor is its own
    remainder); fmod=0: the remainder takes the divisor's sign, as Python's % (integers, and
    floats from opset 28 on; before it ONNX requires fmod=1 for them)."""
    a, b = n.inputs[0], n.inputs[1]
    python = not n.attr("fmod", 0)
    if ctx.dtype(a) in FLOAT_DTYPES and python and n.opset < 28:
        raise KorchError(f"Mod on {ctx.dtype(a)} needs fmod=1 before opset 28")
    return [mod_core(ctx, a, b, python)]


# ------------------------------------------------- predicates, shrink, bit shifts


@fission("IsNaN", 9, 13, 20)
def is_nan(ctx: Lowering, n: OnnxNode) -> list[str]:
    return [isnan_core(ctx, n.inputs[0])]


@fission("IsInf", 10, 20)
def is_inf(ctx: Lowering, n: OnnxNode) -> list[str]:
    x = n.inputs[0]
    negative, positive = n.attr("detect_negative", 1), n.attr("detect_positive", 1)
    if negative and positive:
        return [ctx.elementwise(Prim.EQ, ctx.unary(Prim.ABS, x), _s(ctx, x, math.inf))]
    if negative or positive:
        return [ctx.elementwise(Prim.EQ, x, _s(ctx, x, -math.inf if negative else math.inf))]
    return [ctx.broadcast_to(ctx.scalar(False, "bool"), ctx.shape(x))]


@fission("Shrink", 9)
def shrink(ctx: Lowering, n: OnnxNode) -> list[str]:
    """x + bias below -lambd, x - bias above lambd, else 0. Like ONNX Runtime, other types than
    float32/float64 compute in float32 (integers: truncated back)."""
    x = n.inputs[0]
    lambd, bias = n.attr("lambd", 0.5), n.attr("bias", 0.0)
    dtype = ctx.dtype(x)
    xf = x if dtype in ("float32", "float64") else ctx.cast(x, "float32")
    below = ctx.elementwise(Prim.LT, xf, _s(ctx, xf, -lambd))
    above = ctx.elementwise(Prim.GT, xf, _s(ctx, xf, lambd))
    y = ctx.elementwise(Prim.WHERE, above, ctx.elementwise(Prim.SUB, xf, _s(ctx, xf, bias)), _s(ctx, xf, 0))
    y = ctx.elementwise(Prim.WHERE, below, ctx.elementwise(Prim.ADD, xf, _s(ctx, xf, bias)), y)
    return [ctx.cast(y, dtype)]


@fission("BitShift", 11)
def bit_shift(ctx: Lowering, n: OnnxNode) -> list[str]:
    """uint8 (korch has no wider unsigned type): x * 2^y or x / 2^y in int32, wrapped back to
    uint8; shifts of 8 or more give 0, as in ONNX Runtime. Signed types (opset 28): below."""
    x, y = n.inputs[0], n.inputs[1]
    if ctx.dtype(x) in _SIGNED_BITS:
        return [_signed_bit_shift(ctx, x, y, n.attr("direction") == "LEFT")]
    if ctx.dtype(x) != "uint8":
        ctx.unsupported(f"BitShift on {ctx.dtype(x)}")
    shift = ctx.cast(ctx.elementwise(Prim.MIN, y, ctx.scalar(8, "uint8")), "float32")
    power = ctx.elementwise(Prim.POW, ctx.scalar(2.0, "float32"), shift)
    power = ctx.cast(ctx.unary(Prim.ROUND, power), "int32")  # 1 .. 256, exact even if pow is not
    op = Prim.MUL if n.attr("direction") == "LEFT" else Prim.DIV
    return [ctx.cast(ctx.elementwise(op, ctx.cast(x, "int32"), power), "uint8")]


_SIGNED_BITS = {"int8": 8, "int16": 16, "int32": 32, "int64": 64}


def _signed_bit_shift(ctx: Lowering, x: str, y: str, left: bool) -> str:
    """Opset 28's signed shifts, in int64: left, x * 2^y wrapped back to the type; right,
    floor(x / 2^y) (arithmetic). A shift below 0 or of the width or more gives 0, or -1 for a
    right shift of a negative x. int64's shifts go in two halves (2^63 is no int64)."""
    dtype, bits = ctx.dtype(x), _SIGNED_BITS[ctx.dtype(x)]
    x64, s = ctx.cast(x, "int64"), ctx.cast(y, "int64")
    zero = ctx.scalar(0, "int64")
    too_far = ctx.unary(Prim.NOT, ctx.elementwise(Prim.LT, s, ctx.scalar(bits, "int64")))
    outside = ctx.elementwise(Prim.OR, ctx.elementwise(Prim.LT, s, zero), too_far)
    s = ctx.elementwise(Prim.WHERE, outside, zero, s)
    halves = [s] if bits < 64 else [ctx.elementwise(Prim.DIV, s, ctx.scalar(2, "int64"))]
    if bits == 64:
        halves.append(ctx.elementwise(Prim.SUB, s, halves[0]))
    negative = ctx.elementwise(Prim.LT, x64, zero)
    shifted = x64
    for part in halves:
        power = ctx.elementwise(Prim.POW, ctx.scalar(2.0, "float32"), ctx.cast(part, "float32"))
        power = ctx.cast(ctx.unary(Prim.ROUND, power), "int64")  # (2^0 .. 2^32: exact)
        if left:
            shifted = ctx.elementwise(Prim.MUL, shifted, power)
        else:  # (floor division: the truncating quotient, one less where the remainder is negative)
            quotient = ctx.elementwise(Prim.DIV, shifted, power)
            remainder = ctx.elementwise(Prim.SUB, shifted, ctx.elementwise(Prim.MUL, quotient, power))
            below = ctx.cast(ctx.elementwise(Prim.LT, remainder, zero), "int64")
            shifted = ctx.elementwise(Prim.SUB, quotient, below)
    fill = zero if left else ctx.elementwise(Prim.WHERE, negative, ctx.scalar(-1, "int64"), zero)
    return ctx.cast(ctx.elementwise(Prim.WHERE, outside, fill, shifted), dtype)


# ------------------------------------------------ trigonometric and hyperbolic


def _in_float32(fn):
    """A unary rule computed from fn(ctx, x); float16 and bfloat16 go through float32 so rounding
    happens once."""

    def rule(ctx: Lowering, n: OnnxNode) -> list[str]:
        x, dtype = ctx.widened(n.inputs[0])
        return [ctx.cast(fn(ctx, x), dtype)]

    return rule


fission("Asin", 7, 22)(_in_float32(asin_core))
fission("Acos", 7, 22)(_in_float32(acos_core))
for _op, _since, _core in (
    ("Tan", 7, tan_core),
    ("Sinh", 9, sinh_core),
    ("Cosh", 9, cosh_core),
    ("Asinh", 9, asinh_core),
    ("Acosh", 9, acosh_core),
    ("Atanh", 9, atanh_core),
):
    fission(_op, _since, 22)(_in_float32(_core))


@fission("Swish", 24)
def swish(ctx: Lowering, n: OnnxNode) -> list[str]:
    x, alpha = n.inputs[0], n.attr("alpha", 1.0)
    scaled = x if alpha == 1.0 else ctx.elementwise(Prim.MUL, x, _s(ctx, x, alpha))
    return [ctx.elementwise(Prim.MUL, x, ctx.unary(Prim.SIGMOID, scaled))]
