"""Fission rules for layout operators and the static shape arithmetic that folds away at import."""

from __future__ import annotations

import math

import numpy as np
from onnx import numpy_helper

from korch.errors import KorchError
from korch.frontend.lowering import Lowering, OnnxNode, fission, normalize_axes
from korch.frontend.onnx.tensor_types import onnx_dtype
from korch.frontend.ops.layout import (
    affine_index,
    gather_elements_core,
    index_dtype,
    row_strides,
    slice_bounds,
    take,
    tile_core,
    wrap_negative,
)
from korch.ir.prims import Prim

# ------------------------------------------------------- constants and shapes


@fission("Constant", 1)
def constant(ctx: Lowering, n: OnnxNode) -> list[str]:
    if "value" in n.attrs:
        return [ctx.const(numpy_helper.to_array(n.attrs["value"]))]
    for key, dtype in (
        ("value_float", "float32"),
        ("value_floats", "float32"),
        ("value_int", "int64"),
        ("value_ints", "int64"),
    ):
        if key in n.attrs:
            return [ctx.const(np.array(n.attrs[key], dtype=dtype))]
    ctx.unsupported(f"Constant with attributes {sorted(n.attrs)}")


@fission("Shape", 1)
def shape_(ctx: Lowering, n: OnnxNode) -> list[str]:
    dims = ctx.shape(n.inputs[0])
    rank = len(dims)
    start = n.attr("start", 0)
    end = n.attr("end", rank)
    start = min(max(start + rank if start < 0 else start, 0), rank)
    end = min(max(end + rank if end < 0 else end, 0), rank)
    return [ctx.const(np.array(dims[start:end], dtype="int64"))]


@fission("Size", 1)
def size_(ctx: Lowering, n: OnnxNode) -> list[str]:
    return [ctx.const(np.array(ctx.type(n.inputs[0]).numel, dtype="int64"))]


@fission("ConstantOfShape", 9)
def constant_of_shape(ctx: Lowering, n: OnnxNode) -> list[str]:
    shape = ctx.ints(n.inputs[0], "ConstantOfShape's shape")
    value = n.attrs.get("value")
    fill = numpy_helper.to_array(value).reshape(()) if value is not None else np.array(0, "float32")
    return [ctx.broadcast_to(ctx.const(fill), shape)]


@fission("Range", 11)
def range_(ctx: Lowering, n: OnnxNode) -> list[str]:
    start, limit, delta = (ctx.require_const(v, "Range's bounds").reshape(()) for v in n.inputs[:3])
    return [ctx.const(np.arange(start, limit, delta, dtype=start.dtype))]


# ------------------------------------------------------------------ reshaping


@fission("Reshape", 5)
def reshape(ctx: Lowering, n: OnnxNode) -> list[str]:
    x = n.inputs[0]
    dims = ctx.ints(n.inputs[1], "Reshape's shape")
    in_shape = ctx.shape(x)
    if not n.attr("allowzero", 0):
        dims = [in_shape[i] if d == 0 else d for i, d in enumerate(dims)]
    if dims.count(-1) > 1:
        raise KorchError(f"Reshape to {dims} has more than one -1")
    if -1 in dims:
        known = math.prod(d for d in dims if d != -1)
        if known == 0 or ctx.type(x).numel % known:
            raise KorchError(f"cannot reshape {list(in_shape)} to {dims}")
        dims[dims.index(-1)] = ctx.type(x).numel // known
    if math.prod(dims) != ctx.type(x).numel:
        raise KorchError(f"cannot reshape {list(in_shape)} to {dims}")
    return [ctx.reshape(x, dims)]


@fission("Flatten", 1)
def flatten(ctx: Lowering, n: OnnxNode) -> list[str]:
    x = n.inputs[0]
    shape = ctx.shape(x)
    axis = n.attr("axis", 1)
    axis = axis + len(shape) if axis < 0 else axis
    return [ctx.reshape(x, (math.prod(shape[:axis]), math.prod(shape[axis:])))]


def _axes_arg(ctx: Lowering, n: OnnxNode) -> list[int] | None:
    axes = ctx.ints(n.input(1), "axes")
    return axes if axes is not None else n.attrs.get("axes")


@fission("Squeeze", 1)
def squeeze(ctx: Lowering, n: OnnxNode) -> list[str]:
    x = n.inputs[0]
    shape = ctx.shape(x)
    axes = _axes_arg(ctx, n)
    axes = normalize_axes(axes, len(shape)) if axes else [i for i, d in enumerate(shape) if d == 1]
    if any(shape[a] != 1 for a in axes):
        raise KorchError(f"cannot squeeze axes {list(axes)} of shape {list(shape)}")
    return [ctx.reshape(x, [d for i, d in enumerate(shape) if i not in axes])]


@fission("Unsqueeze", 1)
def unsqueeze(ctx: Lowering, n: OnnxNode) -> list[str]:
    x = n.inputs[0]
    shape = list(ctx.shape(x))
    axes = _axes_arg(ctx, n)
    axes = normalize_axes(axes, len(shape) + len(axes))
    for a in axes:
        shape.insert(a, 1)
    return [ctx.reshape(x, shape)]


@fission("Transpose", 1)
def transpose(ctx: Lowering, n: OnnxNode) -> list[str]:
    x = n.inputs[0]
    perm = n.attr("perm", list(reversed(range(ctx.rank(x)))))
    return [ctx.transpose(x, perm)]


@fission("Expand", 8)
def expand(ctx: Lowering, n: OnnxNode) -> list[str]:
    x = n.inputs[0]
    target = ctx.ints(n.inputs[1], "Expand's shape")
    try:
        shape = np.broadcast_shapes(ctx.shape(x), tuple(target))
    except ValueError:
        raise KorchError(f"cannot expand {list(ctx.shape(x))} to {target}") from None
    return [ctx.broadcast_to(x, shape)]


@fission("Tile", 6)
def tile(ctx: Lowering, n: OnnxNode) -> list[str]:
    """Tile as reshape -> broadcast -> reshape: [a, b] x (r, s) -> [1, a, 1, b] -> [r, a, s, b]."""
    x = n.inputs[0]
    shape = ctx.shape(x)
    reps = ctx.ints(n.inputs[1], "Tile's repeats")
    if len(reps) != len(shape):
        raise KorchError(f"Tile repeats {reps} do not match rank {len(shape)}")
    return [tile_core(ctx, x, reps)]


def _depth_space(ctx: Lowering, x: str, split: list[int], perm: list[int], out: list[int]) -> str:
    return ctx.reshape(ctx.transpose(ctx.reshape(x, split), perm), out)


def _depth_mode(n: OnnxNode) -> str:
    mode = n.attr("mode", "DCR")
    if mode not in ("DCR", "CRD"):
        raise KorchError(f"{n.op_type} mode {mode!r} is not DCR or CRD")
    return mode


@fission("DepthToSpace", 1)
def depth_to_space(ctx: Lowering, n: OnnxNode) -> list[str]:
    x = n.inputs[0]
    b, c, h, w = ctx.shape(x)
    s = n.attr("blocksize")
    out = [b, c // (s * s), h * s, w * s]
    if _depth_mode(n) == "DCR":
        return [_depth_space(ctx, x, [b, s, s, c // (s * s), h, w], [0, 3, 4, 1, 5, 2], out)]
    return [_depth_space(ctx, x, [b, c // (s * s), s, s, h, w], [0, 1, 4, 2, 5, 3], out)]


@fission("SpaceToDepth", 1)
def space_to_depth(ctx: Lowering, n: OnnxNode) -> list[str]:
    x = n.inputs[0]
    b, c, h, w = ctx.shape(x)
    s = n.attr("blocksize")
    split = [b, c, h // s, s, w // s, s]
    # DCR (the only mode before opset 28): blocks outermost in the depth; CRD: channels outermost
    perm = [0, 3, 5, 1, 2, 4] if _depth_mode(n) == "DCR" else [0, 1, 3, 5, 2, 4]
    return [_depth_space(ctx, x, split, perm, [b, c * s * s, h // s, w // s])]


# ------------------------------------------------------------ slicing, joining


@fission("Slice", 1)
def slice_(ctx: Lowering, n: OnnxNode) -> list[str]:
    x = n.inputs[0]
    shape = ctx.shape(x)
    if n.opset < 10:
        starts, ends = n.attr("starts"), n.attr("ends")
        axes, steps = n.attrs.get("axes"), None
    else:
        starts = ctx.ints(n.inputs[1], "Slice starts")
        ends = ctx.ints(n.inputs[2], "Slice ends")
        axes, steps = ctx.ints(n.input(3), "Slice axes"), ctx.ints(n.input(4), "Slice steps")
    axes = list(range(len(starts))) if axes is None else [a + len(shape) if a < 0 else a for a in axes]
    steps = steps or [1] * len(starts)
    first, step_all, sizes = [0] * len(shape), [1] * len(shape), list(shape)
    for axis, start, end, step in zip(axes, starts, ends, steps):
        first[axis], sizes[axis] = slice_bounds(shape[axis], start, end, step)
        step_all[axis] = step
        if sizes[axis] == 0:
            first[axis], step_all[axis] = 0, 1
    if first == [0] * len(shape) and step_all == [1] * len(shape) and sizes == list(shape):
        return [x]
    return [ctx.emit(Prim.SLICE, x, starts=first, steps=step_all, sizes=sizes)]


@fission("Split", 1)
def split(ctx: Lowering, n: OnnxNode) -> list[str]:
    x = n.inputs[0]
    shape = ctx.shape(x)
    (axis,) = normalize_axes([n.attr("axis", 0)], len(shape))
    sizes = ctx.ints(n.input(1), "Split sizes") if n.opset >= 13 else n.attrs.get("split")
    if not sizes:
        parts = n.attr("num_outputs", n.n_outputs)
        chunk = math.ceil(shape[axis] / parts)
        sizes = [min(chunk, shape[axis] - i * chunk) for i in range(parts)]
    if sum(sizes) != shape[axis] or len(sizes) != n.n_outputs:
        raise KorchError(f"Split sizes {sizes} do not cover dimension {shape[axis]}")
    outs, offset = [], 0
    for size in sizes:
        outs.append(ctx.slice_axis(x, axis, offset, size))
        offset += size
    return outs


@fission("Concat", 1)
def concat(ctx: Lowering, n: OnnxNode) -> list[str]:
    rank = ctx.rank(n.inputs[0])
    (axis,) = normalize_axes([n.attr("axis")], rank)
    return [ctx.concat(n.inputs, axis)]


@fission("Gather", 1)
def gather(ctx: Lowering, n: OnnxNode) -> list[str]:
    data, indices = n.inputs[:2]
    (axis,) = normalize_axes([n.attr("axis", 0)], ctx.rank(data))
    return [ctx.emit(Prim.GATHER, data, indices, axis=axis)]


@fission("Pad", 2)
def pad(ctx: Lowering, n: OnnxNode) -> list[str]:
    x = n.inputs[0]
    rank = ctx.rank(x)
    mode = n.attr("mode", "constant")
    if mode not in ("constant", "reflect", "edge"):
        ctx.unsupported(f"Pad mode {mode}")
    if n.opset < 11:
        pads, value = list(n.attr("pads")), float(n.attr("value", 0.0))
        axes = None
    else:
        pads = ctx.ints(n.inputs[1], "Pad pads")
        cv = ctx.const_value(n.input(2))
        if n.input(2) is not None and cv is None:
            raise KorchError("Pad constant_value must be known at compile time")
        value = cv.reshape(-1)[0].item() if cv is not None and cv.size else 0.0
        axes = ctx.ints(n.input(3), "Pad axes")
    if axes is not None:
        axes = [a + rank if a < 0 else a for a in axes]
        full = [0] * (2 * rank)
        for i, a in enumerate(axes):
            full[a], full[rank + a] = pads[i], pads[len(axes) + i]
        pads = full
    # negative pads crop
    for axis in range(rank):
        before, after = pads[axis], pads[rank + axis]
        if before < 0 or after < 0:
            dim = ctx.shape(x)[axis]
            lo, hi = max(-before, 0), max(-after, 0)
            x = ctx.slice_axis(x, axis, lo, dim - lo - hi)
    pads = [max(p, 0) for p in pads]
    if not any(pads):
        return [x]
    if ctx.dtype(x) == "bool" or ctx.dtype(x).startswith(("int", "uint")):
        value = int(value)
    return [ctx.emit(Prim.PAD, x, pads=pads, mode=mode, value=value)]


@fission("CenterCropPad", 18)
def center_crop_pad(ctx: Lowering, n: OnnxNode) -> list[str]:
    """Each axis cropped or zero-padded to its target size, centred (the extra element of an odd
    difference at the end)."""
    x = n.inputs[0]
    rank = ctx.rank(x)
    if ctx.const_value(n.inputs[1]) is None:  # (ONNX Runtime can run it whole)
        ctx.unsupported("CenterCropPad with a shape known only at run time")
    sizes = ctx.ints(n.inputs[1], "CenterCropPad shape")
    axes = n.attr("axes", None)
    axes = list(range(rank)) if axes is None else [a + rank if a < 0 else a for a in axes]
    pads = [0] * (2 * rank)
    for a, size in zip(axes, sizes):
        dim = ctx.shape(x)[a]
        if size < dim:
            x = ctx.slice_axis(x, a, (dim - size) // 2, size)
        elif size > dim:
            pads[a], pads[rank + a] = (size - dim) // 2, size - dim - (size - dim) // 2
    if not any(pads):
        return [x]
    value = 0 if ctx.dtype(x) == "bool" or ctx.dtype(x).startswith(("int", "uint")) else 0.0
    return [ctx.emit(Prim.PAD, x, pads=pads, mode="constant", value=value)]


@fission("Trilu", 14)
def trilu(ctx: Lowering, n: OnnxNode) -> list[str]:
    x = n.inputs[0]
    k = ctx.ints(n.input(1), "Trilu k")
    k = k[0] if k else 0
    rows, cols = ctx.shape(x)[-2:]
    diff = np.arange(cols)[None, :] - np.arange(rows)[:, None]
    mask = diff >= k if n.attr("upper", 1) else diff <= k
    return [ctx.elementwise(Prim.WHERE, ctx.const(mask), x, ctx.scalar(0, ctx.dtype(x)))]


# ------------------------------------------------------------ indexed gathers


@fission("GatherElements", 11, 13)
def gather_elements(ctx: Lowering, n: OnnxNode) -> list[str]:
    """A gather from the flattened data: flat = wrap(index) * stride(axis) + the offset of the other
    coordinates (a constant, size 1 along axis)."""
    data, idx = n.inputs[:2]
    return [gather_elements_core(ctx, data, idx, n.attr("axis", 0))]


@fission("GatherND", 11, 12, 13)
def gather_nd(ctx: Lowering, n: OnnxNode) -> list[str]:
    """Index tuples become flat rows of the data viewed as [batch * indexed block, *rest], then one
    gather along axis 0."""
    data, idx = n.inputs[:2]
    rows, flat_shape = nd_rows(ctx, data, idx, n.attr("batch_dims", 0), "GatherND")
    return [ctx.emit(Prim.GATHER, ctx.reshape(data, flat_shape), rows, axis=0)]


def nd_rows(ctx: Lowering, data: str, idx: str, b: int, op: str) -> tuple[str, tuple[int, ...]]:
    """GatherND's and ScatterND's index tuples (the last axis of idx, after b batch axes) as rows of
    the data viewed as [batch * indexed block, *rest]: flat = sum(wrap(index) * block strides) +
    batch offset. Returns the rows (idx's shape less its last axis) and that view's shape."""
    shape, ishape = ctx.shape(data), ctx.shape(idx)
    m = ishape[-1] if ishape else 0
    if not (0 <= b < min(len(shape), len(ishape)) and ishape[:b] == shape[:b] and 1 <= m <= len(shape) - b):
        raise KorchError(f"{op} indices {list(ishape)} do not fit data {list(shape)} (batch_dims {b})")
    inner, rest = shape[b : b + m], shape[b + m :]
    idx = ctx.cast(idx, index_dtype(ctx.dtype(idx), math.prod(shape[: b + m])))
    wrapped = wrap_negative(ctx, idx, np.array(inner))
    if m == 1:
        rows = ctx.reshape(wrapped, ishape[:-1])
    else:
        scaled = affine_index(ctx, wrapped, np.array(row_strides(inner)), np.zeros((), "int64"))
        rows = ctx.reduce(Prim.REDUCE_SUM, scaled, [len(ishape) - 1], keepdims=False)
    batch = np.indices(ishape[:b], dtype="int64")
    offset = sum((c * s for c, s in zip(batch, row_strides(ishape[:b]))), np.zeros((), "int64"))
    offset = np.reshape(offset * math.prod(inner), ishape[:b] + (1,) * (len(ishape) - 1 - b))
    return affine_index(ctx, rows, 1, offset), (math.prod(shape[: b + m]), *rest)


@fission("OneHot", 9, 11)
def one_hot(ctx: Lowering, n: OnnxNode) -> list[str]:
    """where(index == arange(depth), on, off) with the classes along `axis`. Negative indices count
    from depth (from opset 11 by the spec; ONNX Runtime does so at opset 9 too, and so does this)."""
    idx, depth_v, values = n.inputs[:3]
    depth = ctx.require_const(depth_v, "OneHot depth").reshape(-1)
    if depth.size != 1 or int(depth[0]) < 1:
        raise KorchError(f"OneHot depth must be one positive number, got {depth.tolist()}")
    depth = int(depth[0])
    if ctx.type(values).numel != 2:
        raise KorchError(f"OneHot values must be [off, on], got shape {list(ctx.shape(values))}")
    ishape = ctx.shape(idx)
    rank = len(ishape)
    axis = n.attr("axis", -1)
    if not -rank - 1 <= axis <= rank:
        raise KorchError(f"OneHot axis {axis} out of range for rank {rank}")
    axis = axis + rank + 1 if axis < 0 else axis
    # float indices truncate (as ONNX Runtime's cast does); small integer types widen so +depth fits
    idx = ctx.cast(idx, index_dtype(ctx.dtype(idx), depth))
    idx = wrap_negative(ctx, idx, depth)
    idx = ctx.reshape(idx, ishape[:axis] + (1,) + ishape[axis:])
    classes = np.arange(depth, dtype=ctx.dtype(idx)).reshape((depth,) + (1,) * (rank - axis))
    hot = ctx.elementwise(Prim.EQ, idx, ctx.const(classes))
    dtype = ctx.dtype(values)
    pair = ctx.const_value(values)
    if pair is not None and pair.reshape(-1).tolist() == [0, 1]:
        return [ctx.cast(hot, dtype)]
    flat = ctx.reshape(values, (2,))
    off, on = (ctx.reshape(ctx.slice_axis(flat, 0, i, 1), ()) for i in (0, 1))
    return [ctx.elementwise(Prim.WHERE, hot, on, off)]


@fission("EyeLike", 9)
def eye_like(ctx: Lowering, n: OnnxNode) -> list[str]:
    x = n.inputs[0]
    if ctx.rank(x) != 2:
        raise KorchError(f"EyeLike needs a 2-D input, got shape {list(ctx.shape(x))}")
    dtype = onnx_dtype(n.attrs["dtype"]) if "dtype" in n.attrs else ctx.dtype(x)
    rows, cols = ctx.shape(x)
    return [ctx.const(np.eye(rows, cols, n.attr("k", 0), dtype=dtype))]


@fission("Compress", 9, 11)
def compress(ctx: Lowering, n: OnnxNode) -> list[str]:
    """The selected entries of a constant condition, gathered (or sliced) along the axis; condition
    entries past the axis length are ignored, as ONNX Runtime does."""
    x, cond = n.inputs[:2]
    mask = ctx.require_const(cond, "Compress condition").reshape(-1).astype(bool)
    if "axis" in n.attrs:
        (axis,) = normalize_axes([n.attrs["axis"]], ctx.rank(x))
    else:
        x, axis = ctx.reshape(x, (ctx.type(x).numel,)), 0
    return [take(ctx, x, axis, np.flatnonzero(mask[: ctx.shape(x)[axis]]))]


@fission("ReverseSequence", 10)
def reverse_sequence(ctx: Lowering, n: OnnxNode) -> list[str]:
    """A gather from x viewed as [time * batch, *rest]: row (t, b) reads time lens[b] - 1 - t while
    t < lens[b], else t. Indices are constant for constant lens, a few elementwise ops otherwise."""
    x, lens = n.inputs[:2]
    shape = ctx.shape(x)
    batch_axis, time_axis = n.attr("batch_axis", 1), n.attr("time_axis", 0)
    if len(shape) < 2 or {batch_axis, time_axis} != {0, 1}:
        raise KorchError(f"ReverseSequence axes (batch {batch_axis}, time {time_axis}) must be 0 and 1")
    if ctx.shape(lens) != (shape[batch_axis],):
        raise KorchError(f"ReverseSequence lengths {list(ctx.shape(lens))} != batch {shape[batch_axis]}")
    cols = shape[1]
    lead = (1, shape[1]) if time_axis == 0 else (shape[0], 1)  # the lengths laid out along batch
    time = np.arange(shape[time_axis], dtype="int64").reshape((-1, 1) if time_axis == 0 else (1, -1))
    batch_part = np.arange(shape[batch_axis]).reshape(lead) * (cols if batch_axis == 0 else 1)
    time_stride = cols if time_axis == 0 else 1
    value = ctx.const_value(lens)
    if value is not None:
        lengths = value.astype("int64").reshape(lead)
        if np.any(lengths < 0) or np.any(lengths > shape[time_axis]):
            raise KorchError(f"ReverseSequence lengths {value.tolist()} out of [0, {shape[time_axis]}]")
        source = np.where(time < lengths, lengths - 1 - time, time)
        if np.array_equal(np.broadcast_to(source, shape[:2]), np.broadcast_to(time, shape[:2])):
            return [x]
        rows = ctx.const(source * time_stride + batch_part)
    else:
        lengths = ctx.reshape(ctx.cast(lens, "int64"), lead)
        inside = ctx.elementwise(Prim.LT, ctx.const(time), lengths)
        reversed_ = ctx.elementwise(Prim.SUB, lengths, ctx.const(time + 1))
        source = ctx.elementwise(Prim.WHERE, inside, reversed_, ctx.const(time))
        rows = affine_index(ctx, source, time_stride, batch_part)
    flat = ctx.reshape(x, (shape[0] * shape[1], *shape[2:]))
    return [ctx.emit(Prim.GATHER, flat, rows, axis=0)]
