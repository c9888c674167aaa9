"""Reduction builders: softmax, normalization over axes, inference batch normalization, and the
running sums and scans along an axis."""

from __future__ import annotations

import numpy as np

from korch.frontend.lowering import Lowering, normalize_axes
from korch.frontend.ops.linear import matmul
from korch.ir.prims import Prim


def softmax(ctx: Lowering, x: str, axis: int, log: bool) -> str:
    """Max-subtracted so exp never sees large positive arguments."""
    m = ctx.reduce(Prim.REDUCE_MAX, x, [axis])
    shifted = ctx.elementwise(Prim.SUB, x, m)
    e = ctx.unary(Prim.EXP, shifted)
    s = ctx.reduce(Prim.REDUCE_SUM, e, [axis])
    if log:
        return ctx.elementwise(Prim.SUB, shifted, ctx.unary(Prim.LOG, s))
    return ctx.elementwise(Prim.DIV, e, s)


def normalize(ctx: Lowering, x: str, axes, eps: float) -> tuple[str, str, str]:
    """(x - mean) * rsqrt(var + eps) over axes; also returns mean and the inverse std-dev."""
    mean = ctx.mean(x, axes)
    centered = ctx.elementwise(Prim.SUB, x, mean)
    var = ctx.mean(ctx.elementwise(Prim.MUL, centered, centered), axes)
    var_eps = ctx.elementwise(Prim.ADD, var, ctx.scalar(eps, ctx.dtype(x)))
    inv_std = ctx.unary(Prim.RECIPROCAL, ctx.unary(Prim.SQRT, var_eps))
    return ctx.elementwise(Prim.MUL, centered, inv_std), mean, inv_std


def channel_param(ctx: Lowering, p: str, rank: int) -> str:
    """A per-channel [C] vector shaped [C, 1, ...] to broadcast against [N, C, *spatial]."""
    return ctx.reshape(p, (ctx.shape(p)[0],) + (1,) * (rank - 2))


def batch_norm_core(ctx: Lowering, x, scale, bias, mean, var, epsilon: float, spatial=True) -> str:
    """Inference batch normalization with running statistics."""
    rank = ctx.rank(x)
    # y = x * a + b with a = scale / sqrt(var + eps), b = bias - mean * a (folded when constant)
    eps = ctx.scalar(epsilon, ctx.dtype(var))
    inv_std = ctx.unary(Prim.RECIPROCAL, ctx.unary(Prim.SQRT, ctx.elementwise(Prim.ADD, var, eps)))
    a = ctx.elementwise(Prim.MUL, ctx.cast(scale, ctx.dtype(var)), inv_std)
    b = ctx.elementwise(Prim.SUB, ctx.cast(bias, ctx.dtype(var)), ctx.elementwise(Prim.MUL, mean, a))
    a, b = ctx.cast(a, ctx.dtype(x)), ctx.cast(b, ctx.dtype(x))  # opset 15 allows float32 statistics
    # parameters are per channel ([C]), or per channel and position with spatial=0 (opsets < 9)
    if rank > 2 and spatial:
        a, b = channel_param(ctx, a, rank), channel_param(ctx, b, rank)
    return ctx.elementwise(Prim.ADD, ctx.elementwise(Prim.MUL, x, a), b)


def cumsum_core(ctx: Lowering, x: str, axis: int, reverse: bool = False, exclusive: bool = False) -> str:
    rank = ctx.rank(x)
    (axis,) = normalize_axes([axis], rank)
    length = ctx.shape(x)[axis]
    i, j = np.meshgrid(np.arange(length), np.arange(length), indexing="ij")
    keep = (i >= j) if reverse else (i <= j)  # row i (source) feeds column j (target)
    if exclusive:
        keep &= i != j
    perm = [a for a in range(rank) if a != axis] + [axis]
    moved = ctx.transpose(x, perm)
    y = matmul(ctx, moved, ctx.const(keep.astype(ctx.dtype(x))))
    return ctx.transpose(y, np.argsort(perm))


def scan_core(
    ctx: Lowering, x: str, axis: int, combine, identity, reverse: bool = False, exclusive: bool = False
) -> str:
    """A running product (or any associative step: an elementwise prim, or a function (ctx, a, b)
    of its own) along axis in log2(length) steps: each combines every element with the one `shift`
    places before it (identity where there is none), shift doubling (Hillis and Steele). No
    triangular matmul, so zeros and signs stay exact."""
    rank = ctx.rank(x)
    (axis,) = normalize_axes([axis], rank)
    length = ctx.shape(x)[axis]

    def shifted(v: str, shift: int) -> str:
        kept = ctx.slice_axis(v, axis, 0 if not reverse else shift, length - shift)
        pads = [0] * (2 * rank)
        pads[axis + (rank if reverse else 0)] = shift
        return ctx.emit(Prim.PAD, kept, pads=tuple(pads), mode="constant", value=identity)

    y, shift = x, 1
    while shift < length:
        before = shifted(y, shift)
        y = combine(ctx, y, before) if callable(combine) else ctx.elementwise(combine, y, before)
        shift *= 2
    return shifted(y, 1) if exclusive and length else y
