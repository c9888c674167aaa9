"""Pooling builders: windows of a padded input reduced by max or sum, where each maximum is, and
averages with the divisors ONNX's and torch's pools count."""

from __future__ import annotations

import math

import numpy as np

from korch.frontend.lowering import Lowering
from korch.ir.prims import FLOAT_DTYPES, Prim, is_float


def reach(sizes, kernel, strides, pads, dilations, ceil_mode) -> tuple[list[int], list[int]]:
    """(kernel, extra): the kernel trimmed of taps that lie past the padded input for every
    window, and the extra room at the end that ceil_mode's last, partial window needs. A trimmed
    tap adds nothing (the lowest value to a max, zero to a sum, and is not counted by a mean), but
    its windows cost memory: Hugging Face's EfficientNet ends with AvgPool2d(1280, ceil_mode=True)
    over 2x2 pixels, 1280x1280 taps of which 4 are pixels, 8 GB of windows."""
    nd = len(kernel)
    trimmed, extra = [], []
    for i in range(nd):
        padded, stride = sizes[i] + pads[i] + pads[nd + i], strides[i]
        span = padded - (kernel[i] - 1) * dilations[i] - 1
        out = (math.ceil(span / stride) if ceil_mode else span // stride) + 1
        if ceil_mode and (out - 1) * stride >= sizes[i] + pads[i]:
            out -= 1  # a window may not start inside the end padding
        # a tap at or past the padded end in the first window is past it in every later one
        for k in (min(kernel[i], max(1, -(-padded // dilations[i]))), kernel[i]):
            extent = (k - 1) * dilations[i] + 1
            room = max(0, (out - 1) * stride + extent - padded)
            if (padded + room - extent) // stride + 1 == out:  # (else: the untrimmed kernel)
                break
        trimmed.append(k)
        extra.append(room)
    return trimmed, extra


def _windows(ctx, x, kernel, strides, dilations, begins, ends, value):
    rank = ctx.rank(x)
    nd = len(kernel)
    if any(begins) or any(ends):
        pads = [0] * (rank - nd) + list(begins) + [0] * (rank - nd) + list(ends)
        x = ctx.emit(Prim.PAD, x, pads=pads, mode="constant", value=value)
    return ctx.emit(Prim.WINDOW, x, kernel=kernel, strides=strides, dilations=dilations)


def _max_windows(ctx: Lowering, x: str, kernel, strides, pads, dilations, ceil_mode):
    """x padded with its lowest value (and ceil_mode's extra room): ([..., *out, *kernel]
    windows, that kernel (trimmed: reach))."""
    nd = len(kernel)
    kernel, extra = reach(ctx.shape(x)[-nd:], kernel, strides, pads, dilations, ceil_mode)
    ends = [e + x_ for e, x_ in zip(pads[nd:], extra)]
    lowest = float("-inf") if is_float(ctx.dtype(x)) else int(np.iinfo(ctx.dtype(x)).min)
    return _windows(ctx, x, kernel, strides, dilations, pads[:nd], ends, lowest), kernel


def max_pool_core(ctx: Lowering, x: str, kernel, strides, pads, dilations, ceil_mode) -> str:
    """pad (with the lowest value) -> window -> reduce_max over the trailing spatial axes."""
    nd = len(kernel)
    win, _ = _max_windows(ctx, x, kernel, strides, pads, dilations, ceil_mode)
    rank = ctx.rank(win)
    return ctx.reduce(Prim.REDUCE_MAX, win, range(rank - nd, rank), keepdims=False)


def max_pool_indices(ctx: Lowering, x: str, kernel, strides, pads, dilations, ceil_mode) -> str:
    """Where each window's maximum is (the first one; a NaN wins), as a flat index into its
    [*spatial] plane: argmax over the flattened window, its offset in the plane looked up from a
    constant table, plus the window's corner."""
    nd = len(kernel)
    sizes = ctx.shape(x)[-nd:]
    win, kernel = _max_windows(ctx, x, kernel, strides, pads, dilations, ceil_mode)
    outs = ctx.shape(win)[-2 * nd : -nd]
    flat = ctx.reshape(win, ctx.shape(win)[:-nd] + (math.prod(kernel),))
    best = ctx.reshape(ctx.emit(Prim.ARGMAX, flat, axis=ctx.rank(flat) - 1), ctx.shape(win)[:-nd])
    plane = [math.prod(sizes[i + 1 :]) for i in range(nd)]
    taps = np.indices(kernel).reshape(nd, -1)
    table = sum(t * d * p for t, d, p in zip(taps, dilations, plane))
    corner = sum(
        ((np.arange(o) * s - b) * p).reshape([o if j == i else 1 for j in range(nd)])
        for i, (o, s, b, p) in enumerate(zip(outs, strides, pads[:nd], plane))
    )
    offset = ctx.emit(Prim.GATHER, ctx.const(table.astype("int64")), best, axis=0)
    return ctx.elementwise(Prim.ADD, offset, ctx.const(np.asarray(corner, "int64")))


def window_sum(ctx: Lowering, x: str, kernel, strides, pads, dilations, extra) -> str:
    """pad (zeros, plus ceil_mode's extra room) -> window -> reduce_sum over the window axes."""
    nd = len(kernel)
    ends = [e + x_ for e, x_ in zip(pads[nd:], extra)]
    win = _windows(ctx, x, kernel, strides, dilations, pads[:nd], ends, 0.0)
    rank = ctx.rank(win)
    return ctx.reduce(Prim.REDUCE_SUM, win, range(rank - nd, rank), keepdims=False)


def avg_pool_core(
    ctx: Lowering, x, kernel, strides, pads, dilations, ceil_mode, count_include_pad, divisor=None
) -> str:
    """pad (zeros) -> window -> reduce_sum, divided by how many window elements each output counts
    (or by torch's divisor_override)."""
    nd = len(kernel)
    sizes = ctx.shape(x)[-nd:]
    kernel, extra = reach(sizes, kernel, strides, pads, dilations, ceil_mode)
    begins, ends = pads[:nd], pads[nd:]
    total = window_sum(ctx, x, kernel, strides, pads, dilations, extra)
    if divisor is not None:
        return ctx.elementwise(Prim.DIV, total, ctx.scalar(divisor, ctx.dtype(x)))
    # divisor per output position: how many window elements lie inside the counted region
    mask = np.pad(np.ones(sizes), list(zip(begins, ends)), constant_values=1.0 if count_include_pad else 0.0)
    mask = np.pad(mask, [(0, e) for e in extra])
    count = Prim.WINDOW.ref([mask], {"kernel": kernel, "strides": strides, "dilations": dilations})[0]
    count = count.sum(axis=tuple(range(nd, 2 * nd)))
    dtype = ctx.dtype(x)
    if dtype not in FLOAT_DTYPES:  # (torch's integer pools divide, truncating)
        return ctx.elementwise(Prim.DIV, total, ctx.const(count.astype(dtype)))
    if np.all(count == count.flat[0]):
        return ctx.elementwise(Prim.MUL, total, ctx.scalar(1.0 / count.flat[0], dtype))
    return ctx.elementwise(Prim.DIV, total, ctx.const(count.astype(dtype)))
