"""Fission rules for layout operators and the static shape arithmetic that folds away at import."""

from __future__ import annotations

import math

import numpy as np
from onnx import numpy_helper

from korch.errors import KorchError
from korch.frontend.lowering import Lowering, OnnxNode, fission, normalize_axes
from korch.prims import Prim

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


def tile_core(ctx: Lowering, x: str, reps) -> str:
    shape = ctx.shape(x)
    if all(r == 1 for r in reps):
        return x
    interleaved = [v for d in shape for v in (1, d)]
    wide = [v for r, d in zip(reps, shape) for v in (r, d)]
    y = ctx.broadcast_to(ctx.reshape(x, interleaved), wide)
    return ctx.reshape(y, [r * d for r, d in zip(reps, shape)])


def _depth_space(ctx: Lowering, x: str, split: list[int], perm: list[int], out: list[int]) -> str:
    return ctx.reshape(ctx.transpose(ctx.reshape(x, split), perm), out)


@fission("DepthToSpace", 1)
def depth_to_space(ctx: Lowering, n: OnnxNode) -> list[str]:
    x = n.inputs[0]
    b, c, h, w = ctx.shape(x)
    s = n.attr("blocksize")
    out = [b, c // (s * s), h * s, w * s]
    if n.attr("mode", "DCR") == "DCR":
        return [_depth_space(ctx, x, [b, s, s, c // (s * s), h, w], [0, 3, 4, 1, 5, 2], out)]
    return [_depth_space(ctx, x, [b, c // (s * s), s, s, h, w], [0, 1, 4, 2, 5, 3], out)]


@fission("SpaceToDepth", 1)
def space_to_depth(ctx: Lowering, n: OnnxNode) -> list[str]:
    x = n.inputs[0]
    b, c, h, w = ctx.shape(x)
    s = n.attr("blocksize")
    split = [b, c, h // s, s, w // s, s]
    return [_depth_space(ctx, x, split, [0, 3, 5, 1, 2, 4], [b, c * s * s, h // s, w // s])]


# ------------------------------------------------------------ slicing, joining


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


@fission("Trilu", 14)
def trilu(ctx: Lowering, n: OnnxNode) -> list[str]:
    x = n.inputs[0]
    k = ctx.ints(n.input(1), "Trilu k")
    k = k[0] if k else 0
    rows, cols = ctx.shape(x)[-2:]
    diff = np.arange(cols)[None, :] - np.arange(rows)[:, None]
    mask = diff >= k if n.attr("upper", 1) else diff <= k
    return [ctx.elementwise(Prim.WHERE, ctx.const(mask), x, ctx.scalar(0, ctx.dtype(x)))]
