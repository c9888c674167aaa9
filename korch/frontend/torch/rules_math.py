"""ATen rules for elementwise arithmetic, activations, reductions, softmax and the normalizations."""

from __future__ import annotations

import math

import numpy as np

from korch.frontend.lowering import Lowering, normalize_axes
from korch.frontend.ops.elementwise import (
    acos_core,
    asin_core,
    clip_core,
    elu_core,
    expm1_core,
    gelu_core,
    hard_sigmoid_core,
    isnan_core,
    leaky_relu_core,
    log1p_core,
    mod_core,
    softplus_core,
)
from korch.frontend.ops.linear import add_bias
from korch.frontend.ops.reduce import batch_norm_core, channel_param, cumsum_core, normalize, softmax
from korch.frontend.torch.aten import AtenNode, aten, operand, vector
from korch.ir.prims import Prim, is_float


def _common_dtype(n: AtenNode, *keys: str) -> str:
    """torch's type promotion over tensor and scalar operands (comparisons compare in this type)."""
    import torch

    from korch.frontend.torch.aten import torch_dtype_name

    args = [n.vals[k] if k in n.vals else n[k] for k in keys]
    return torch_dtype_name(torch.result_type(*args)) if len(args) == 2 else torch_dtype_name(args[0].dtype)


# ----------------------------------------------------------------- arithmetic

_ARITH = {
    "add": Prim.ADD,
    "sub": Prim.SUB,
    "mul": Prim.MUL,
    "div": Prim.DIV,
    "pow": Prim.POW,
    "maximum": Prim.MAX,
    "minimum": Prim.MIN,
}


# arithmetic on bools, as torch does it (sub and div of bools are errors in torch)
_LOGICAL = {Prim.ADD: Prim.OR, Prim.MUL: Prim.AND, Prim.MAX: Prim.OR, Prim.MIN: Prim.AND}


def _arith_rule(prim: Prim, first: str = "self", second: str = "other", reverse: bool = False):
    def rule(ctx: Lowering, n: AtenNode) -> str:
        dtype = n.out.dtype
        a, b = operand(ctx, n[first], dtype), operand(ctx, n[second], dtype)
        if dtype == "bool" and prim in _LOGICAL:  # (torch's decompositions multiply masks: isfinite)
            return ctx.elementwise(_LOGICAL[prim], a, b)
        alpha = n.get("alpha", 1)
        if alpha != 1:
            b = ctx.elementwise(Prim.MUL, b, operand(ctx, alpha, dtype)) if not reverse else b
            a = ctx.elementwise(Prim.MUL, a, operand(ctx, alpha, dtype)) if reverse else a
        return ctx.elementwise(prim, b, a) if reverse else ctx.elementwise(prim, a, b)

    return rule


for _op, _prim in _ARITH.items():
    if _op == "pow":
        aten("aten.pow.Tensor_Tensor")(_arith_rule(_prim, "self", "exponent"))
        aten("aten.pow.Scalar")(_arith_rule(_prim, "self", "exponent"))
    elif _op in ("maximum", "minimum"):
        aten(f"aten.{_op}.default")(_arith_rule(_prim))
    else:
        aten(f"aten.{_op}.Tensor", f"aten.{_op}.Scalar")(_arith_rule(_prim))
aten("aten.rsub.Tensor", "aten.rsub.Scalar")(_arith_rule(Prim.SUB, reverse=True))


@aten("aten.pow.Tensor_Scalar")
def pow_scalar(ctx: Lowering, n: AtenNode) -> str:
    x, e = ctx.cast(n["self"], n.out.dtype), n["exponent"]
    if e == 1:
        return x
    if e == 2:
        return ctx.elementwise(Prim.MUL, x, x)
    if e == 0.5 and is_float(n.out.dtype):
        return ctx.unary(Prim.SQRT, x)
    return ctx.elementwise(Prim.POW, x, operand(ctx, e, n.out.dtype))


@aten("aten.div.Tensor_mode")
def div_mode(ctx: Lowering, n: AtenNode) -> str:
    mode, dtype = n["rounding_mode"], n.out.dtype
    a, b = operand(ctx, n["self"], dtype), operand(ctx, n["other"], dtype)
    if mode is None or not is_float(dtype):
        if mode == "floor" and not is_float(dtype):
            work = "float64"
            q = ctx.unary(Prim.FLOOR, ctx.elementwise(Prim.DIV, ctx.cast(a, work), ctx.cast(b, work)))
            return ctx.cast(q, dtype)
        return ctx.elementwise(Prim.DIV, a, b)  # integer division truncates
    q = ctx.elementwise(Prim.DIV, a, b)
    if mode == "floor":
        return ctx.unary(Prim.FLOOR, q)
    negative = ctx.elementwise(Prim.LT, q, ctx.scalar(0, dtype))
    return ctx.elementwise(Prim.WHERE, negative, ctx.unary(Prim.CEIL, q), ctx.unary(Prim.FLOOR, q))


@aten("aten.remainder.Tensor", "aten.remainder.Scalar")
def remainder(ctx: Lowering, n: AtenNode) -> str:
    """Python's modulo, a - b * floor(a / b) (the sign of the divisor); integers work in float64."""
    dtype = n.out.dtype
    work = dtype if is_float(dtype) else "float64"
    a, b = operand(ctx, n["self"], work), operand(ctx, n["other"], work)
    q = ctx.unary(Prim.FLOOR, ctx.elementwise(Prim.DIV, a, b))
    return ctx.cast(ctx.elementwise(Prim.SUB, a, ctx.elementwise(Prim.MUL, b, q)), dtype)


@aten("aten.fmod.Tensor", "aten.fmod.Scalar")
def fmod(ctx: Lowering, n: AtenNode) -> str:
    """C's fmod: the remainder takes the dividend's sign (ONNX's Mod with fmod=1)."""
    dtype = n.out.dtype
    return mod_core(ctx, operand(ctx, n["self"], dtype), operand(ctx, n["other"], dtype), python=False)


# ---------------------------------------------------------------- comparisons


def _compare_rule(prims: tuple[Prim, ...], negate: bool = False):
    def rule(ctx: Lowering, n: AtenNode) -> str:
        dtype = _common_dtype(n, "self", "other")
        a, b = operand(ctx, n["self"], dtype), operand(ctx, n["other"], dtype)
        out = ctx.elementwise(prims[0], a, b)
        for p in prims[1:]:
            out = ctx.elementwise(Prim.OR, out, ctx.elementwise(p, a, b))
        return ctx.unary(Prim.NOT, out) if negate else out

    return rule


for _op, (_prims, _neg) in {
    "eq": ((Prim.EQ,), False),
    "ne": ((Prim.EQ,), True),
    "lt": ((Prim.LT,), False),
    "gt": ((Prim.GT,), False),
    "le": ((Prim.LT, Prim.EQ), False),  # (a < b) or (a == b): NOT(a > b) would be true for NaN
    "ge": ((Prim.GT, Prim.EQ), False),
}.items():
    aten(f"aten.{_op}.Tensor", f"aten.{_op}.Scalar")(_compare_rule(_prims, _neg))


def _logical_rule(prim: Prim):
    def rule(ctx: Lowering, n: AtenNode) -> str:
        return ctx.elementwise(prim, operand(ctx, n["self"], "bool"), operand(ctx, n["other"], "bool"))

    return rule


aten("aten.logical_and.default", "aten.bitwise_and.Tensor")(_logical_rule(Prim.AND))
aten("aten.logical_or.default", "aten.bitwise_or.Tensor")(_logical_rule(Prim.OR))
aten("aten.logical_xor.default", "aten.bitwise_xor.Tensor")(_logical_rule(Prim.XOR))


@aten("aten.logical_not.default", "aten.bitwise_not.default")
def logical_not(ctx: Lowering, n: AtenNode) -> str:
    return ctx.unary(Prim.NOT, ctx.cast(n["self"], "bool"))


@aten("aten.where.self", "aten.where.ScalarSelf", "aten.where.ScalarOther", "aten.where.Scalar")
def where(ctx: Lowering, n: AtenNode) -> str:
    dtype = n.out.dtype
    cond = ctx.cast(n["condition"], "bool")
    return ctx.elementwise(Prim.WHERE, cond, operand(ctx, n["self"], dtype), operand(ctx, n["other"], dtype))


@aten("aten.masked_fill.Scalar", "aten.masked_fill.Tensor")
def masked_fill(ctx: Lowering, n: AtenNode) -> str:
    dtype = n.out.dtype
    mask = ctx.cast(n["mask"], "bool")
    return ctx.elementwise(Prim.WHERE, mask, operand(ctx, n["value"], dtype), n["self"])


# ---------------------------------------------------------------------- unary

_UNARY = {
    "abs": Prim.ABS,
    "neg": Prim.NEG,
    "exp": Prim.EXP,
    "log": Prim.LOG,
    "sqrt": Prim.SQRT,
    "reciprocal": Prim.RECIPROCAL,
    "erf": Prim.ERF,
    "tanh": Prim.TANH,
    "sigmoid": Prim.SIGMOID,
    "floor": Prim.FLOOR,
    "ceil": Prim.CEIL,
    "round": Prim.ROUND,
    "sin": Prim.SIN,
    "cos": Prim.COS,
    "atan": Prim.ATAN,
    "sign": Prim.SIGN,
}


aten("aten.isnan.default")(lambda ctx, n: isnan_core(ctx, n["self"]))


@aten("aten.round.decimals")
def round_decimals(ctx: Lowering, n: AtenNode) -> str:
    """As torch: round(x * 10^d) / 10^d, or round(x / 10^-d) * 10^-d for negative d."""
    x, decimals = _x(ctx, n), n["decimals"]
    scale = _s(ctx, x, 10.0 ** abs(decimals))
    if decimals >= 0:
        return ctx.elementwise(Prim.DIV, ctx.unary(Prim.ROUND, ctx.elementwise(Prim.MUL, x, scale)), scale)
    return ctx.elementwise(Prim.MUL, ctx.unary(Prim.ROUND, ctx.elementwise(Prim.DIV, x, scale)), scale)


def _unary_rule(prim: Prim):
    def rule(ctx: Lowering, n: AtenNode) -> str:
        return ctx.unary(prim, ctx.cast(n["self"], n.out.dtype))

    return rule


for _op, _prim in _UNARY.items():
    aten(f"aten.{_op}.default")(_unary_rule(_prim))


def _x(ctx: Lowering, n: AtenNode) -> str:
    return ctx.cast(n["self"], n.out.dtype)


aten("aten.asin.default")(lambda ctx, n: asin_core(ctx, _x(ctx, n)))
aten("aten.acos.default")(lambda ctx, n: acos_core(ctx, _x(ctx, n)))


def _s(ctx: Lowering, x: str, value: float) -> str:
    return ctx.scalar(value, ctx.dtype(x))


def _activation(body):
    """Register-friendly wrapper: the input cast to the output type, then the formula."""

    def rule(ctx: Lowering, n: AtenNode) -> str:
        return body(ctx, _x(ctx, n), n)

    return rule


_ACTIVATIONS = {
    "rsqrt": lambda ctx, x, n: ctx.unary(Prim.RECIPROCAL, ctx.unary(Prim.SQRT, x)),
    "log1p": lambda ctx, x, n: log1p_core(ctx, x),
    "expm1": lambda ctx, x, n: expm1_core(ctx, x),
    "relu": lambda ctx, x, n: ctx.elementwise(Prim.MAX, x, _s(ctx, x, 0)),
    "silu": lambda ctx, x, n: ctx.elementwise(Prim.MUL, x, ctx.unary(Prim.SIGMOID, x)),
    "gelu": lambda ctx, x, n: gelu_core(ctx, x, n.get("approximate", "none")),
    "hardsigmoid": lambda ctx, x, n: hard_sigmoid_core(ctx, x, 1.0 / 6.0, 0.5),
    "hardswish": lambda ctx, x, n: ctx.elementwise(Prim.MUL, x, hard_sigmoid_core(ctx, x, 1.0 / 6.0, 0.5)),
    "mish": lambda ctx, x, n: ctx.elementwise(Prim.MUL, x, ctx.unary(Prim.TANH, softplus_core(ctx, x))),
}
for _op, _body in _ACTIVATIONS.items():
    aten(f"aten.{_op}.default")(_activation(_body))


@aten("aten.softplus.default")
def softplus(ctx: Lowering, n: AtenNode) -> str:
    """log(1 + exp(beta x)) / beta, and x itself where beta x > threshold (as torch computes it:
    a small threshold makes the switch visible)."""
    x, beta = _x(ctx, n), n["beta"]
    scaled = x if beta == 1 else ctx.elementwise(Prim.MUL, x, _s(ctx, x, beta))
    y = softplus_core(ctx, scaled, exact_tail=True)
    y = y if beta == 1 else ctx.elementwise(Prim.MUL, y, _s(ctx, x, 1.0 / beta))
    linear = ctx.elementwise(Prim.GT, scaled, _s(ctx, x, n["threshold"]))
    return ctx.elementwise(Prim.WHERE, linear, x, y)


@aten("aten.leaky_relu.default")
def leaky_relu(ctx: Lowering, n: AtenNode) -> str:
    return leaky_relu_core(ctx, _x(ctx, n), n["negative_slope"])


@aten("aten.rrelu_with_noise_functional.default", "aten.rrelu_with_noise.default")
def rrelu(ctx: Lowering, n: AtenNode) -> list[str]:
    """RReLU in inference (training mode is refused before lowering): a leaky ReLU with the mean
    of its slope range; the noise tensor comes back unchanged."""
    y = leaky_relu_core(ctx, _x(ctx, n), (n["lower"] + n["upper"]) / 2)
    return [y, n["noise"]] if n.target.endswith("functional.default") else y


@aten("aten.elu.default")
def elu(ctx: Lowering, n: AtenNode) -> str:
    x = _x(ctx, n)
    if n["input_scale"] != 1:
        x = ctx.elementwise(Prim.MUL, x, _s(ctx, x, n["input_scale"]))
    y = elu_core(ctx, x, n["alpha"])
    return y if n["scale"] == 1 else ctx.elementwise(Prim.MUL, y, _s(ctx, y, n["scale"]))


def _clamp(ctx: Lowering, x: str, lo, hi) -> str:
    bounds = [None if v is None else operand(ctx, v, ctx.dtype(x)) for v in (lo, hi)]
    return clip_core(ctx, x, *bounds)


@aten("aten.clamp.default", "aten.clamp.Tensor")
def clamp(ctx: Lowering, n: AtenNode) -> str:
    return _clamp(ctx, _x(ctx, n), n["min"], n["max"])


@aten("aten.clamp_min.default", "aten.clamp_min.Tensor")
def clamp_min(ctx: Lowering, n: AtenNode) -> str:
    return _clamp(ctx, _x(ctx, n), n["min"], None)


@aten("aten.clamp_max.default", "aten.clamp_max.Tensor")
def clamp_max(ctx: Lowering, n: AtenNode) -> str:
    return _clamp(ctx, _x(ctx, n), None, n["max"])


@aten("aten.hardtanh.default")
def hardtanh(ctx: Lowering, n: AtenNode) -> str:
    return _clamp(ctx, _x(ctx, n), n["min_val"], n["max_val"])


@aten("aten._to_copy.default", "aten.clone.default", "aten.alias.default", "aten.lift_fresh_copy.default")
def copy(ctx: Lowering, n: AtenNode) -> str:
    return ctx.cast(n["self"], n.out.dtype)


@aten("aten._assert_tensor_metadata.default", "aten._assert_scalar.default")
def no_op(ctx: Lowering, n: AtenNode) -> None:
    return None


# ----------------------------------------------------------------- reductions


def _dims(ctx: Lowering, x: str, dim) -> tuple[int, ...]:
    """dim=None or [] means every axis, as in torch; a scalar has none."""
    if ctx.rank(x) == 0:
        return ()
    if dim is None or (isinstance(dim, (list, tuple)) and not dim):
        return tuple(range(ctx.rank(x)))
    return normalize_axes(dim if isinstance(dim, (list, tuple)) else [dim], ctx.rank(x))


def _reduce_rule(body):
    def rule(ctx: Lowering, n: AtenNode) -> str:
        x = ctx.cast(n["self"], n.out.dtype)  # sum's dtype argument, bool sums counting in int64
        axes = _dims(ctx, x, n.get("dim"))
        y = body(ctx, x, axes) if axes else x
        return ctx.reshape(y, n.out.shape)  # drops the reduced axes unless keepdim

    return rule


_REDUCTIONS = {
    "sum.dim_IntList": lambda ctx, x, axes: ctx.reduce(Prim.REDUCE_SUM, x, axes),
    "sum.default": lambda ctx, x, axes: ctx.reduce(Prim.REDUCE_SUM, x, axes),
    "mean.dim": lambda ctx, x, axes: ctx.mean(x, axes),
    "mean.default": lambda ctx, x, axes: ctx.mean(x, axes),
    "amax.default": lambda ctx, x, axes: ctx.reduce(Prim.REDUCE_MAX, x, axes),
    "amin.default": lambda ctx, x, axes: ctx.reduce(Prim.REDUCE_MIN, x, axes),
    "max.default": lambda ctx, x, axes: ctx.reduce(Prim.REDUCE_MAX, x, axes),
    "min.default": lambda ctx, x, axes: ctx.reduce(Prim.REDUCE_MIN, x, axes),
    "prod.dim_int": lambda ctx, x, axes: ctx.reduce(Prim.REDUCE_PROD, x, axes),
    "prod.default": lambda ctx, x, axes: ctx.reduce(Prim.REDUCE_PROD, x, axes),
}
for _op, _body in _REDUCTIONS.items():
    aten(f"aten.{_op}")(_reduce_rule(_body))


@aten("aten.argmax.default", "aten.argmin.default")
def argmax(ctx: Lowering, n: AtenNode) -> str:
    x = vector(ctx, n["self"])
    if n["dim"] is None:
        x = ctx.reshape(x, [ctx.type(x).numel])
    (axis,) = _dims(ctx, x, n.get("dim", 0))
    prim = Prim.ARGMAX if n.target.startswith("aten.argmax") else Prim.ARGMIN
    return ctx.reshape(ctx.emit(prim, x, axis=axis), n.out.shape)


@aten("aten.max.dim", "aten.min.dim")
def max_dim(ctx: Lowering, n: AtenNode) -> list[str]:
    x = vector(ctx, n["self"])
    x = ctx.cast(x, "int32") if ctx.dtype(x) == "bool" else x  # (torch's argmax refuses bools)
    (axis,) = _dims(ctx, x, n["dim"])
    is_max = n.target.startswith("aten.max")
    values = ctx.reduce(Prim.REDUCE_MAX if is_max else Prim.REDUCE_MIN, x, [axis])
    index = ctx.emit(Prim.ARGMAX if is_max else Prim.ARGMIN, x, axis=axis)
    values = ctx.cast(ctx.reshape(values, n.out_types[0].shape), n.out_types[0].dtype)
    return [values, ctx.reshape(index, n.out_types[1].shape)]


@aten("aten.var.correction", "aten.var_mean.correction")
def var(ctx: Lowering, n: AtenNode) -> str | list[str]:
    x = n["self"]
    axes = _dims(ctx, x, n["dim"])
    mean = ctx.mean(x, axes)
    centered = ctx.elementwise(Prim.SUB, x, mean)
    total = ctx.reduce(Prim.REDUCE_SUM, ctx.elementwise(Prim.MUL, centered, centered), axes)
    count = math.prod(ctx.shape(x)[a] for a in axes)
    correction = 1 if n["correction"] is None else n["correction"]
    scale = 1.0 / max(count - correction, 0) if count > correction else float("inf")
    variance = ctx.reshape(ctx.elementwise(Prim.MUL, total, _s(ctx, x, scale)), n.out.shape)
    return [variance, ctx.reshape(mean, n.out.shape)] if "var_mean" in n.target else variance


@aten("aten.linalg_vector_norm.default")
def vector_norm(ctx: Lowering, n: AtenNode) -> str:
    x = ctx.cast(n["self"], n.out.dtype)
    return ctx.reshape(vector_norm_core(ctx, x, _dims(ctx, x, n.get("dim")), float(n["ord"])), n.out.shape)


def vector_norm_core(ctx: Lowering, x: str, axes, order: float) -> str:
    """(sum |x|^p)^(1/p) over axes (kept), with torch's special orders: 0 counts the nonzeros, inf
    and -inf are the largest and smallest |x|."""
    size = ctx.unary(Prim.ABS, x)
    if order == math.inf or order == -math.inf:
        return ctx.reduce(Prim.REDUCE_MAX if order > 0 else Prim.REDUCE_MIN, size, axes)
    if order == 0:
        nonzero = ctx.unary(Prim.NOT, ctx.elementwise(Prim.EQ, x, _s(ctx, x, 0)))
        return ctx.reduce(Prim.REDUCE_SUM, ctx.cast(nonzero, ctx.dtype(x)), axes)
    if order == 1:
        return ctx.reduce(Prim.REDUCE_SUM, size, axes)
    if order == 2:
        return ctx.unary(Prim.SQRT, ctx.reduce(Prim.REDUCE_SUM, ctx.elementwise(Prim.MUL, x, x), axes))
    powered = ctx.elementwise(Prim.POW, size, _s(ctx, x, order))
    return ctx.elementwise(Prim.POW, ctx.reduce(Prim.REDUCE_SUM, powered, axes), _s(ctx, x, 1 / order))


@aten(*(f"aten.{op}.{overload}" for op in ("any", "all") for overload in ("default", "dim", "dims")))
def any_all(ctx: Lowering, n: AtenNode) -> str:
    """Whether any (all) element is nonzero: the max (min) of the elements as bools."""
    nonzero = ctx.cast(n["self"], "bool")
    prim = Prim.REDUCE_MAX if n.target.startswith("aten.any") else Prim.REDUCE_MIN
    return ctx.reshape(ctx.reduce(prim, nonzero, _dims(ctx, nonzero, n.get("dim"))), n.out.shape)


@aten("aten.cumsum.default")
def cumsum(ctx: Lowering, n: AtenNode) -> str:
    x = vector(ctx, ctx.cast(n["self"], n.out.dtype))
    return ctx.reshape(cumsum_core(ctx, x, n["dim"]), n.out.shape)


# ------------------------------------------------------- softmax and the norms


@aten("aten._softmax.default", "aten._log_softmax.default", "aten.softmax.int", "aten.log_softmax.int")
def softmax_rule(ctx: Lowering, n: AtenNode) -> str:
    x = vector(ctx, ctx.cast(n["self"], n.out.dtype))
    (axis,) = normalize_axes([n["dim"]], ctx.rank(x))
    return ctx.reshape(softmax(ctx, x, axis, log="log_softmax" in n.target), n.out.shape)


def _affine(ctx: Lowering, y: str, weight, bias, channel_rank: int | None = None) -> str:
    """y * weight + bias, per channel when channel_rank is given; either may be absent."""
    if weight is not None:
        w = channel_param(ctx, weight, channel_rank) if channel_rank else weight
        y = ctx.elementwise(Prim.MUL, y, w)
    if bias is not None:
        b = channel_param(ctx, bias, channel_rank) if channel_rank else bias
        y = ctx.elementwise(Prim.ADD, y, b)
    return y


def _normalize_as_torch(ctx: Lowering, n: AtenNode, x: str, axes) -> tuple[str, str, str]:
    """normalize in the dtype torch gives the statistics: a CPU's bfloat16 and float16 keep the
    input's, a GPU's are float32 (the normalized values rounded back to the input's dtype once)."""
    stats = n.out_types[1]
    stash = stats.dtype if stats is not None else ctx.dtype(x)
    y, mean, inv_std = normalize(ctx, ctx.cast(x, stash), axes, n["eps"])
    return ctx.cast(y, ctx.dtype(x)), mean, inv_std


@aten("aten.native_layer_norm.default")
def layer_norm(ctx: Lowering, n: AtenNode) -> list[str]:
    x = n["input"]
    rank = ctx.rank(x)
    axes = range(rank - len(n["normalized_shape"]), rank)
    y, mean, inv_std = _normalize_as_torch(ctx, n, x, axes)
    return [_affine(ctx, y, n["weight"], n["bias"]), mean, inv_std]


@aten("aten._native_batch_norm_legit_no_training.default")
def batch_norm(ctx: Lowering, n: AtenNode) -> list[str | None]:
    x = n["input"]
    channels = ctx.shape(x)[1]
    ones, zeros = np.ones(channels, ctx.dtype(x)), np.zeros(channels, ctx.dtype(x))
    weight = n["weight"] if n["weight"] is not None else ctx.const(ones)
    bias = n["bias"] if n["bias"] is not None else ctx.const(zeros)
    stats = (weight, bias, n["running_mean"], n["running_var"])
    y = _fold_into_conv(ctx, n, *stats) or batch_norm_core(ctx, x, *stats, n["eps"])
    return [y, None, None]


def _fold_into_conv(ctx: Lowering, n: AtenNode, weight, bias, mean, var) -> str | None:
    """conv -> inference batch norm, all parameters constant and the conv read by nothing else:
    one conv with scaled weights and a new bias (what ONNX exporters do before korch sees it)."""
    conv = getattr(ctx, "convs", {}).get(n["input"])
    if conv is None or n.fx is None or len(n.fx.args[0].users) != 1:
        return None
    x, w, conv_bias, attrs = conv
    values = [ctx.const_value(v) for v in (w, weight, bias, mean, var)]
    if any(v is None for v in values) or (conv_bias is not None and ctx.const_value(conv_bias) is None):
        return None
    w_v, gamma, beta, mean_v, var_v = (v.astype("float64") for v in values)
    scale = gamma / np.sqrt(var_v + n["eps"])
    b0 = ctx.const_value(conv_bias).astype("float64") if conv_bias is not None else 0.0
    dtype = ctx.dtype(x)
    new_w = ctx.const((w_v * scale.reshape(-1, *([1] * (w_v.ndim - 1)))).astype(dtype))
    y = ctx.emit(Prim.CONV, x, new_w, **attrs)
    return add_bias(ctx, y, ctx.const(((b0 - mean_v) * scale + beta).astype(dtype)))


@aten("aten._native_batch_norm_legit.no_stats", "aten._native_batch_norm_legit.default")
def batch_norm_batch_stats(ctx: Lowering, n: AtenNode) -> list[str | None]:
    """Normalization with the batch's own statistics (instance norm is exported this way)."""
    if n.target.endswith(".default") and not n["training"]:
        return batch_norm(ctx, n)
    x = n["input"]
    rank = ctx.rank(x)
    y, _, _ = normalize(ctx, x, [0, *range(2, rank)], n["eps"])
    return [_affine(ctx, y, n["weight"], n["bias"], rank), None, None]


@aten("aten.native_group_norm.default")
def group_norm(ctx: Lowering, n: AtenNode) -> list[str | None]:
    x, groups = n["input"], n["group"]
    shape = ctx.shape(x)
    grouped = ctx.reshape(x, (shape[0], groups, math.prod(shape[1:]) // groups))
    y, mean, inv_std = _normalize_as_torch(ctx, n, grouped, [2])
    y = _affine(ctx, ctx.reshape(y, shape), n["weight"], n["bias"], len(shape))
    return [y, ctx.reshape(mean, n.out_types[1].shape), ctx.reshape(inv_std, n.out_types[2].shape)]
