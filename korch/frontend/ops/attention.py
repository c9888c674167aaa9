"""Attention builders: softmax(q k^T * scale + bias) v with its masks as additive biases (a band
of allowed key distances, booleans), and key/value heads repeated for grouped-query attention."""

from __future__ import annotations

import math

import numpy as np

from korch.frontend.lowering import Lowering
from korch.frontend.ops.linear import matmul
from korch.frontend.ops.reduce import softmax
from korch.ir.prims import Prim


def repeat_heads(ctx: Lowering, x: str, times: int) -> str:
    """Each head (axis -3) `times` times in a row ([h0, h0, h1, h1, ...]: grouped-query
    attention)."""
    if times == 1:
        return x
    *lead, h, s, d = ctx.shape(x)
    wide = ctx.broadcast_to(ctx.reshape(x, (*lead, h, 1, s, d)), (*lead, h, times, s, d))
    return ctx.reshape(wide, (*lead, h * times, s, d))


def allowed_bias(ctx: Lowering, allowed: str, dtype: str) -> str:
    """Where a query may attend a key (booleans) as an additive bias: 0 there, -inf elsewhere."""
    return ctx.elementwise(Prim.WHERE, allowed, ctx.scalar(0, dtype), ctx.scalar(-math.inf, dtype))


def band_bias(
    ctx: Lowering, q_len: int, kv_len: int, offset, low: int | None, high: int | None, dtype: str
) -> str:
    """An additive bias [q, kv] (or [batch, 1, q, kv]) letting query i attend key j where
    low <= (i + offset) - j <= high (None: no bound); offset an int or a [batch, 1, 1, 1] value."""
    diff = np.arange(q_len)[:, None] - np.arange(kv_len)[None, :]
    if isinstance(offset, int):
        d = diff + offset
        allowed = np.ones(d.shape, bool)
        if low is not None:
            allowed &= d >= low
        if high is not None:
            allowed &= d <= high
        return ctx.const(np.where(allowed, 0, -np.inf).astype(dtype))
    d = ctx.elementwise(Prim.ADD, ctx.const(diff), offset)
    tests = []
    if low is not None:
        tests.append(ctx.unary(Prim.NOT, ctx.elementwise(Prim.LT, d, ctx.scalar(low, "int64"))))
    if high is not None:
        tests.append(ctx.unary(Prim.NOT, ctx.elementwise(Prim.GT, d, ctx.scalar(high, "int64"))))
    allowed = tests[0] if len(tests) == 1 else ctx.elementwise(Prim.AND, *tests)
    return allowed_bias(ctx, allowed, dtype)


def attend(
    ctx: Lowering,
    q: str,
    k: str,
    v: str,
    bias: str | None,
    masked: bool,
    scale: float | None = None,
    softcap: float = 0.0,
    precision: str | None = None,
    sink: str | None = None,
) -> tuple[str, tuple[str, str, str, str]]:
    """softmax(q k^T * scale + bias) v over [..., seq, size] tensors (k and v with q's heads;
    scale 1/sqrt(size) by default), both sides scaled by sqrt(scale) in the inputs' type, as
    ONNX's function and torch's math path do. With `masked` (a bias from a mask that may hide
    every key from a query), such a query gets zeros, not 0/0. A `sink` [heads] is one more
    score per head that takes its share of the softmax but has no value. Returns y and the
    scores as scaled, capped and biased, and the probabilities."""
    dtype, rank = ctx.dtype(q), ctx.rank(q)
    root = ctx.scalar(math.sqrt(scale if scale is not None else 1 / math.sqrt(ctx.shape(q)[-1])), dtype)
    swap = list(range(rank - 2)) + [rank - 1, rank - 2]
    raw = matmul(
        ctx, ctx.elementwise(Prim.MUL, q, root), ctx.elementwise(Prim.MUL, ctx.transpose(k, swap), root)
    )
    capped = raw
    if softcap > 0:  # before the mask, so masked scores stay -inf
        cap = ctx.scalar(softcap, dtype)
        capped = ctx.elementwise(Prim.MUL, ctx.unary(Prim.TANH, ctx.elementwise(Prim.DIV, raw, cap)), cap)
    scores = capped if bias is None else ctx.elementwise(Prim.ADD, capped, bias)
    wide = ctx.cast(scores, precision or dtype)
    if sink is not None:
        *lead, keys = ctx.shape(wide)
        column = ctx.reshape(ctx.cast(sink, ctx.dtype(wide)), (ctx.type(sink).numel, 1, 1))
        wide = ctx.concat([wide, ctx.broadcast_to(column, (*lead, 1))], rank - 1)
    probs = softmax(ctx, wide, rank - 1, log=False)
    if sink is not None:
        probs = ctx.slice_axis(probs, rank - 1, 0, keys)
    if masked:
        most = ctx.reduce(Prim.REDUCE_MAX, bias, [-1])
        attended = ctx.elementwise(Prim.GT, most, ctx.scalar(-math.inf, dtype))
        probs = ctx.elementwise(Prim.WHERE, attended, probs, ctx.scalar(0, ctx.dtype(probs)))
    probs = ctx.cast(probs, dtype)
    return matmul(ctx, probs, v), (raw, capped, scores, probs)
