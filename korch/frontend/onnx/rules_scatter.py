"""Fission rules that write by index or order by value (ScatterElements, ScatterND, TopK), and the
cores the ATen rules share with them. Both come down to two primitives: a scatter of rows into
axis 0 of the data, and a stable argsort."""

from __future__ import annotations

import math

import numpy as np

from korch.errors import KorchError
from korch.frontend.lowering import Lowering, OnnxNode, fission, normalize_axes
from korch.frontend.onnx.rules_layout import (
    affine_index,
    gather_elements_core,
    index_dtype,
    nd_rows,
    row_strides,
    wrap_negative,
)
from korch.ir.prims import SCATTER_REDUCTIONS, Prim

# ------------------------------------------------------------------- scatter


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


def _reduction(n: OnnxNode) -> str:
    reduction = n.attr("reduction", "none")
    if reduction not in SCATTER_REDUCTIONS:
        raise KorchError(f"{n.op_type} reduction {reduction!r} is not supported")
    return reduction


@fission("Scatter", 9, 11)
@fission("ScatterElements", 11, 13, 16, 18)
def scatter_elements(ctx: Lowering, n: OnnxNode) -> list[str]:
    data, idx, updates = n.inputs[:3]
    return [scatter_elements_core(ctx, data, idx, updates, n.attr("axis", 0), _reduction(n))]


@fission("ScatterND", 11, 13, 16, 18)
def scatter_nd(ctx: Lowering, n: OnnxNode) -> list[str]:
    """Index tuples name rows of the data viewed as [indexed block, *rest] (as for GatherND); one
    scatter of the updates, viewed as [tuples, *rest], into them."""
    data, idx, updates = n.inputs[:3]
    rows, flat_shape = nd_rows(ctx, data, idx, 0, "ScatterND")
    m = ctx.type(rows).numel
    if ctx.shape(updates) != ctx.shape(rows) + flat_shape[1:]:
        raise KorchError(f"ScatterND updates {list(ctx.shape(updates))} do not fit its indices and data")
    flat = scatter_rows(
        ctx,
        ctx.reshape(data, flat_shape),
        0,
        ctx.reshape(rows, (m,)),
        ctx.reshape(updates, (m, *flat_shape[1:])),
        _reduction(n),
    )
    return [ctx.reshape(flat, ctx.shape(data))]


# ---------------------------------------------------------------------- sort


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


@fission("TopK", 1, 10, 11)
def top_k(ctx: Lowering, n: OnnxNode) -> list[str]:
    """The k largest (smallest) along axis, in order; equal values by index, as the spec asks."""
    x = n.inputs[0]
    k = n.attr("k") if n.opset < 10 else ctx.ints(n.inputs[1], "TopK's k")[0]
    largest = n.attr("largest", 1) if n.opset >= 11 else 1
    if n.opset >= 11:
        n.attr("sorted", 1)  # (unsorted may come in any order: sorted is one of them)
    values, order = sort_core(ctx, x, n.attr("axis", -1), bool(largest), k)
    return [values, order]
