"""Fission rules for reductions and the operators built on them: softmax and the normalizations."""

from __future__ import annotations

import math

import numpy as np

from korch.frontend.lowering import Lowering, OnnxNode, fission, normalize_axes
from korch.frontend.ops.layout import gather_elements_core
from korch.frontend.ops.reduce import (
    batch_norm_core,
    channel_param,
    cumsum_core,
    normalize,
    scan_core,
    softmax,
)
from korch.ir.prims import Prim, is_float


def _reduce_axes(ctx: Lowering, n: OnnxNode) -> tuple[int, ...] | None:
    """Axes from the input (newer opsets) or the attribute; None means 'leave the input alone'."""
    x = n.inputs[0]
    axes = ctx.ints(n.input(1), "reduction axes")
    if axes is None:
        axes = n.attrs.get("axes")
    if not axes:
        if n.attr("noop_with_empty_axes", 0):
            return None
        axes = range(ctx.rank(x))
    return normalize_axes(axes, ctx.rank(x))


def _reduce_rule(body):
    def rule(ctx: Lowering, n: OnnxNode) -> list[str]:
        x = n.inputs[0]
        axes = _reduce_axes(ctx, n)
        if axes is None:
            return [x]
        y = body(ctx, x, axes)
        if n.attr("keepdims", 1):
            return [y]
        return [ctx.reshape(y, [d for i, d in enumerate(ctx.shape(x)) if i not in axes])]

    return rule


def _sum(ctx, x, axes):
    return ctx.reduce(Prim.REDUCE_SUM, x, axes)


def _mean(ctx, x, axes):
    if is_float(ctx.dtype(x)):
        return ctx.mean(x, axes)
    count = math.prod(ctx.shape(x)[a] for a in axes)
    return ctx.elementwise(Prim.DIV, _sum(ctx, x, axes), ctx.scalar(count, ctx.dtype(x)))


def _log_sum_exp(ctx, x, axes):
    m = ctx.reduce(Prim.REDUCE_MAX, x, axes)
    # an infinite maximum is not subtracted: -inf - -inf would be NaN where ONNX Runtime gives -inf
    finite = ctx.elementwise(Prim.LT, ctx.unary(Prim.ABS, m), ctx.scalar(np.inf, ctx.dtype(x)))
    m = ctx.elementwise(Prim.WHERE, finite, m, ctx.scalar(0, ctx.dtype(x)))
    shifted = ctx.unary(Prim.EXP, ctx.elementwise(Prim.SUB, x, m))
    return ctx.elementwise(Prim.ADD, ctx.unary(Prim.LOG, _sum(ctx, shifted, axes)), m)


_REDUCTIONS = {
    "ReduceSum": _sum,
    "ReduceMean": _mean,
    "ReduceMax": lambda ctx, x, axes: ctx.reduce(Prim.REDUCE_MAX, x, axes),
    "ReduceMin": lambda ctx, x, axes: ctx.reduce(Prim.REDUCE_MIN, x, axes),
    "ReduceProd": lambda ctx, x, axes: ctx.reduce(Prim.REDUCE_PROD, x, axes),
    "ReduceL1": lambda ctx, x, axes: _sum(ctx, ctx.unary(Prim.ABS, x), axes),
    "ReduceL2": lambda ctx, x, axes: ctx.unary(Prim.SQRT, _sum(ctx, ctx.elementwise(Prim.MUL, x, x), axes)),
    "ReduceSumSquare": lambda ctx, x, axes: _sum(ctx, ctx.elementwise(Prim.MUL, x, x), axes),
    "ReduceLogSum": lambda ctx, x, axes: ctx.unary(Prim.LOG, _sum(ctx, x, axes)),
    "ReduceLogSumExp": _log_sum_exp,
}
for _op, _body in _REDUCTIONS.items():
    fission(_op, 1)(_reduce_rule(_body))


def _arg_rule(prim: Prim):
    def rule(ctx: Lowering, n: OnnxNode) -> list[str]:
        x = n.inputs[0]
        (axis,) = normalize_axes([n.attr("axis", 0)], ctx.rank(x))
        if n.attr("select_last_index", 0):  # the first of x reversed along the axis, counted from the end
            size = ctx.shape(x)[axis]
            reversed_x = ctx.emit(Prim.GATHER, x, ctx.const(np.arange(size - 1, -1, -1)), axis=axis)
            y = ctx.elementwise(
                Prim.SUB, ctx.scalar(size - 1, "int64"), ctx.emit(prim, reversed_x, axis=axis)
            )
        else:
            y = ctx.emit(prim, x, axis=axis)
        if n.attr("keepdims", 1):
            return [y]
        return [ctx.reshape(y, [d for i, d in enumerate(ctx.shape(x)) if i != axis])]

    return rule


fission("ArgMax", 1)(_arg_rule(Prim.ARGMAX))
fission("ArgMin", 1)(_arg_rule(Prim.ARGMIN))


# -------------------------------------------------------------------- softmax


def softmax_as_of(ctx: Lowering, n: OnnxNode, x: str, log: bool, coerce_2d: bool) -> str:
    """Softmax over the node's axis; `coerce_2d` (before opset 13): over x flattened to 2D at the
    axis (1 by default), normalised over the tail."""
    shape = ctx.shape(x)
    (axis,) = normalize_axes([n.attr("axis", 1 if coerce_2d else -1)], len(shape))
    if not coerce_2d:
        return softmax(ctx, x, axis, log)
    flat = ctx.reshape(x, (math.prod(shape[:axis]), math.prod(shape[axis:])))
    return ctx.reshape(softmax(ctx, flat, 1, log), shape)


def _softmax_rule(log: bool, coerce_2d: bool):
    def rule(ctx: Lowering, n: OnnxNode) -> list[str]:
        return [softmax_as_of(ctx, n, n.inputs[0], log, coerce_2d)]

    return rule


fission("Softmax", 1)(_softmax_rule(log=False, coerce_2d=True))
fission("Softmax", 13)(_softmax_rule(log=False, coerce_2d=False))
fission("LogSoftmax", 1)(_softmax_rule(log=True, coerce_2d=True))
fission("LogSoftmax", 13)(_softmax_rule(log=True, coerce_2d=False))


def hardmax(ctx: Lowering, x: str, axis: int) -> str:
    """1 at the first maximum along axis (argmax picks the first of ties, as ONNX Runtime does), else 0."""
    shape = ctx.shape(x)
    index = ctx.emit(Prim.ARGMAX, x, axis=axis)
    positions = np.arange(shape[axis], dtype="int64")
    positions = positions.reshape([-1 if i == axis else 1 for i in range(len(shape))])
    return ctx.cast(ctx.elementwise(Prim.EQ, index, ctx.const(positions)), ctx.dtype(x))


def _hardmax_rule(coerce_2d: bool):
    def rule(ctx: Lowering, n: OnnxNode) -> list[str]:
        x = n.inputs[0]
        shape = ctx.shape(x)
        (axis,) = normalize_axes([n.attr("axis", 1 if coerce_2d else -1)], len(shape))
        if not coerce_2d:
            return [hardmax(ctx, x, axis)]
        # before opset 13 the input is flattened to 2D at `axis` and one row's maximum wins
        flat = ctx.reshape(x, (math.prod(shape[:axis]), math.prod(shape[axis:])))
        return [ctx.reshape(hardmax(ctx, flat, 1), shape)]

    return rule


fission("Hardmax", 1, 11)(_hardmax_rule(coerce_2d=True))
fission("Hardmax", 13)(_hardmax_rule(coerce_2d=False))


# ------------------------------------------------------------- normalizations


@fission("LayerNormalization", 17)
def layer_norm(ctx: Lowering, n: OnnxNode) -> list[str]:
    x, scale, bias = n.inputs[0], n.inputs[1], n.input(2)
    dtype = ctx.dtype(x)
    stash = "float32" if n.attr("stash_type", 1) == 1 else dtype
    rank = ctx.rank(x)
    axis = normalize_axes([n.attr("axis", -1)], rank)[0]
    axes = list(range(axis, rank))
    y, mean, inv_std = normalize(ctx, ctx.cast(x, stash), axes, n.attr("epsilon", 1e-5))
    y = ctx.cast(y, dtype)
    y = ctx.elementwise(Prim.MUL, y, scale)
    if bias is not None:
        y = ctx.elementwise(Prim.ADD, y, bias)
    return [y, mean, inv_std][: n.n_outputs]


@fission("InstanceNormalization", 1)
def instance_norm(ctx: Lowering, n: OnnxNode) -> list[str]:
    x, scale, bias = n.inputs[:3]
    rank = ctx.rank(x)
    y, _, _ = normalize(ctx, x, range(2, rank), n.attr("epsilon", 1e-5))
    y = ctx.elementwise(Prim.MUL, y, channel_param(ctx, scale, rank))
    return [ctx.elementwise(Prim.ADD, y, channel_param(ctx, bias, rank))]


def _group_norm_rule(per_channel: bool):
    def rule(ctx: Lowering, n: OnnxNode) -> list[str]:
        x, scale, bias = n.inputs[:3]
        shape = ctx.shape(x)
        dtype = ctx.dtype(x)
        groups = n.attr("num_groups")
        if shape[1] % groups:
            ctx.unsupported(f"{shape[1]} channels do not split into {groups} groups")
        stash = "float32" if n.attr("stash_type", 1) == 1 else dtype
        grouped = ctx.reshape(ctx.cast(x, stash), (shape[0], groups, math.prod(shape[1:]) // groups))
        y, _, _ = normalize(ctx, grouped, [2], n.attr("epsilon", 1e-5))
        y = ctx.reshape(ctx.cast(y, dtype), shape)
        if not per_channel:
            # opset 18: one scale/bias per group, repeated over that group's channels
            per_group = (groups, shape[1] // groups)
            scale = ctx.reshape(ctx.broadcast_to(ctx.reshape(scale, (groups, 1)), per_group), [shape[1]])
            bias = ctx.reshape(ctx.broadcast_to(ctx.reshape(bias, (groups, 1)), per_group), [shape[1]])
        y = ctx.elementwise(Prim.MUL, y, channel_param(ctx, scale, len(shape)))
        return [ctx.elementwise(Prim.ADD, y, channel_param(ctx, bias, len(shape)))]

    return rule


fission("GroupNormalization", 18)(_group_norm_rule(per_channel=False))
fission("GroupNormalization", 21)(_group_norm_rule(per_channel=True))


@fission("MeanVarianceNormalization", 9, 13)
def mean_variance_norm(ctx: Lowering, n: OnnxNode) -> list[str]:
    """(x - mean) / (sqrt(var) + 1e-9), the variance taken of the centred values (see normalize).

    ONNX Runtime (1.32) takes it as E[x^2] - E[x]^2, which cancels: on a constant input it gives NaN
    where this gives 0, and on inputs with a large mean relative to their spread it loses digits."""
    x, out_dtype = ctx.widened(n.inputs[0])
    axes = normalize_axes(n.attr("axes", [0, 2, 3]), ctx.rank(x))
    dtype = ctx.dtype(x)
    centered = ctx.elementwise(Prim.SUB, x, ctx.mean(x, axes))
    var = ctx.mean(ctx.elementwise(Prim.MUL, centered, centered), axes)
    std = ctx.elementwise(Prim.ADD, ctx.unary(Prim.SQRT, var), ctx.scalar(1e-9, dtype))
    return [ctx.cast(ctx.elementwise(Prim.MUL, centered, ctx.unary(Prim.RECIPROCAL, std)), out_dtype)]


@fission("LpNormalization", 1)
def lp_norm(ctx: Lowering, n: OnnxNode) -> list[str]:
    """x / ||x||_p along one axis; a slice whose norm is zero gives zeros (ONNX Runtime and opset 22)."""
    x = n.inputs[0]
    p = n.attr("p", 2)
    if p not in (1, 2):
        ctx.unsupported(f"LpNormalization with p={p}")
    (axis,) = normalize_axes([n.attr("axis", -1)], ctx.rank(x))
    x, out_dtype = ctx.widened(x)
    dtype = ctx.dtype(x)
    if p == 1:
        norm = ctx.reduce(Prim.REDUCE_SUM, ctx.unary(Prim.ABS, x), [axis])
    else:
        norm = ctx.unary(Prim.SQRT, ctx.reduce(Prim.REDUCE_SUM, ctx.elementwise(Prim.MUL, x, x), [axis]))
    zero = ctx.elementwise(Prim.EQ, norm, ctx.scalar(0, dtype))
    safe = ctx.elementwise(Prim.WHERE, zero, ctx.scalar(1, dtype), norm)
    y = ctx.elementwise(Prim.DIV, x, safe)
    return [ctx.cast(ctx.elementwise(Prim.WHERE, zero, ctx.scalar(0, dtype), y), out_dtype)]


@fission("RMSNormalization", 23)
def rms_norm(ctx: Lowering, n: OnnxNode) -> list[str]:
    """x / sqrt(mean(x^2) + eps) * scale over axes [axis, rank), in float32 or float64.

    As in ONNX Runtime (1.32), whatever stash_type says: float16 is computed in float32, float64 in
    float64, and the scale is applied before the one cast back (the spec's function casts before the
    multiply and honours stash_type=0; for float16 either differs from ONNX Runtime by a rounding)."""
    x, scale = n.inputs[0], n.inputs[1]
    n.attr("stash_type", 1)  # looked at, and set aside (see above)
    axis = normalize_axes([n.attr("axis", -1)], ctx.rank(x))[0]
    return list(rms_core(ctx, x, scale, axis, n.attr("epsilon", 1e-5)))  # (y; 1/rms for ONNX Runtime's)


def rms_core(ctx: Lowering, x: str, scale: str, axis: int, epsilon: float) -> tuple[str, str]:
    """RMSNormalization's y (see rms_norm) and 1/rms (in float32 or float64, keeping the axes)."""
    stash = "float64" if ctx.dtype(x) == "float64" else "float32"
    xs = ctx.cast(x, stash)
    mean_square = ctx.mean(ctx.elementwise(Prim.MUL, xs, xs), range(axis, ctx.rank(x)))
    mean_square = ctx.elementwise(Prim.ADD, mean_square, ctx.scalar(epsilon, stash))
    inv_rms = ctx.unary(Prim.RECIPROCAL, ctx.unary(Prim.SQRT, mean_square))
    y = ctx.elementwise(Prim.MUL, ctx.elementwise(Prim.MUL, xs, inv_rms), ctx.cast(scale, stash))
    return ctx.cast(y, ctx.dtype(scale)), inv_rms


@fission("LRN", 1, 13)
def lrn(ctx: Lowering, n: OnnxNode) -> list[str]:
    """x / (bias + alpha / size * square_sum) ^ beta, square_sum over a window of `size` channels.

    The channel window is a pooling window: pad the squares with zeros along C, view [N, C', P] with
    the spatial axes flattened, take windows of [size, 1] and sum them."""
    x = n.inputs[0]
    shape = ctx.shape(x)
    if len(shape) < 3:
        ctx.unsupported(f"LRN of a rank-{len(shape)} input")
    size = int(n.attr("size"))
    x, out_dtype = ctx.widened(x)
    dtype = ctx.dtype(x)
    before = (size - 1) // 2
    after = size - 1 - before
    squares = ctx.elementwise(Prim.MUL, x, x)
    pads = [0] * len(shape) * 2
    pads[1], pads[len(shape) + 1] = before, after
    if before or after:
        squares = ctx.emit(Prim.PAD, squares, pads=pads, mode="constant", value=0.0)
    flat = ctx.reshape(squares, (shape[0], shape[1] + size - 1, math.prod(shape[2:])))
    windows = ctx.emit(Prim.WINDOW, flat, kernel=[size, 1], strides=[1, 1], dilations=[1, 1])
    square_sum = ctx.reshape(ctx.reduce(Prim.REDUCE_SUM, windows, [3, 4], keepdims=False), shape)
    scaled = ctx.elementwise(Prim.MUL, square_sum, ctx.scalar(n.attr("alpha", 1e-4) / size, dtype))
    base = ctx.elementwise(Prim.ADD, scaled, ctx.scalar(n.attr("bias", 1.0), dtype))
    denominator = ctx.elementwise(Prim.POW, base, ctx.scalar(n.attr("beta", 0.75), dtype))
    return [ctx.cast(ctx.elementwise(Prim.DIV, x, denominator), out_dtype)]


@fission("BatchNormalization", 1)
def batch_norm(ctx: Lowering, n: OnnxNode) -> list[str]:
    if n.attr("training_mode", 0) or n.n_outputs > 1:
        ctx.unsupported("training-mode BatchNormalization")
    n.attr("momentum", None)  # looked at, and set aside: it updates the running statistics in training
    x, scale, bias, mean, var = n.inputs[:5]
    return [batch_norm_core(ctx, x, scale, bias, mean, var, n.attr("epsilon", 1e-5), n.attr("spatial", 1))]


@fission("GlobalAveragePool", 1)
def global_average_pool(ctx: Lowering, n: OnnxNode) -> list[str]:
    x = n.inputs[0]
    return [ctx.mean(x, range(2, ctx.rank(x)))]


@fission("GlobalMaxPool", 1)
def global_max_pool(ctx: Lowering, n: OnnxNode) -> list[str]:
    x = n.inputs[0]
    return [ctx.reduce(Prim.REDUCE_MAX, x, range(2, ctx.rank(x)))]


@fission("CumSum", 11)
def cumsum(ctx: Lowering, n: OnnxNode) -> list[str]:
    """A prefix sum along one axis as a matmul with a triangular 0/1 matrix (a linear primitive)."""
    x = n.inputs[0]
    (axis,) = ctx.ints(n.inputs[1], "CumSum axis")
    return [cumsum_core(ctx, x, axis, bool(n.attr("reverse", 0)), bool(n.attr("exclusive", 0)))]


@fission("CumProd", 26)
def cumprod(ctx: Lowering, n: OnnxNode) -> list[str]:
    x = n.inputs[0]
    (axis,) = ctx.ints(n.inputs[1], "CumProd axis")
    reverse, exclusive = bool(n.attr("reverse", 0)), bool(n.attr("exclusive", 0))
    return [scan_core(ctx, x, axis, Prim.MUL, 1, reverse, exclusive)]


# ---------------------------------------------------------------------- losses


def nll_loss(ctx: Lowering, n: OnnxNode, log_prob: str) -> str:
    """-log_prob[n, target[n, ...], ...] * weight[target], 0 where target is ignore_index; reduced
    by sum, or by mean: the sum over the weights of the targets not ignored."""
    target, weight = n.inputs[1], n.input(2)
    shape, dtype = ctx.shape(target), ctx.dtype(log_prob)
    reduction = n.attr("reduction", "mean")
    if reduction not in ("none", "sum", "mean"):
        ctx.unsupported(f"{n.op_type} reduction {reduction}")
    ignore = n.attr("ignore_index", None)
    kept = None
    if ignore is not None:
        kept = ctx.elementwise(
            Prim.NOT, ctx.elementwise(Prim.EQ, target, ctx.scalar(ignore, ctx.dtype(target)))
        )
        target = ctx.elementwise(Prim.WHERE, kept, target, ctx.scalar(0, ctx.dtype(target)))  # (in range)
    index = ctx.reshape(target, (shape[0], 1, *shape[1:]))
    picked = ctx.reshape(gather_elements_core(ctx, log_prob, index, 1), shape)
    w = ctx.emit(Prim.GATHER, weight, target, axis=0) if weight else None
    if kept is not None:
        mask = ctx.cast(kept, dtype)
        w = mask if w is None else ctx.elementwise(Prim.MUL, w, mask)
    loss = ctx.unary(Prim.NEG, picked if w is None else ctx.elementwise(Prim.MUL, picked, w))
    axes = list(range(len(shape)))
    if reduction == "none":
        return loss
    total = ctx.reduce(Prim.REDUCE_SUM, loss, axes, keepdims=False)
    if reduction == "sum":
        return total
    if w is None:
        return ctx.elementwise(Prim.DIV, total, ctx.scalar(math.prod(shape), dtype))
    return ctx.elementwise(Prim.DIV, total, ctx.reduce(Prim.REDUCE_SUM, w, axes, keepdims=False))


@fission("NegativeLogLikelihoodLoss", 12, 13, 22)
def negative_log_likelihood_loss(ctx: Lowering, n: OnnxNode) -> list[str]:
    return [nll_loss(ctx, n, n.inputs[0])]


@fission("SoftmaxCrossEntropyLoss", 12, 13)
def softmax_cross_entropy_loss(ctx: Lowering, n: OnnxNode) -> list[str]:
    """NegativeLogLikelihoodLoss of log_softmax over the classes (axis 1); the log-probabilities
    are the second output."""
    log_prob = softmax(ctx, n.inputs[0], 1, log=True)
    return [nll_loss(ctx, n, log_prob), log_prob]
