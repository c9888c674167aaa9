"""Elementwise builders: activations, clip, mod, and the math library (log1p, expm1, tan, the
inverse trigonometric and hyperbolic functions) written to keep the library functions' accuracy
near 0 and for huge arguments."""

from __future__ import annotations

import math

from korch.frontend.lowering import Lowering
from korch.ir.prims import FLOAT_DTYPES, Prim


def _s(ctx: Lowering, x: str, value: float) -> str:
    return ctx.scalar(value, ctx.dtype(x))


def leaky_relu_core(ctx: Lowering, x: str, alpha: float) -> str:
    """alpha * x where x < 0, else x."""
    neg = ctx.elementwise(Prim.MUL, x, _s(ctx, x, alpha))
    return ctx.elementwise(Prim.WHERE, ctx.elementwise(Prim.LT, x, _s(ctx, x, 0)), neg, x)


def elu_core(ctx: Lowering, x: str, alpha: float) -> str:
    """alpha * (exp(x) - 1) where x < 0, else x."""
    em1 = ctx.elementwise(Prim.SUB, ctx.unary(Prim.EXP, x), _s(ctx, x, 1))
    neg = ctx.elementwise(Prim.MUL, em1, _s(ctx, x, alpha))
    return ctx.elementwise(Prim.WHERE, ctx.elementwise(Prim.LT, x, _s(ctx, x, 0)), neg, x)


def hard_sigmoid_core(ctx: Lowering, x: str, alpha: float, beta: float) -> str:
    y = ctx.elementwise(Prim.ADD, ctx.elementwise(Prim.MUL, x, _s(ctx, x, alpha)), _s(ctx, x, beta))
    return ctx.elementwise(Prim.MIN, ctx.elementwise(Prim.MAX, y, _s(ctx, x, 0)), _s(ctx, x, 1))


def softplus_core(ctx: Lowering, x: str, exact_tail: bool = False) -> str:
    """log(1 + exp(x)) computed as max(x, 0) + log(1 + exp(-|x|)) so large inputs do not overflow.
    `exact_tail`: a log1p accurate for tiny exp(-|x|) too, so a very negative x keeps its tiny
    softplus to full relative precision, as torch computes it (torch's softplus). ONNX's Softplus
    and Mish keep the shorter form (YOLOv4's 72 Mish activations are its hot path): its error
    there is absolute, below an ulp of 1 (6e-8)."""
    tail = ctx.unary(Prim.EXP, ctx.unary(Prim.NEG, ctx.unary(Prim.ABS, x)))
    if exact_tail:
        log1p = log1p_core(ctx, tail)
    else:
        log1p = ctx.unary(Prim.LOG, ctx.elementwise(Prim.ADD, tail, _s(ctx, x, 1)))
    return ctx.elementwise(Prim.ADD, ctx.elementwise(Prim.MAX, x, _s(ctx, x, 0)), log1p)


def gelu_core(ctx: Lowering, x: str, approximate: str) -> str:
    """0.5 * x * (1 + erf(x / sqrt(2))), or the tanh approximation."""
    if approximate == "tanh":
        cube = ctx.elementwise(Prim.MUL, ctx.elementwise(Prim.MUL, x, x), x)
        inner = ctx.elementwise(Prim.ADD, x, ctx.elementwise(Prim.MUL, cube, _s(ctx, x, 0.044715)))
        t = ctx.unary(Prim.TANH, ctx.elementwise(Prim.MUL, inner, _s(ctx, x, math.sqrt(2 / math.pi))))
        gate = ctx.elementwise(Prim.ADD, t, _s(ctx, x, 1))
    else:
        erf = ctx.unary(Prim.ERF, ctx.elementwise(Prim.MUL, x, _s(ctx, x, 1 / math.sqrt(2))))
        gate = ctx.elementwise(Prim.ADD, erf, _s(ctx, x, 1))
    return ctx.elementwise(Prim.MUL, ctx.elementwise(Prim.MUL, x, gate), _s(ctx, x, 0.5))


def clip_core(ctx: Lowering, x: str, low: str | None, high: str | None) -> str:
    """max(x, low), then min(.., high); a bound left out (None) does not apply."""
    if low is not None:
        x = ctx.elementwise(Prim.MAX, x, low)
    if high is not None:
        x = ctx.elementwise(Prim.MIN, x, high)
    return x


def mod_core(ctx: Lowering, a: str, b: str, python: bool) -> str:
    """a mod b of one dtype: C's fmod, or (python) with the divisor's sign."""
    floats = ctx.dtype(a) in FLOAT_DTYPES
    if floats:
        q = ctx.elementwise(Prim.DIV, a, b)
        negative = ctx.elementwise(Prim.LT, q, _s(ctx, q, 0))
        trunc = ctx.elementwise(Prim.WHERE, negative, ctx.unary(Prim.CEIL, q), ctx.unary(Prim.FLOOR, q))
    else:
        trunc = ctx.elementwise(Prim.DIV, a, b)  # integer division truncates toward zero
    rem = ctx.elementwise(Prim.SUB, a, ctx.elementwise(Prim.MUL, b, trunc))
    if floats:  # (inf * trunc(a / inf) is nan)
        inf = _s(ctx, a, math.inf)
        finite_a = ctx.elementwise(Prim.LT, ctx.unary(Prim.ABS, a), inf)
        infinite_b = ctx.elementwise(Prim.EQ, ctx.unary(Prim.ABS, b), inf)
        rem = ctx.elementwise(Prim.WHERE, ctx.elementwise(Prim.AND, finite_a, infinite_b), a, rem)
    if not python:
        return rem
    zero = _s(ctx, rem, 0)
    nonzero = ctx.unary(Prim.NOT, ctx.elementwise(Prim.EQ, rem, zero))
    signs_differ = ctx.elementwise(
        Prim.XOR, ctx.elementwise(Prim.LT, rem, zero), ctx.elementwise(Prim.LT, b, zero)
    )
    fix = ctx.elementwise(Prim.AND, nonzero, signs_differ)
    rem = ctx.elementwise(Prim.WHERE, fix, ctx.elementwise(Prim.ADD, rem, b), rem)
    if floats:  # a zero remainder is a zero of the divisor's sign
        signed_zero = ctx.elementwise(Prim.MUL, ctx.unary(Prim.SIGN, b), zero)
        rem = ctx.elementwise(Prim.WHERE, nonzero, rem, signed_zero)
    return rem


def isnan_core(ctx: Lowering, x: str) -> str:
    """NaN is the one value not equal to itself."""
    return ctx.unary(Prim.NOT, ctx.elementwise(Prim.EQ, x, x))


_LN2 = math.log(2.0)


_BIG = 2.0**28  # above this, asinh(x) and acosh(x) are log(2x) to double precision (and x^2 may overflow)


def horner(ctx: Lowering, t: str, coefficients) -> str:
    """The polynomial in t with these coefficients, highest power first (Horner's rule)."""
    acc = ctx.scalar(coefficients[0], ctx.dtype(t))
    for k in coefficients[1:]:
        acc = ctx.elementwise(Prim.ADD, ctx.elementwise(Prim.MUL, acc, t), ctx.scalar(k, ctx.dtype(t)))
    return acc


def log1p_core(ctx: Lowering, u: str) -> str:
    """log(1 + u), accurate for small u: log(w) * u / (w - 1) with w = 1 + u (Goldberg, Theorem 4);
    u itself where w rounds to 1 (below half an ulp of 1) or to infinity (inf / inf is NaN)."""
    w = ctx.elementwise(Prim.ADD, u, _s(ctx, u, 1))
    d = ctx.elementwise(Prim.SUB, w, _s(ctx, u, 1))
    scaled = ctx.elementwise(Prim.MUL, ctx.unary(Prim.LOG, w), ctx.elementwise(Prim.DIV, u, d))
    exact = ctx.elementwise(
        Prim.OR, ctx.elementwise(Prim.EQ, d, _s(ctx, u, 0)), ctx.elementwise(Prim.EQ, w, _s(ctx, u, math.inf))
    )
    return ctx.elementwise(Prim.WHERE, exact, u, scaled)


def expm1_core(ctx: Lowering, x: str) -> str:
    """exp(x) - 1, accurate for small x: 2t / (1 - t) with t = tanh(x / 2) where |x| < 1/2 (no
    cancellation there), exp(x) - 1 elsewhere (tanh rounds to 1 well before exp overflows)."""
    t = ctx.unary(Prim.TANH, ctx.elementwise(Prim.MUL, x, _s(ctx, x, 0.5)))
    small = ctx.elementwise(
        Prim.DIV, ctx.elementwise(Prim.ADD, t, t), ctx.elementwise(Prim.SUB, _s(ctx, x, 1), t)
    )
    large = ctx.elementwise(Prim.SUB, ctx.unary(Prim.EXP, x), _s(ctx, x, 1))
    near_zero = ctx.elementwise(Prim.LT, ctx.unary(Prim.ABS, x), _s(ctx, x, 0.5))
    return ctx.elementwise(Prim.WHERE, near_zero, small, large)


def _log_twice(ctx: Lowering, x: str) -> str:
    """log(2x) = log(x) + log(2) without overflowing 2x."""
    return ctx.elementwise(Prim.ADD, ctx.unary(Prim.LOG, x), _s(ctx, x, _LN2))


def tan_core(ctx: Lowering, x: str) -> str:
    return ctx.elementwise(Prim.DIV, ctx.unary(Prim.SIN, x), ctx.unary(Prim.COS, x))


def asin_core(ctx: Lowering, x: str) -> str:
    """atan(x / sqrt((1 - x)(1 + x))): +-pi/2 at +-1 (x / 0 is +-inf), NaN beyond."""
    one = _s(ctx, x, 1)
    cos = ctx.unary(
        Prim.SQRT,
        ctx.elementwise(Prim.MUL, ctx.elementwise(Prim.SUB, one, x), ctx.elementwise(Prim.ADD, one, x)),
    )
    return ctx.unary(Prim.ATAN, ctx.elementwise(Prim.DIV, x, cos))


def acos_core(ctx: Lowering, x: str) -> str:
    """2 atan(sqrt((1 - x) / (1 + x))): no cancellation near 1, pi at -1, NaN beyond +-1."""
    one = _s(ctx, x, 1)
    ratio = ctx.elementwise(Prim.DIV, ctx.elementwise(Prim.SUB, one, x), ctx.elementwise(Prim.ADD, one, x))
    return ctx.elementwise(Prim.MUL, ctx.unary(Prim.ATAN, ctx.unary(Prim.SQRT, ratio)), _s(ctx, x, 2))


def _half_exps(ctx: Lowering, x: str) -> tuple[str, str]:
    """exp(x) / 2 and exp(-x) / 2, as exp(+-x - log 2) so they overflow no earlier than sinh does."""
    up = ctx.unary(Prim.EXP, ctx.elementwise(Prim.SUB, x, _s(ctx, x, _LN2)))
    down = ctx.unary(Prim.EXP, ctx.elementwise(Prim.SUB, ctx.unary(Prim.NEG, x), _s(ctx, x, _LN2)))
    return up, down


def sinh_core(ctx: Lowering, x: str) -> str:
    """2t / (1 - t^2) with t = tanh(x/2) for |x| < 1 (no cancellation near 0), else exp differences."""
    t = ctx.unary(Prim.TANH, ctx.elementwise(Prim.MUL, x, _s(ctx, x, 0.5)))
    one_minus = ctx.elementwise(Prim.SUB, _s(ctx, x, 1), ctx.elementwise(Prim.MUL, t, t))
    small = ctx.elementwise(Prim.DIV, ctx.elementwise(Prim.ADD, t, t), one_minus)
    large = ctx.elementwise(Prim.SUB, *_half_exps(ctx, x))
    is_small = ctx.elementwise(Prim.LT, ctx.unary(Prim.ABS, x), _s(ctx, x, 1))
    return ctx.elementwise(Prim.WHERE, is_small, small, large)


def cosh_core(ctx: Lowering, x: str) -> str:
    return ctx.elementwise(Prim.ADD, *_half_exps(ctx, x))


def asinh_core(ctx: Lowering, x: str) -> str:
    """sign(x) * log1p(a + a^2 / (1 + sqrt(1 + a^2))) with a = |x|; log(2a) for huge a."""
    a = ctx.unary(Prim.ABS, x)
    sq = ctx.elementwise(Prim.MUL, a, a)
    root = ctx.unary(Prim.SQRT, ctx.elementwise(Prim.ADD, sq, _s(ctx, x, 1)))
    frac = ctx.elementwise(Prim.DIV, sq, ctx.elementwise(Prim.ADD, root, _s(ctx, x, 1)))
    small = log1p_core(ctx, ctx.elementwise(Prim.ADD, a, frac))
    is_big = ctx.elementwise(Prim.GT, a, _s(ctx, x, _BIG))
    magnitude = ctx.elementwise(Prim.WHERE, is_big, _log_twice(ctx, a), small)
    return ctx.elementwise(Prim.MUL, ctx.unary(Prim.SIGN, x), magnitude)


def acosh_core(ctx: Lowering, x: str) -> str:
    """log1p(t + sqrt(t * (t + 2))) with t = x - 1 (exact near 1); log(2x) for huge x; NaN below 1."""
    t = ctx.elementwise(Prim.SUB, x, _s(ctx, x, 1))
    root = ctx.unary(Prim.SQRT, ctx.elementwise(Prim.MUL, t, ctx.elementwise(Prim.ADD, t, _s(ctx, x, 2))))
    small = log1p_core(ctx, ctx.elementwise(Prim.ADD, t, root))
    is_big = ctx.elementwise(Prim.GT, x, _s(ctx, x, _BIG))
    y = ctx.elementwise(Prim.WHERE, is_big, _log_twice(ctx, x), small)
    # below -1 in float32, t * (t + 2) can round to a non-negative number: NaN said explicitly
    below = ctx.elementwise(Prim.LT, x, _s(ctx, x, 1))
    return ctx.elementwise(Prim.WHERE, below, _s(ctx, x, math.nan), y)


def atanh_core(ctx: Lowering, x: str) -> str:
    """(log1p(x) - log1p(-x)) / 2: no cancellation near 0, +-inf at +-1, NaN beyond."""
    diff = ctx.elementwise(Prim.SUB, log1p_core(ctx, x), log1p_core(ctx, ctx.unary(Prim.NEG, x)))
    return ctx.elementwise(Prim.MUL, diff, _s(ctx, x, 0.5))
