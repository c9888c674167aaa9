"""Layout and indexing builders: tiling, slice bounds, flat indices into row-major data, gathers
and scatters by index, and a stable sort. Scatters and sorts come down to two primitives: a
scatter of rows into axis 0 of the data, and a stable argsort."""

from __future__ import annotations

import math

import numpy as np

from korch.errors import KorchError
from korch.frontend.lowering import Lowering, normalize_axes
from korch.ir.prims import Prim
from korch.ir.shapes import SCATTER_REDUCTIONS


def tile_core(ctx: Lowering, x: str, reps) -> str:
    shape = ctx.shape(x)
    if all(r == 1 for r in reps):
        return x
    interleaved = [v for d in shape for v in (1, d)]
    wide = [v for r, d in zip(reps, shape) for v in (r, d)]
    y = ctx.broadcast_to(ctx.reshape(x, interleaved), wide)
    return ctx.reshape(y, [r * d for r, d in zip(reps, shape)])


def slice_bounds(dim: int, start: int, end: int, step: int) -> tuple[int, int]:
    """ONNX Slice clamping rules for one axis; returns (first index, element count)."""
    if step == 0:
        raise KorchError("Slice step must not be 0")
    start = start + dim if start < 0 else start
    end = end + dim if end < 0 else end
    if step > 0:
        start, end = min(max(start, 0), dim), min(max(end, 0), dim)
    else:
        start, end = min(max(start, 0), dim - 1), min(max(end, -1), dim - 1)
    return start, max(0, math.ceil((end - start) / step))


def row_strides(shape) -> list[int]:
    """Row-major element strides of a shape."""
    return [math.prod(shape[i + 1 :]) for i in range(len(shape))]


def index_dtype(dtype: str, bound: int) -> str:
    """The dtype flat indices below `bound` need: the given one while it holds them, else int64."""
    return dtype if dtype in ("int32", "int64") and bound <= np.iinfo(dtype).max else "int64"


def wrap_negative(ctx: Lowering, idx: str, dims) -> str:
    """Negative indices count from the end: idx + dims where idx < 0 (dims broadcasts against idx)."""
    dtype = ctx.dtype(idx)
    value = ctx.const_value(idx)
    if value is not None:
        return ctx.const(np.where(value < 0, value + np.asarray(dims), value).astype(dtype))
    negative = ctx.elementwise(Prim.LT, idx, ctx.scalar(0, dtype))
    shifted = ctx.elementwise(Prim.ADD, idx, ctx.const(np.asarray(dims, dtype=dtype)))
    return ctx.elementwise(Prim.WHERE, negative, shifted, idx)


def affine_index(ctx: Lowering, idx: str, scale, offset: np.ndarray) -> str:
    """idx * scale + offset (scale and offset broadcast against idx), folded when idx is a constant."""
    dtype = ctx.dtype(idx)
    value = ctx.const_value(idx)
    if value is not None:
        return ctx.const(np.broadcast_to(value * np.asarray(scale) + offset, value.shape).astype(dtype))
    scale = np.asarray(scale)
    if np.any(scale != 1):
        idx = ctx.elementwise(Prim.MUL, idx, ctx.const(scale.astype(dtype)))
    if np.any(offset != 0):
        idx = ctx.elementwise(Prim.ADD, idx, ctx.const(np.asarray(offset, dtype=dtype)))
    return idx


def take(ctx: Lowering, x: str, axis: int, picks: np.ndarray) -> str:
    """x's entries `picks` (known non-negative indices) along axis: a slice when they are evenly
    spaced and increasing, a gather otherwise."""
    picks = np.asarray(picks, dtype="int64").reshape(-1)
    steps = np.diff(picks)
    if picks.size == 0:
        return ctx.slice_axis(x, axis, 0, 0)
    if picks.size == 1 or (steps[0] > 0 and np.all(steps == steps[0])):
        return ctx.slice_axis(x, axis, int(picks[0]), picks.size, int(steps[0]) if steps.size else 1)
    return ctx.emit(Prim.GATHER, x, ctx.const(picks), axis=axis)


def gather_elements_core(ctx: Lowering, data: str, idx: str, axis: int) -> str:
    """GatherElements (torch.gather): out[..., i, ...] = data[..., idx[..., i, ...], ...] along axis."""
    shape, ishape = ctx.shape(data), ctx.shape(idx)
    rank = len(shape)
    (axis,) = normalize_axes([axis], rank)
    if len(ishape) != rank or any(i > d for k, (i, d) in enumerate(zip(ishape, shape)) if k != axis):
        raise KorchError(f"GatherElements indices {list(ishape)} do not fit data {list(shape)} (axis {axis})")
    if rank == 1:
        return ctx.emit(Prim.GATHER, data, idx, axis=0)
    numel = ctx.type(data).numel
    idx = ctx.cast(idx, index_dtype(ctx.dtype(idx), numel))
    strides = row_strides(shape)
    coords = np.indices(tuple(1 if k == axis else d for k, d in enumerate(ishape)), dtype="int64")
    offset = sum(c * s for k, (c, s) in enumerate(zip(coords, strides)) if k != axis)
    flat = affine_index(ctx, wrap_negative(ctx, idx, shape[axis]), strides[axis], offset)
    return ctx.emit(Prim.GATHER, ctx.reshape(data, (numel,)), flat, axis=0)


def scatter_rows(ctx: Lowering, data: str, axis: int, rows: str, updates: str, reduction: str) -> str:
    """data with its slices rows[i] along axis replaced by (or reduced with) updates' slice i
    along the same axis (rows: 1-D, already counted from 0)."""
    if reduction not in SCATTER_REDUCTIONS:
        raise KorchError(f"scatter reduction {reduction!r} is not supported")
    if ctx.shape(rows)[0] == 0:
        return data
    if ctx.dtype(data) == "bool" and reduction != "none":  # (or / and: max / min of 0 and 1)
        as_ints = [ctx.cast(v, "int32") for v in (data, updates)]
        logical = {"add": "max", "mul": "min"}.get(reduction, reduction)
        return ctx.cast(scatter_rows(ctx, as_ints[0], axis, rows, as_ints[1], logical), "bool")
    rank = ctx.rank(data)
    perm = [axis] + [a for a in range(rank) if a != axis]
    moved = ctx.emit(
        Prim.SCATTER, ctx.transpose(data, perm), rows, ctx.transpose(updates, perm), reduction=reduction
    )
    return ctx.transpose(moved, np.argsort(perm))


def scatter_elements_core(ctx: Lowering, data: str, idx: str, updates: str, axis: int, reduction: str) -> str:
    """ScatterElements (torch.scatter): data[..., idx[..., i, ...], ...] = updates[..., i, ...]
    along axis, as one scatter into the flattened data at wrap(idx) * stride(axis) + the offset of
    the other coordinates."""
    shape, ishape = ctx.shape(data), ctx.shape(idx)
    rank = len(shape)
    (axis,) = normalize_axes([axis], rank)
    fits = len(ishape) == rank and all(i <= d for k, (i, d) in enumerate(zip(ishape, shape)) if k != axis)
    if not fits or ctx.shape(updates) != ishape:
        raise KorchError(
            f"scatter indices {list(ishape)} and updates {list(ctx.shape(updates))} do not fit data "
            f"{list(shape)} (axis {axis})"
        )
    numel = ctx.type(data).numel
    idx = ctx.cast(idx, index_dtype(ctx.dtype(idx), numel))
    strides = row_strides(shape)
    coords = np.indices(tuple(1 if k == axis else d for k, d in enumerate(ishape)), dtype="int64")
    offset = sum((c * s for k, (c, s) in enumerate(zip(coords, strides)) if k != axis), np.zeros((), "int64"))
    flat = affine_index(ctx, wrap_negative(ctx, idx, shape[axis]), strides[axis], offset)
    m = math.prod(ishape)
    out = scatter_rows(
        ctx, ctx.reshape(data, (numel,)), 0, ctx.reshape(flat, (m,)), ctx.reshape(updates, (m,)), reduction
    )
    return ctx.reshape(out, shape)


def sort_core(ctx: Lowering, x: str, axis: int, descending: bool, k: int | None = None) -> tuple[str, str]:
    """(values, int64 indices) of the first k (all) elements along axis in sorted order, stably:
    equal values keep their order, NaN sorts as the largest value."""
    (axis,) = normalize_axes([axis], ctx.rank(x))
    size = ctx.shape(x)[axis]
    k = size if k is None else k
    if not 0 <= k <= size:
        raise KorchError(f"k = {k} is out of range for an axis of {size}")
    keys = ctx.cast(x, "int32") if ctx.dtype(x) == "bool" else x
    order = ctx.emit(Prim.ARGSORT, keys, axis=axis, descending=bool(descending)) if size > 1 else None
    if order is None:  # (one element, or none: nothing to order)
        order = ctx.const(np.zeros(ctx.shape(x), "int64"))
    order = ctx.slice_axis(order, axis, 0, k)
    return gather_elements_core(ctx, x, order, axis), order
