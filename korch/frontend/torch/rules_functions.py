"""ATen rules for the rest of the math library: hyperbolic functions and their inverses, tan,
logarithms and powers of 2 and 10, erfc, hypot, copysign and the sign bit, fmax/fmin, isinf,
trunc, ldexp, lgamma, digamma, atan2, erfinv and the normal quantile. The hyperbolic ones reuse
the cores the ONNX rules use too (korch.frontend.ops.elementwise), which keep the library
functions' accuracy near 0 and for huge arguments."""

from __future__ import annotations

import math

from korch.errors import KorchError
from korch.frontend.lowering import Lowering
from korch.frontend.ops.elementwise import (
    acosh_core,
    asinh_core,
    atanh_core,
    cosh_core,
    horner,
    isnan_core,
    sinh_core,
    tan_core,
)
from korch.frontend.torch.aten import AtenNode, aten, operand
from korch.frontend.torch.rules_math import vector_norm_core
from korch.ir.prims import Prim, is_float


def _x(ctx: Lowering, n: AtenNode) -> str:
    return ctx.cast(n["self"], n.out.dtype)


def _s(ctx: Lowering, x: str, value) -> str:
    return ctx.scalar(value, ctx.dtype(x))


def _pair(ctx: Lowering, n: AtenNode) -> tuple[str, str]:
    """self and other in the output dtype (torch's promotion decided it)."""
    return operand(ctx, n["self"], n.out.dtype), operand(ctx, n["other"], n.out.dtype)


_CORES = {
    "tan": tan_core,
    "sinh": sinh_core,
    "cosh": cosh_core,
    "asinh": asinh_core,
    "acosh": acosh_core,
    "atanh": atanh_core,
    "log2": lambda ctx, x: ctx.elementwise(Prim.MUL, ctx.unary(Prim.LOG, x), _s(ctx, x, 1 / math.log(2))),
    "log10": lambda ctx, x: ctx.elementwise(Prim.MUL, ctx.unary(Prim.LOG, x), _s(ctx, x, 1 / math.log(10))),
    "exp2": lambda ctx, x: ctx.elementwise(Prim.POW, _s(ctx, x, 2.0), x),
}


def _widened(core):
    def rule(ctx: Lowering, n: AtenNode) -> str:
        x, dtype = ctx.widened(_x(ctx, n))
        return ctx.cast(core(ctx, x), dtype)

    return rule


for _op, _core in _CORES.items():
    aten(f"aten.{_op}.default")(_widened(_core))


def _sign_bit(ctx: Lowering, x: str) -> str:
    """x < 0, or x is -0.0 (1 / -0.0 is -inf); a NaN counts as positive."""
    if not is_float(ctx.dtype(x)):
        return ctx.elementwise(Prim.LT, x, _s(ctx, x, 0))
    negative_zero = ctx.elementwise(
        Prim.AND,
        ctx.elementwise(Prim.EQ, x, _s(ctx, x, 0)),
        ctx.elementwise(Prim.LT, ctx.unary(Prim.RECIPROCAL, x), _s(ctx, x, 0)),
    )
    return ctx.elementwise(Prim.OR, ctx.elementwise(Prim.LT, x, _s(ctx, x, 0)), negative_zero)


@aten("aten.signbit.default")
def signbit(ctx: Lowering, n: AtenNode) -> str:
    return _sign_bit(ctx, n["self"])


@aten("aten.copysign.Tensor", "aten.copysign.Scalar")
def copysign(ctx: Lowering, n: AtenNode) -> str:
    a, b = _pair(ctx, n)
    magnitude = ctx.unary(Prim.ABS, a)
    return ctx.elementwise(Prim.WHERE, _sign_bit(ctx, b), ctx.unary(Prim.NEG, magnitude), magnitude)


@aten("aten.fmax.default", "aten.fmin.default")
def fmax(ctx: Lowering, n: AtenNode) -> str:
    """max (min) that takes the other operand where one is NaN (or and and, of bools)."""
    a, b = _pair(ctx, n)
    if n.out.dtype == "bool":
        return ctx.elementwise(Prim.OR if "fmax" in n.target else Prim.AND, a, b)
    y = ctx.elementwise(Prim.MAX if "fmax" in n.target else Prim.MIN, a, b)
    if not is_float(n.out.dtype):
        return y
    return ctx.elementwise(
        Prim.WHERE, isnan_core(ctx, a), b, ctx.elementwise(Prim.WHERE, isnan_core(ctx, b), a, y)
    )


@aten("aten.isinf.default")
def isinf(ctx: Lowering, n: AtenNode) -> str:
    x = n["self"]
    if not is_float(ctx.dtype(x)):
        return ctx.broadcast_to(ctx.scalar(False, "bool"), ctx.shape(x))
    return ctx.elementwise(Prim.EQ, ctx.unary(Prim.ABS, x), _s(ctx, x, math.inf))


@aten("aten.trunc.default")
def trunc(ctx: Lowering, n: AtenNode) -> str:
    x = _x(ctx, n)
    if not is_float(ctx.dtype(x)):
        return x
    negative = ctx.elementwise(Prim.LT, x, _s(ctx, x, 0))
    return ctx.elementwise(Prim.WHERE, negative, ctx.unary(Prim.CEIL, x), ctx.unary(Prim.FLOOR, x))


@aten("aten.ldexp.Tensor")
def ldexp(ctx: Lowering, n: AtenNode) -> str:
    """self * 2^other (powers of two are exact)."""
    a, b = _pair(ctx, n)
    return ctx.elementwise(Prim.MUL, a, ctx.elementwise(Prim.POW, _s(ctx, a, 2.0), b))


@aten("aten.hypot.default")
def hypot(ctx: Lowering, n: AtenNode) -> str:
    """m * sqrt(1 + (s / m)^2) with m, s the larger and smaller magnitude (no overflow of the
    squares); 0 where both are 0, inf where either is infinite (a NaN beside it too)."""
    a, b = (ctx.unary(Prim.ABS, v) for v in _pair(ctx, n))
    big, small = ctx.elementwise(Prim.MAX, a, b), ctx.elementwise(Prim.MIN, a, b)
    ratio = ctx.elementwise(Prim.DIV, small, big)
    root = ctx.unary(
        Prim.SQRT, ctx.elementwise(Prim.ADD, _s(ctx, a, 1), ctx.elementwise(Prim.MUL, ratio, ratio))
    )
    y = ctx.elementwise(Prim.MUL, big, root)
    y = ctx.elementwise(Prim.WHERE, ctx.elementwise(Prim.EQ, big, _s(ctx, a, 0)), _s(ctx, a, 0), y)
    infinite = ctx.elementwise(Prim.OR, *(ctx.elementwise(Prim.EQ, v, _s(ctx, a, math.inf)) for v in (a, b)))
    return ctx.elementwise(Prim.WHERE, infinite, _s(ctx, a, math.inf), y)


# Numerical Recipes' erfcc (a Chebyshev fit): fractional error below 1.2e-7 for every x >= 0
_ERFC = (
    -1.26551223,
    1.00002368,
    0.37409196,
    0.09678418,
    -0.18628806,
    0.27886807,
    -1.13520398,
    1.48851587,
    -0.82215223,
    0.17087277,
)


@aten("aten.erfc.default")
def erfc(ctx: Lowering, n: AtenNode) -> str:
    """1 - erf(x) near 0 (no cancellation below 1/2), the fit t exp(-x^2 + P(t)), t = 1 / (1 + |x|/2),
    above (1 - erf(x) would lose every digit of erfc(5) = 1.5e-12), 2 - erfc(-x) below zero."""
    x = _x(ctx, n)
    z = ctx.unary(Prim.ABS, x)
    t = ctx.unary(
        Prim.RECIPROCAL,
        ctx.elementwise(Prim.ADD, _s(ctx, x, 1), ctx.elementwise(Prim.MUL, z, _s(ctx, x, 0.5))),
    )
    poly = _s(ctx, x, _ERFC[-1])
    for c in reversed(_ERFC[:-1]):
        poly = ctx.elementwise(Prim.ADD, ctx.elementwise(Prim.MUL, poly, t), _s(ctx, x, c))
    tail = ctx.elementwise(
        Prim.MUL, t, ctx.unary(Prim.EXP, ctx.elementwise(Prim.SUB, poly, ctx.elementwise(Prim.MUL, z, z)))
    )
    tail = ctx.elementwise(
        Prim.WHERE,
        ctx.elementwise(Prim.LT, x, _s(ctx, x, 0)),
        ctx.elementwise(Prim.SUB, _s(ctx, x, 2), tail),
        tail,
    )
    near = ctx.elementwise(Prim.SUB, _s(ctx, x, 1), ctx.unary(Prim.ERF, x))
    return ctx.elementwise(Prim.WHERE, ctx.elementwise(Prim.LT, z, _s(ctx, x, 0.5)), near, tail)


# Lanczos (g = 7, 9 terms): relative error about 1e-15 for x >= 1/2, in float64
_LANCZOS = (
    0.99999999999980993,
    676.5203681218851,
    -1259.1392167224028,
    771.32342877765313,
    -176.61502916214059,
    12.507343278686905,
    -0.13857109526572012,
    9.9843695780195716e-6,
    1.5056327351493116e-7,
)


def _in_float64(fn):
    """A rule computing fn(ctx, x) in float64 (the series cancel too much in float32)."""

    def rule(ctx: Lowering, n: AtenNode) -> str:
        return ctx.cast(fn(ctx, ctx.cast(n["self"], "float64")), n.out.dtype)

    return rule


def _integer_at_or_below_zero(ctx: Lowering, x: str) -> str:
    at_or_below = ctx.unary(Prim.NOT, ctx.elementwise(Prim.GT, x, _s(ctx, x, 0)))
    return ctx.elementwise(Prim.AND, at_or_below, ctx.elementwise(Prim.EQ, x, ctx.unary(Prim.FLOOR, x)))


def lgamma_core(ctx: Lowering, x: str) -> str:
    """log|gamma(x)|: Lanczos' sum for x >= 1/2, the reflection log(pi / |sin(pi x)|) - lgamma(1 - x)
    below; exactly 0 at 1 and 2; inf at the poles (0, -1, -2, ...) and at +-inf."""
    reflect = ctx.elementwise(Prim.LT, x, _s(ctx, x, 0.5))
    y = ctx.elementwise(Prim.WHERE, reflect, ctx.elementwise(Prim.SUB, _s(ctx, x, 1), x), x)
    z = ctx.elementwise(Prim.SUB, y, _s(ctx, x, 1))
    total = _s(ctx, x, _LANCZOS[0])
    for i, c in enumerate(_LANCZOS[1:], start=1):
        term = ctx.elementwise(Prim.DIV, _s(ctx, x, c), ctx.elementwise(Prim.ADD, z, _s(ctx, x, i)))
        total = ctx.elementwise(Prim.ADD, total, term)
    t = ctx.elementwise(Prim.ADD, z, _s(ctx, x, 7.5))
    body = ctx.elementwise(Prim.MUL, ctx.elementwise(Prim.ADD, z, _s(ctx, x, 0.5)), ctx.unary(Prim.LOG, t))
    body = ctx.elementwise(Prim.SUB, body, t)
    body = ctx.elementwise(Prim.ADD, body, ctx.unary(Prim.LOG, total))
    body = ctx.elementwise(Prim.ADD, body, _s(ctx, x, 0.5 * math.log(2 * math.pi)))
    sine = ctx.unary(Prim.ABS, ctx.unary(Prim.SIN, ctx.elementwise(Prim.MUL, x, _s(ctx, x, math.pi))))
    reflected = ctx.elementwise(
        Prim.SUB, ctx.unary(Prim.LOG, ctx.elementwise(Prim.DIV, _s(ctx, x, math.pi), sine)), body
    )
    y = ctx.elementwise(Prim.WHERE, reflect, reflected, body)
    ones = ctx.elementwise(
        Prim.OR, *(ctx.elementwise(Prim.EQ, x, _s(ctx, x, v)) for v in (1, 2))
    )  # (gamma is 1 there: log 0 exactly, not the sum's last bit)
    y = ctx.elementwise(Prim.WHERE, ones, _s(ctx, x, 0), y)
    infinite = ctx.elementwise(Prim.EQ, ctx.unary(Prim.ABS, x), _s(ctx, x, math.inf))
    poles = ctx.elementwise(Prim.OR, _integer_at_or_below_zero(ctx, x), infinite)
    return ctx.elementwise(Prim.WHERE, poles, _s(ctx, x, math.inf), y)


def digamma_core(ctx: Lowering, x: str) -> str:
    """psi(x) = psi(x + 6) - sum 1/(x + k), k < 6, with the asymptotic series at x + 6; the
    reflection psi(1 - x) - pi / tan(pi x) below 0; NaN at the negative integers, -inf at +0
    (+inf at -0: 1 / -0 is -inf)."""
    reflect = ctx.elementwise(Prim.LT, x, _s(ctx, x, 0))
    y = ctx.elementwise(Prim.WHERE, reflect, ctx.elementwise(Prim.SUB, _s(ctx, x, 1), x), x)
    shifted = ctx.elementwise(Prim.ADD, y, _s(ctx, x, 6))
    inv = ctx.unary(Prim.RECIPROCAL, shifted)
    inv2 = ctx.elementwise(Prim.MUL, inv, inv)
    series = _s(ctx, x, -5 / 660)
    for c in (1 / 240, -1 / 252, 1 / 120, -1 / 12):
        series = ctx.elementwise(Prim.ADD, ctx.elementwise(Prim.MUL, series, inv2), _s(ctx, x, c))
    psi = ctx.elementwise(
        Prim.SUB, ctx.unary(Prim.LOG, shifted), ctx.elementwise(Prim.MUL, inv, _s(ctx, x, 0.5))
    )
    psi = ctx.elementwise(Prim.ADD, psi, ctx.elementwise(Prim.MUL, series, inv2))
    for k in range(6):
        psi = ctx.elementwise(
            Prim.SUB, psi, ctx.unary(Prim.RECIPROCAL, ctx.elementwise(Prim.ADD, y, _s(ctx, x, k)))
        )
    tangent = ctx.elementwise(
        Prim.DIV, _s(ctx, x, math.pi), tan_core(ctx, ctx.elementwise(Prim.MUL, x, _s(ctx, x, math.pi)))
    )
    psi = ctx.elementwise(Prim.WHERE, reflect, ctx.elementwise(Prim.SUB, psi, tangent), psi)
    negative_integer = ctx.elementwise(
        Prim.AND, reflect, ctx.elementwise(Prim.EQ, x, ctx.unary(Prim.FLOOR, x))
    )
    return ctx.elementwise(Prim.WHERE, negative_integer, _s(ctx, x, math.nan), psi)


aten("aten.lgamma.default")(_in_float64(lgamma_core))
aten("aten.digamma.default")(_in_float64(digamma_core))


# Giles, "Approximating the erfinv function" (GPU Computing Gems, 2011): single precision, in
# w = -log((1 - x)(1 + x)), below 5 around 2.5, above in sqrt(w) around 3 (highest power first)
_ERFINV_CENTRE = (2.81022636e-08, 3.43273939e-07, -3.5233877e-06, -4.39150654e-06, 0.00021858087)
_ERFINV_CENTRE += (-0.00125372503, -0.00417768164, 0.246640727, 1.50140941)
_ERFINV_TAIL = (-0.000200214257, 0.000100950558, 0.00134934322, -0.00367342844, 0.00573950773)
_ERFINV_TAIL += (-0.0076224613, 0.00943887047, 1.00167406, 2.83297682)


def erfinv_core(ctx: Lowering, x: str) -> str:
    """erf's inverse: x times Giles' polynomial (about 1e-7 relative); +-inf at +-1, NaN beyond."""

    one = _s(ctx, x, 1)
    w = ctx.elementwise(Prim.MUL, ctx.elementwise(Prim.SUB, one, x), ctx.elementwise(Prim.ADD, one, x))
    w = ctx.unary(Prim.NEG, ctx.unary(Prim.LOG, w))
    centre = horner(ctx, ctx.elementwise(Prim.SUB, w, _s(ctx, x, 2.5)), _ERFINV_CENTRE)
    tail = horner(ctx, ctx.elementwise(Prim.SUB, ctx.unary(Prim.SQRT, w), _s(ctx, x, 3)), _ERFINV_TAIL)
    p = ctx.elementwise(Prim.WHERE, ctx.elementwise(Prim.LT, w, _s(ctx, x, 5)), centre, tail)
    y = ctx.elementwise(Prim.MUL, p, x)
    edge = ctx.elementwise(Prim.EQ, ctx.unary(Prim.ABS, x), one)  # (p is inf or NaN there)
    return ctx.elementwise(Prim.WHERE, edge, ctx.elementwise(Prim.MUL, x, _s(ctx, x, math.inf)), y)


def ndtri_core(ctx: Lowering, p: str) -> str:
    """The standard normal's quantile: sqrt(2) erfinv(2p - 1)."""
    centred = ctx.elementwise(Prim.SUB, ctx.elementwise(Prim.MUL, p, _s(ctx, p, 2)), _s(ctx, p, 1))
    return ctx.elementwise(Prim.MUL, erfinv_core(ctx, centred), _s(ctx, p, math.sqrt(2)))


aten("aten.erfinv.default")(_in_float64(erfinv_core))
aten("aten.special_ndtri.default")(_in_float64(ndtri_core))


@aten("aten.atan2.default")
def atan2(ctx: Lowering, n: AtenNode) -> str:
    """atan(y / x), turned by pi toward y's side where x's sign is negative (signs read as IEEE
    does, -0.0 negative: v < 0 or 1 / v < 0), and where y is zero, y itself or that turn (y / x
    is NaN at x = +-0). Both infinite gives NaN (torch: an odd multiple of pi/4)."""
    y, x = ctx.cast(n["self"], n.out.dtype), ctx.cast(n["other"], n.out.dtype)
    zero = _s(ctx, x, 0)

    def negative(v: str) -> str:
        below = ctx.elementwise(Prim.LT, v, zero)
        return ctx.elementwise(Prim.OR, below, ctx.elementwise(Prim.LT, ctx.unary(Prim.RECIPROCAL, v), zero))

    turn = ctx.elementwise(Prim.WHERE, negative(y), _s(ctx, x, -math.pi), _s(ctx, x, math.pi))
    left = negative(x)
    angle = ctx.unary(Prim.ATAN, ctx.elementwise(Prim.DIV, y, x))
    angle = ctx.elementwise(Prim.WHERE, left, ctx.elementwise(Prim.ADD, angle, turn), angle)
    on_axis = ctx.elementwise(Prim.WHERE, left, turn, y)
    return ctx.elementwise(Prim.WHERE, ctx.elementwise(Prim.EQ, y, zero), on_axis, angle)


@aten("aten.polygamma.default")
def polygamma(ctx: Lowering, n: AtenNode) -> str:
    if n["n"] != 0:
        raise KorchError(f"polygamma of order {n['n']} is not supported (order 0, digamma, is)")
    return ctx.cast(digamma_core(ctx, ctx.cast(n["self"], "float64")), n.out.dtype)


@aten("aten.angle.default")
def angle(ctx: Lowering, n: AtenNode) -> str:
    """The argument of a real number: pi below zero, else 0 (NaN stays NaN)."""
    x = _x(ctx, n)
    negative = ctx.elementwise(Prim.LT, x, _s(ctx, x, 0))
    y = ctx.elementwise(Prim.WHERE, negative, _s(ctx, x, math.pi), _s(ctx, x, 0))
    return ctx.elementwise(Prim.WHERE, isnan_core(ctx, x), x, y)


@aten("aten.dist.default")
def dist(ctx: Lowering, n: AtenNode) -> str:
    """The p-norm of self - other over every element."""
    diff = ctx.elementwise(Prim.SUB, *_pair(ctx, n))
    return ctx.reshape(vector_norm_core(ctx, diff, range(ctx.rank(diff)), float(n["p"])), n.out.shape)


@aten("aten._cdist_forward.default")
def cdist(ctx: Lowering, n: AtenNode) -> str:
    """p-norm distances between the rows of x1 [..., P, M] and x2 [..., R, M]: every difference
    [..., P, R, M] reduced over M (torch's matmul form for p = 2 differs in the last bits)."""
    x1, x2 = (ctx.cast(n[k], n.out.dtype) for k in ("x1", "x2"))
    a = ctx.reshape(x1, ctx.shape(x1)[:-1] + (1, ctx.shape(x1)[-1]))
    b = ctx.reshape(x2, ctx.shape(x2)[:-2] + (1,) + ctx.shape(x2)[-2:])
    diff = ctx.elementwise(Prim.SUB, a, b)
    return ctx.reshape(vector_norm_core(ctx, diff, [ctx.rank(diff) - 1], float(n["p"])), n.out.shape)
