"""ATen rules that write by index or order by value: index_put (x[i] = v), put, masked_scatter, the
scatters, slice, diagonal and strided assignment; sort, topk, kthvalue, the medians, bucketize,
histc; the running product, max, min and log-sum-exp."""

from __future__ import annotations

import math

import numpy as np

from korch.errors import KorchError
from korch.frontend.lowering import Lowering, normalize_axes
from korch.frontend.ops.elementwise import isnan_core, log1p_core
from korch.frontend.ops.layout import (
    gather_elements_core,
    row_strides,
    scatter_elements_core,
    scatter_rows,
    sort_core,
    take,
    wrap_negative,
)
from korch.frontend.ops.reduce import scan_core
from korch.frontend.torch.aten import AtenNode, aten, operand, vector
from korch.ir.prims import Prim, is_float

# ----------------------------------------------------------------- assignment


@aten("aten.copy.default")
def copy(ctx: Lowering, n: AtenNode) -> str:
    """self's shape and dtype, src's values (broadcast)."""
    src, shape = ctx.cast(n["src"], n.out.dtype), n.out.shape
    return ctx.broadcast_to(ctx.reshape(src, (1,) * (len(shape) - ctx.rank(src)) + ctx.shape(src)), shape)


@aten("aten.slice_scatter.default")
def slice_scatter(ctx: Lowering, n: AtenNode) -> str:
    """x[..., start:end:step, ...] = src: a concatenation around src for step 1, else a scatter of
    src's slices into the picked positions."""
    x, src = vector(ctx, n["self"]), ctx.cast(vector(ctx, n["src"]), n.out.dtype)
    shape = ctx.shape(x)
    (axis,) = normalize_axes([n["dim"]], len(shape))
    picks = np.arange(shape[axis])[slice(n["start"], n["end"], n["step"])]
    if picks.size and n["step"] == 1:
        first, last = int(picks[0]), int(picks[-1]) + 1
        parts = [ctx.slice_axis(x, axis, 0, first), src, ctx.slice_axis(x, axis, last, shape[axis] - last)]
        return ctx.reshape(ctx.concat(parts, axis), n.out.shape)
    out = scatter_rows(ctx, x, axis, ctx.const(picks.astype("int64")), src, "none")
    return ctx.reshape(out, n.out.shape)


@aten("aten.index_put.default")
def index_put(ctx: Lowering, n: AtenNode) -> str:
    """x[indices] = values (+= with accumulate). Index tensors name rows of x viewed with its
    indexed axes merged in front: rows = sum(wrap(index) * stride); values, broadcast to the shape
    x[indices] has, become the updates of one scatter. A boolean mask is a where."""
    x, dtype = n["self"], n.out.dtype
    indices = list(n["indices"])
    values = ctx.cast(n["values"], dtype)
    accumulate = bool(n.get("accumulate", False))
    if any(v is not None and ctx.dtype(v) == "bool" for v in indices):
        return _masked_put(ctx, x, indices, values, accumulate)
    shape = ctx.shape(x)
    axes = [a for a, v in enumerate(indices) if v is not None]
    others = [a for a in range(len(shape)) if a not in axes]
    dims = [shape[a] for a in axes]
    try:
        batch = tuple(np.broadcast_shapes(*(ctx.shape(indices[a]) for a in axes)))
    except ValueError:
        raise KorchError("index tensors do not broadcast against each other") from None
    rows = ctx.const(np.zeros((), "int64"))
    for a, stride in zip(axes, row_strides(dims)):
        term = wrap_negative(ctx, ctx.cast(indices[a], "int64"), shape[a])
        if stride != 1:
            term = ctx.elementwise(Prim.MUL, term, ctx.scalar(stride, "int64"))
        rows = ctx.elementwise(Prim.ADD, rows, term)
    m = math.prod(batch)
    rows = ctx.reshape(ctx.broadcast_to(rows, batch), (m,))
    # x[indices]'s shape: the batch in place of adjacent indexed axes, else in front of the rest
    lead = axes[0] if axes == list(range(axes[0], axes[-1] + 1)) else 0
    rest = [shape[a] for a in others]
    picked = tuple(rest[:lead]) + batch + tuple(rest[lead:])
    values = ctx.broadcast_to(
        ctx.reshape(values, (1,) * (len(picked) - ctx.rank(values)) + ctx.shape(values)), picked
    )
    nb = len(batch)
    front = list(range(lead, lead + nb)) + list(range(lead)) + list(range(lead + nb, len(picked)))
    updates = ctx.reshape(ctx.transpose(values, front), (m, *rest))
    data = ctx.reshape(ctx.transpose(x, axes + others), (math.prod(dims), *rest))
    out = scatter_rows(ctx, data, 0, rows, updates, "add" if accumulate else "none")
    return ctx.transpose(ctx.reshape(out, (*dims, *rest)), np.argsort(axes + others))


def _masked_put(ctx: Lowering, x: str, indices, values: str, accumulate: bool) -> str:
    """x[mask] = values where values has one slice for every masked position (or broadcasts so):
    where(mask, values, x). Values with one slice per True would have a data-dependent shape."""
    axes = [a for a, v in enumerate(indices) if v is not None]
    refused = KorchError("boolean mask indexing has a data-dependent shape")
    if len(axes) != 1:
        raise refused
    a, mask = axes[0], ctx.cast(indices[axes[0]], "bool")
    shape, k = ctx.shape(x), ctx.rank(mask)
    picked_rank = len(shape) - k + 1  # x[mask]: [*pre, count of True, *post]
    if ctx.rank(values) > picked_rank:
        raise refused
    vshape = (1,) * (picked_rank - ctx.rank(values)) + ctx.shape(values)
    if vshape[a] != 1:
        raise refused
    values = ctx.reshape(values, vshape[:a] + (1,) * k + vshape[a + 1 :])
    mask = ctx.reshape(mask, (1,) * a + ctx.shape(mask) + (1,) * (len(shape) - a - k))
    if accumulate:
        added = ctx.elementwise(Prim.WHERE, mask, values, ctx.scalar(0, ctx.dtype(x)))
        return ctx.elementwise(Prim.ADD, x, added)
    return ctx.elementwise(Prim.WHERE, mask, values, x)


@aten("aten.put.default")
def put(ctx: Lowering, n: AtenNode) -> str:
    """x.flatten()[index.flatten()] = source.flatten() (+= with accumulate)."""
    x, dtype = n["self"], n.out.dtype
    numel = ctx.type(x).numel
    flat = (ctx.type(n["index"]).numel,)
    index = ctx.reshape(wrap_negative(ctx, ctx.cast(n["index"], "int64"), numel), flat)
    source = ctx.reshape(ctx.cast(n["source"], dtype), flat)
    out = scatter_rows(ctx, ctx.reshape(x, (numel,)), 0, index, source, "add" if n["accumulate"] else "none")
    return ctx.reshape(out, n.out.shape)


@aten("aten.masked_scatter.default")
def masked_scatter(ctx: Lowering, n: AtenNode) -> str:
    """The masked places of x take source's values in order: the k-th True (counted by a running
    sum of the mask) takes source.flatten()[k]."""
    shape, dtype = n.out.shape, n.out.dtype
    numel = math.prod(shape)
    mask = ctx.broadcast_to(
        ctx.reshape(n["mask"], (1,) * (len(shape) - ctx.rank(n["mask"])) + ctx.shape(n["mask"])), shape
    )
    flat_mask = ctx.reshape(mask, (numel,))
    count = scan_core(ctx, ctx.cast(flat_mask, "int64"), 0, Prim.ADD, 0)
    place = ctx.elementwise(
        Prim.MAX, ctx.elementwise(Prim.SUB, count, ctx.scalar(1, "int64")), ctx.scalar(0, "int64")
    )
    source = ctx.reshape(ctx.cast(n["source"], dtype), (ctx.type(n["source"]).numel,))
    if ctx.shape(source)[0] == 0:
        return n["self"]  # (nothing to place: torch requires no True then)
    picked = ctx.reshape(ctx.emit(Prim.GATHER, source, place, axis=0), shape)
    return ctx.elementwise(Prim.WHERE, mask, picked, n["self"])


# ------------------------------------------------------------------- scatters


@aten(
    "aten.scatter.src",
    "aten.scatter.value",
    "aten.scatter.reduce",
    "aten.scatter.value_reduce",
    "aten.scatter_add.default",
)
def scatter(ctx: Lowering, n: AtenNode) -> str:
    x, index, dtype = vector(ctx, n["self"]), vector(ctx, n["index"]), n.out.dtype
    reduction = (
        "add"
        if "scatter_add" in n.target
        else {None: "none", "add": "add", "multiply": "mul"}[n.get("reduce")]
    )
    src = _source(ctx, n, index, dtype)
    return ctx.reshape(scatter_elements_core(ctx, x, index, src, n["dim"], reduction), n.out.shape)


def _source(ctx: Lowering, n: AtenNode, index: str, dtype: str) -> str:
    """torch's src cut to the index's shape (src may be larger), or its scalar value broadcast."""
    ishape = ctx.shape(index)
    if n.params.get("src") is None:
        return ctx.broadcast_to(operand(ctx, n["value"], dtype), ishape)
    src = ctx.cast(vector(ctx, n["src"]), dtype)
    for axis, size in enumerate(ishape):
        src = ctx.slice_axis(src, axis, 0, size)
    return src


@aten("aten.scatter_reduce.two")
def scatter_reduce(ctx: Lowering, n: AtenNode) -> str:
    x, index, dtype = vector(ctx, n["self"]), vector(ctx, n["index"]), n.out.dtype
    src = _source(ctx, n, index, dtype)

    def write(data: str, updates: str, reduction: str) -> str:
        return scatter_elements_core(ctx, data, index, updates, n["dim"], reduction)

    out = _reduce_into(ctx, write, x, src, n["reduce"], n.get("include_self", True))
    return ctx.reshape(out, n.out.shape)


@aten("aten.index_reduce.default")
def index_reduce(ctx: Lowering, n: AtenNode) -> str:
    x, dtype = vector(ctx, n["self"]), n.out.dtype
    (axis,) = normalize_axes([n["dim"]], ctx.rank(x))
    rows = wrap_negative(ctx, ctx.cast(vector(ctx, n["index"]), "int64"), ctx.shape(x)[axis])
    source = ctx.reshape(
        ctx.cast(n["source"], dtype), ctx.shape(x)[:axis] + ctx.shape(rows) + ctx.shape(x)[axis + 1 :]
    )

    def write(data: str, updates: str, reduction: str) -> str:
        return scatter_rows(ctx, data, axis, rows, updates, reduction)

    out = _reduce_into(ctx, write, x, source, n["reduce"], n.get("include_self", True))
    return ctx.reshape(out, n.out.shape)


_REDUCTIONS = {"sum": "add", "mean": "add", "prod": "mul", "amax": "max", "amin": "min"}


def _reduce_into(ctx: Lowering, write, x: str, updates: str, reduce: str, include_self: bool) -> str:
    """torch's scatter_reduce / index_reduce through `write(data, updates, reduction)`, a scatter
    to fixed places: without include_self the places written start from the reduction's
    identity; a mean divides by the count written (plus one with include_self)."""
    if reduce not in _REDUCTIONS:
        raise KorchError(f"scatter reduction {reduce!r} is not supported")
    dtype = ctx.dtype(x)
    if not include_self:
        x = write(
            x, ctx.broadcast_to(ctx.scalar(_identity(reduce, dtype), dtype), ctx.shape(updates)), "none"
        )
    out = write(x, updates, _REDUCTIONS[reduce])
    if reduce != "mean":
        return out
    base = ctx.broadcast_to(ctx.scalar(int(include_self), dtype), ctx.shape(x))
    count = write(base, ctx.broadcast_to(ctx.scalar(1, dtype), ctx.shape(updates)), "add")
    count = ctx.elementwise(Prim.MAX, count, ctx.scalar(1, dtype))
    if is_float(dtype):
        return ctx.elementwise(Prim.DIV, out, count)
    quotient = ctx.elementwise(Prim.DIV, ctx.cast(out, "float64"), ctx.cast(count, "float64"))
    return ctx.cast(ctx.unary(Prim.FLOOR, quotient), dtype)  # (torch floors an integer mean)


def _identity(reduce: str, dtype: str):
    if reduce in ("sum", "mean"):
        return 0
    if reduce == "prod":
        return 1
    if dtype == "bool":
        return reduce == "amin"
    if is_float(dtype):
        return -math.inf if reduce == "amax" else math.inf
    info = np.iinfo(dtype)
    return int(info.min if reduce == "amax" else info.max)


# ----------------------------------------------------------------- diagonals


def _diagonal_view(ctx: Lowering, x: str, offset: int, dim1: int, dim2: int):
    """x with dim1 and dim2 moved last and merged, the positions of the diagonal along that axis,
    and the transpose used."""
    shape = ctx.shape(x)
    d1, d2 = dim1 % len(shape), dim2 % len(shape)
    if d1 == d2:
        raise KorchError("diagonal dimensions cannot be identical")
    n1, n2 = shape[d1], shape[d2]
    perm = [a for a in range(len(shape)) if a not in (d1, d2)] + [d1, d2]
    merged = ctx.reshape(ctx.transpose(x, perm), [shape[a] for a in perm[:-2]] + [n1 * n2])
    row, col = (0, offset) if offset >= 0 else (-offset, 0)
    steps = np.arange(max(0, min(n1 - row, n2 - col)))
    return merged, (row + steps) * n2 + col + steps, perm


@aten("aten.diagonal.default")
def diagonal(ctx: Lowering, n: AtenNode) -> str:
    merged, picks, _ = _diagonal_view(ctx, n["self"], n["offset"], n["dim1"], n["dim2"])
    return ctx.reshape(take(ctx, merged, ctx.rank(merged) - 1, picks), n.out.shape)


@aten("aten.diagonal_scatter.default")
def diagonal_scatter(ctx: Lowering, n: AtenNode) -> str:
    x = n["self"]
    merged, picks, perm = _diagonal_view(ctx, x, n["offset"], n["dim1"], n["dim2"])
    src = ctx.cast(n["src"], n.out.dtype)
    out = scatter_rows(ctx, merged, ctx.rank(merged) - 1, ctx.const(picks.astype("int64")), src, "none")
    moved = ctx.reshape(out, [ctx.shape(x)[a] for a in perm])
    return ctx.transpose(moved, np.argsort(perm))


# ---------------------------------------------------------------- sort and scan


@aten("aten.sort.default", "aten.sort.stable")
def sort(ctx: Lowering, n: AtenNode) -> list[str]:
    values, order = sort_core(ctx, vector(ctx, n["self"]), n["dim"], bool(n.get("descending", False)))
    return [ctx.reshape(values, n.out_types[0].shape), ctx.reshape(order, n.out_types[1].shape)]


@aten("aten.topk.default")
def topk(ctx: Lowering, n: AtenNode) -> list[str]:
    values, order = sort_core(ctx, vector(ctx, n["self"]), n["dim"], bool(n["largest"]), n["k"])
    return [ctx.reshape(values, n.out_types[0].shape), ctx.reshape(order, n.out_types[1].shape)]


@aten("aten.kthvalue.default")
def kthvalue(ctx: Lowering, n: AtenNode) -> list[str]:
    """The k-th smallest along dim and its index: the last of the k smallest."""
    x = vector(ctx, n["self"])
    (axis,) = normalize_axes([n["dim"]], ctx.rank(x))
    values, order = sort_core(ctx, x, axis, False, n["k"])
    last = [ctx.slice_axis(v, axis, n["k"] - 1, 1) for v in (values, order)]
    return [ctx.reshape(v, t.shape) for v, t in zip(last, n.out_types)]


@aten("aten.median.default", "aten.median.dim", "aten.nanmedian.default", "aten.nanmedian.dim")
def median(ctx: Lowering, n: AtenNode) -> str | list[str]:
    """The lower median: the ((count - 1) // 2)-th in sorted order, NaN sorting last. median takes
    the first NaN where there is one; nanmedian counts only the others."""
    x = n["self"]
    if "dim" not in n.params:
        x = ctx.reshape(x, (ctx.type(x).numel,))
    x = vector(ctx, x)
    (axis,) = normalize_axes([n.get("dim", 0)], ctx.rank(x))
    size = ctx.shape(x)[axis]
    if size == 0:
        raise KorchError("the median of nothing is undefined")
    values, order = sort_core(ctx, x, axis, False)
    nans = ctx.reduce(Prim.REDUCE_SUM, ctx.cast(ctx.elementwise(Prim.EQ, x, x), "int64"), [axis])
    nans = ctx.elementwise(Prim.SUB, ctx.scalar(size, "int64"), nans)  # NaN != NaN
    valid = ctx.elementwise(Prim.SUB, ctx.scalar(size, "int64"), nans)
    if "nanmedian" in n.target:
        middle = ctx.elementwise(Prim.SUB, valid, ctx.scalar(1, "int64"))
        place = ctx.elementwise(
            Prim.MAX, ctx.elementwise(Prim.DIV, middle, ctx.scalar(2, "int64")), ctx.scalar(0, "int64")
        )
    else:
        has_nan = ctx.elementwise(Prim.GT, nans, ctx.scalar(0, "int64"))
        place = ctx.elementwise(Prim.WHERE, has_nan, valid, ctx.scalar((size - 1) // 2, "int64"))
    picked = [gather_elements_core(ctx, v, place, axis) for v in (values, order)]
    outs = [ctx.reshape(v, t.shape) for v, t in zip(picked, n.out_types)]
    return outs if "dim" in n.params else outs[0]  # (over all elements: the value alone)


@aten("aten.cumprod.default")
def cumprod(ctx: Lowering, n: AtenNode) -> str:
    x = vector(ctx, ctx.cast(n["self"], n.out.dtype))
    return ctx.reshape(scan_core(ctx, x, n["dim"], Prim.MUL, 1), n.out.shape)


@aten("aten.cummax.default", "aten.cummin.default")
def cummax(ctx: Lowering, n: AtenNode) -> list[str]:
    """Running max (min) and the index of the value it holds: the last place i <= j where x[i]
    equals the running value at i (a tie moves it, as in torch) or is NaN (NaN wins and stays)."""
    x = vector(ctx, n["self"])
    dtype = ctx.dtype(x)
    work = ctx.cast(x, "int32") if dtype == "bool" else x
    prim = Prim.MAX if "cummax" in n.target else Prim.MIN
    (axis,) = normalize_axes([n["dim"]], ctx.rank(work))
    values = scan_core(
        ctx, work, axis, prim, _identity("amax" if prim is Prim.MAX else "amin", ctx.dtype(work))
    )
    record = ctx.elementwise(Prim.EQ, work, values)
    if is_float(ctx.dtype(work)):
        record = ctx.elementwise(Prim.OR, record, isnan_core(ctx, work))
    length = ctx.shape(work)[axis]
    places = ctx.const(np.arange(length, dtype="int64").reshape([length] + [1] * (ctx.rank(work) - axis - 1)))
    latest = ctx.elementwise(Prim.WHERE, record, places, ctx.scalar(0, "int64"))
    order = scan_core(ctx, latest, axis, Prim.MAX, 0)
    return [
        ctx.reshape(ctx.cast(values, dtype), n.out_types[0].shape),
        ctx.reshape(order, n.out_types[1].shape),
    ]


@aten("aten.logcumsumexp.default")
def logcumsumexp(ctx: Lowering, n: AtenNode) -> str:
    """A scan whose step is logaddexp: m + log1p(exp(-|a - b|)), m = max(a, b) (exact where one
    term is -inf, infinite where m is)."""
    x = vector(ctx, ctx.cast(n["self"], n.out.dtype))

    def logaddexp(ctx: Lowering, a: str, b: str) -> str:
        m = ctx.elementwise(Prim.MAX, a, b)
        gap = ctx.unary(Prim.NEG, ctx.unary(Prim.ABS, ctx.elementwise(Prim.SUB, a, b)))
        y = ctx.elementwise(Prim.ADD, m, log1p_core(ctx, ctx.unary(Prim.EXP, gap)))
        infinite = ctx.elementwise(Prim.EQ, ctx.unary(Prim.ABS, m), ctx.scalar(math.inf, ctx.dtype(m)))
        return ctx.elementwise(Prim.WHERE, infinite, m, y)

    return ctx.reshape(scan_core(ctx, x, n["dim"], logaddexp, -math.inf), n.out.shape)


@aten("aten.bucketize.Tensor", "aten.searchsorted.Tensor")
def bucketize(ctx: Lowering, n: AtenNode) -> str:
    """How many boundaries lie below each value (at or below it with right=True): a comparison
    with every boundary and a sum (a NaN value is above them all, as torch sorts it)."""
    if "bucketize" in n.target:
        x, bounds, right = n["self"], n["boundaries"], n["right"]
    else:
        x, bounds = n["self"], n["sorted_sequence"]
        right = n["right"] or n.get("side") == "right"
        if n.get("sorter") is not None:
            raise KorchError("searchsorted with a sorter is not supported")
    common = str(np.result_type(ctx.dtype(x), ctx.dtype(bounds)))
    values = ctx.reshape(ctx.cast(x, common), ctx.shape(x) + (1,))
    bounds = ctx.cast(bounds, common)
    if ctx.rank(bounds) > 1:  # (one sorted sequence per leading index: [*lead, K, 1] against [*lead, 1, M])
        bounds = ctx.reshape(bounds, ctx.shape(bounds)[:-1] + (1, ctx.shape(bounds)[-1]))
    if right:
        hit = ctx.unary(Prim.NOT, ctx.elementwise(Prim.LT, values, bounds))  # b <= x, and NaN
    else:
        hit = ctx.elementwise(Prim.GT, values, bounds)  # b < x
        if is_float(common):
            hit = ctx.elementwise(Prim.OR, hit, isnan_core(ctx, values))
    count = ctx.reduce(Prim.REDUCE_SUM, ctx.cast(hit, "int64"), [ctx.rank(hit) - 1], keepdims=False)
    return ctx.reshape(ctx.cast(count, n.out.dtype), n.out.shape)


@aten("aten.histc.default")
def histc(ctx: Lowering, n: AtenNode) -> str:
    """Counts of x in `bins` equal bins over [min, max] (the data's own range where min == max,
    widened by 1 each way where that is one value); values outside it, and NaN, are not counted.
    As torch: bin = floor((x - min) * bins / (max - min)) in the input's dtype, max in the last
    bin; one scatter-add of ones, the uncounted into a spare bin past the end."""
    x, bins = n["self"], int(n["bins"])
    dtype = ctx.dtype(x)
    flat = ctx.reshape(x, (ctx.type(x).numel,))
    lo, hi = n.get("min", 0), n.get("max", 0)
    if lo == hi:
        lo, hi = (ctx.reduce(p, flat, [0], keepdims=False) for p in (Prim.REDUCE_MIN, Prim.REDUCE_MAX))
        same = ctx.elementwise(Prim.EQ, lo, hi)
        lo = ctx.elementwise(Prim.WHERE, same, ctx.elementwise(Prim.SUB, lo, ctx.scalar(1, dtype)), lo)
        hi = ctx.elementwise(Prim.WHERE, same, ctx.elementwise(Prim.ADD, hi, ctx.scalar(1, dtype)), hi)
    elif lo > hi:
        raise KorchError(f"histc: max {hi} is below min {lo}")
    else:
        lo, hi = ctx.scalar(lo, dtype), ctx.scalar(hi, dtype)
    at_or_above = ctx.elementwise(
        Prim.OR, ctx.elementwise(Prim.GT, flat, lo), ctx.elementwise(Prim.EQ, flat, lo)
    )
    inside = ctx.elementwise(Prim.AND, at_or_above, ctx.unary(Prim.NOT, ctx.elementwise(Prim.GT, flat, hi)))
    scaled = ctx.elementwise(Prim.MUL, ctx.elementwise(Prim.SUB, flat, lo), ctx.scalar(bins, dtype))
    position = ctx.elementwise(Prim.DIV, scaled, ctx.elementwise(Prim.SUB, hi, lo))
    position = ctx.elementwise(Prim.MIN, position, ctx.scalar(bins - 1, dtype))  # (max itself)
    rows = ctx.cast(ctx.elementwise(Prim.WHERE, inside, position, ctx.scalar(bins, dtype)), "int64")
    ones = ctx.broadcast_to(ctx.scalar(1, n.out.dtype), ctx.shape(flat))
    counts = scatter_rows(ctx, ctx.const(np.zeros(bins + 1, n.out.dtype)), 0, rows, ones, "add")
    return ctx.slice_axis(counts, 0, 0, bins)


def _strided_places(ctx: Lowering, n: AtenNode) -> np.ndarray:
    """The flat positions of an as_strided view of a contiguous tensor (torch indexes storage; a
    korch value is the logical tensor, which is that storage when contiguous from offset 0)."""
    source = n.vals.get("self")
    if source is None or not source.is_contiguous() or source.storage_offset() != 0:
        raise KorchError("as_strided of a non-contiguous tensor is not supported")
    grid = np.indices(tuple(n["size"]), dtype="int64")
    places = sum((g * s for g, s in zip(grid, n["stride"])), np.zeros(tuple(n["size"]), "int64"))
    places = places + (n.get("storage_offset") or 0)
    numel = ctx.type(n["self"]).numel
    if places.size and (places.min() < 0 or places.max() >= numel):
        raise KorchError(f"as_strided reaches outside the tensor's {numel} elements")
    return places


@aten("aten.as_strided.default", "aten.as_strided_copy.default")
def as_strided(ctx: Lowering, n: AtenNode) -> str:
    places = _strided_places(ctx, n)
    flat = ctx.reshape(n["self"], (ctx.type(n["self"]).numel,))
    return ctx.reshape(take(ctx, flat, 0, places), n.out.shape)


@aten("aten.as_strided_scatter.default")
def as_strided_scatter(ctx: Lowering, n: AtenNode) -> str:
    places = _strided_places(ctx, n).reshape(-1)
    x = n["self"]
    flat = ctx.reshape(x, (ctx.type(x).numel,))
    src = ctx.reshape(ctx.cast(n["src"], n.out.dtype), (places.size,))
    out = scatter_rows(ctx, flat, 0, ctx.const(places), src, "none")
    return ctx.reshape(out, n.out.shape)
