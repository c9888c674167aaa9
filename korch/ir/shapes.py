"""Each primitive's shape/dtype rule: (operand types, attributes) -> result types, or a ShapeError.
The table in korch.ir.prims names the rule of each primitive."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from korch.ir.tensor_type import FLOAT_DTYPES, INT_DTYPES, ShapeError, TensorType

NUMERIC = FLOAT_DTYPES + INT_DTYPES
SCATTER_REDUCTIONS = ("none", "add", "mul", "max", "min")


def _check(cond: bool, msg: str) -> None:
    if not cond:
        raise ShapeError(msg)


def _arity(types: list, n: int, name: str) -> None:
    _check(len(types) == n, f"{name} takes {n} operand(s), got {len(types)}")


# ---------------------------------------------------------------- elementwise


def _elementwise_shape(types: list[TensorType], name: str) -> tuple[int, ...]:
    """Operands are either the full output shape or rank-0 scalars; other broadcasts are explicit."""
    shapes = {t.shape for t in types if t.rank > 0}
    _check(len(shapes) <= 1, f"{name}: operand shapes differ {[t.shape for t in types]}")
    return shapes.pop() if shapes else ()


def _same_dtype(types: list[TensorType], name: str, allowed: Sequence[str] | None = None) -> str:
    dtypes = {t.dtype for t in types}
    _check(len(dtypes) == 1, f"{name}: operand dtypes differ {sorted(dtypes)}")
    dtype = dtypes.pop()
    _check(allowed is None or dtype in allowed, f"{name}: dtype {dtype} not supported")
    return dtype


def unary(name: str, allowed: Sequence[str]):
    """One operand of a dtype in `allowed`; the result has its type."""

    def infer(types, attrs):
        _arity(types, 1, name)
        return [TensorType(types[0].shape, _same_dtype(types, name, allowed))]

    return infer


def binary(name: str, allowed: Sequence[str], out_dtype: str | None = None):
    """Two operands of one dtype in `allowed`; the result is of `out_dtype` (else theirs)."""

    def infer(types, attrs):
        _arity(types, 2, name)
        dtype = _same_dtype(types, name, allowed)
        return [TensorType(_elementwise_shape(types, name), out_dtype or dtype)]

    return infer


def cast(types, attrs):
    _arity(types, 1, "cast")
    return [TensorType(types[0].shape, attrs["to"])]


def where(types, attrs):
    _arity(types, 3, "where")
    _check(types[0].dtype == "bool", "where: condition must be bool")
    dtype = _same_dtype(types[1:], "where")
    return [TensorType(_elementwise_shape(types, "where"), dtype)]


# ------------------------------------------------------------------ broadcast


def broadcast(types, attrs):
    _arity(types, 1, "broadcast")
    shape = tuple(attrs["shape"])
    try:
        ok = np.broadcast_shapes(types[0].shape, shape) == shape
    except ValueError:
        ok = False
    _check(ok, f"broadcast: {types[0].shape} cannot broadcast to {shape}")
    return [TensorType(shape, types[0].dtype)]


# --------------------------------------------------------------------- reduce


def reduce(types, attrs):
    """Keepdims always: the reduced axes stay as size 1."""
    _arity(types, 1, "reduce")
    t = types[0]
    axes = tuple(attrs["axes"])
    _check(
        list(axes) == sorted(set(axes)) and all(0 <= a < t.rank for a in axes),
        f"reduce: axes {axes} must be sorted, unique and in range for rank {t.rank}",
    )
    shape = tuple(1 if i in axes else d for i, d in enumerate(t.shape))
    return [TensorType(shape, t.dtype)]


def arg_reduce(types, attrs):
    """argmax and argmin: int64 indices, the axis kept as size 1."""
    _arity(types, 1, "argmax")
    t = types[0]
    axis = attrs["axis"]
    _check(0 <= axis < t.rank, f"argmax: axis {axis} out of range")
    return [TensorType(tuple(1 if i == axis else d for i, d in enumerate(t.shape)), "int64")]


def argsort(types, attrs):
    _arity(types, 1, "argsort")
    t = types[0]
    _check(0 <= attrs["axis"] < t.rank, f"argsort: axis {attrs['axis']} out of range")
    _check(t.dtype in NUMERIC, f"argsort: dtype {t.dtype} not supported")
    return [TensorType(t.shape, "int64")]


# --------------------------------------------------------------------- layout


def reshape(types, attrs):
    _arity(types, 1, "reshape")
    shape = tuple(attrs["shape"])
    _check(math.prod(shape) == types[0].numel, f"reshape: {types[0].shape} to {shape}")
    return [TensorType(shape, types[0].dtype)]


def transpose(types, attrs):
    _arity(types, 1, "transpose")
    perm = tuple(attrs["perm"])
    _check(sorted(perm) == list(range(types[0].rank)), f"transpose: bad perm {perm}")
    return [TensorType(tuple(types[0].shape[p] for p in perm), types[0].dtype)]


def slice_(types, attrs):
    """Element i along axis k comes from starts[k] + i * steps[k]; sizes is the output shape."""
    _arity(types, 1, "slice")
    t = types[0]
    starts, steps, sizes = attrs["starts"], attrs["steps"], attrs["sizes"]
    _check(len(starts) == len(steps) == len(sizes) == t.rank, "slice: one entry per axis")
    for dim, start, step, size in zip(t.shape, starts, steps, sizes):
        last = start + (size - 1) * step
        _check(step != 0, "slice: zero step")
        _check(size == 0 or (0 <= start < dim and 0 <= last < dim), "slice: out of bounds")
    return [TensorType(tuple(sizes), t.dtype)]


def concat(types, attrs):
    _check(len(types) >= 1, "concat: needs an operand")
    axis = attrs["axis"]
    dtype = _same_dtype(types, "concat")
    first = types[0].shape
    _check(0 <= axis < len(first), f"concat: axis {axis} out of range")
    for t in types:
        _check(
            t.rank == len(first) and all(t.shape[i] == first[i] for i in range(t.rank) if i != axis),
            f"concat: shapes {[t.shape for t in types]} differ off axis {axis}",
        )
    size = sum(t.shape[axis] for t in types)
    return [TensorType(first[:axis] + (size,) + first[axis + 1 :], dtype)]


def pad(types, attrs):
    _arity(types, 1, "pad")
    t = types[0]
    pads, mode = attrs["pads"], attrs["mode"]
    _check(len(pads) == 2 * t.rank and min(pads, default=0) >= 0, f"pad: bad pads {pads}")
    _check(mode in ("constant", "reflect", "edge"), f"pad: unknown mode {mode}")
    begins, ends = pads[: t.rank], pads[t.rank :]
    if mode == "reflect":
        _check(all(max(b, e) < d for b, e, d in zip(begins, ends, t.shape)), "pad: reflect too wide")
    if mode == "edge":
        _check(all(d > 0 for b, e, d in zip(begins, ends, t.shape) if b or e), "pad: edge of empty")
    return [TensorType(tuple(d + b + e for d, b, e in zip(t.shape, begins, ends)), t.dtype)]


def gather(types, attrs):
    _arity(types, 2, "gather")
    data, idx = types
    axis = attrs["axis"]
    _check(0 <= axis < data.rank, f"gather: axis {axis} out of range")
    _check(idx.dtype in ("int64", "int32"), "gather: indices must be int32 or int64")
    shape = data.shape[:axis] + idx.shape + data.shape[axis + 1 :]
    return [TensorType(shape, data.dtype)]


def window(types, attrs):
    """Sliding windows over the last len(kernel) axes: [..., *spatial] -> [..., *out, *kernel]."""
    _arity(types, 1, "window")
    t = types[0]
    kernel, strides, dil = attrs["kernel"], attrs["strides"], attrs["dilations"]
    k = len(kernel)
    _check(0 < k <= t.rank and len(strides) == len(dil) == k, "window: bad attributes")
    out = []
    for size, kk, s, d in zip(t.shape[t.rank - k :], kernel, strides, dil):
        extent = (kk - 1) * d + 1
        _check(size >= extent and s > 0, f"window: kernel {kernel} larger than input {t.shape}")
        out.append((size - extent) // s + 1)
    return [TensorType(t.shape[: t.rank - k] + tuple(out) + tuple(kernel), t.dtype)]


def scatter(types, attrs):
    """data [N, *rest], index [M] (0 <= index < N), updates [M, *rest] -> data with row index[i]
    replaced by (or combined by the reduction with) row i of updates."""
    _arity(types, 3, "scatter")
    data, idx, upd = types
    reduction = attrs["reduction"]
    _check(reduction in SCATTER_REDUCTIONS, f"scatter: unknown reduction {reduction}")
    _check(data.rank >= 1 and idx.rank == 1, "scatter: data needs an axis to index, the index one axis")
    _check(idx.dtype in ("int64", "int32"), "scatter: indices must be int32 or int64")
    _check(upd.shape == idx.shape + data.shape[1:], f"scatter: updates {upd.shape} do not fit {data.shape}")
    _check(upd.dtype == data.dtype, "scatter: updates and data differ in dtype")
    _check(reduction == "none" or data.dtype != "bool", "scatter: bool data takes no reduction")
    return [data]


# --------------------------------------------------------------------- linear


def matmul(types, attrs):
    _arity(types, 2, "matmul")
    a, b = types
    dtype = _same_dtype(types, "matmul", NUMERIC)
    _check(a.rank >= 2 and b.rank >= 2, "matmul: operands need rank >= 2")
    _check(a.shape[-1] == b.shape[-2], f"matmul: {a.shape} @ {b.shape}")
    try:
        batch = np.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    except ValueError:
        raise ShapeError(f"matmul: batch dims {a.shape} @ {b.shape}") from None
    return [TensorType(tuple(batch) + (a.shape[-2], b.shape[-1]), dtype)]


def grouped_matmul(types, attrs):
    """x [S, K], w [E, K, N], ends [E] -> [S, N] (korch.ir.numpy_ops.grouped_matmul)."""
    _arity(types, 3, "grouped_matmul")
    x, w, ends = types
    dtype = _same_dtype(types[:2], "grouped_matmul", NUMERIC)
    _check(x.rank == 2 and w.rank == 3 and ends.rank == 1, "grouped_matmul: x [S, K], w [E, K, N], ends [E]")
    _check(
        x.shape[1] == w.shape[1] and ends.shape[0] == w.shape[0],
        f"grouped_matmul: {x.shape}, {w.shape}, {ends.shape}",
    )
    _check(ends.dtype in ("int32", "int64"), "grouped_matmul: integer ends")
    return [TensorType((x.shape[0], w.shape[2]), dtype)]


def _conv_operands(types, a, name: str):
    """A convolution's (or a transposed one's) input and weight, dtype, number of spatial axes, and
    its strides, pads and dilations, checked."""
    _arity(types, 2, name)
    x, w = types
    dtype = _same_dtype(types, name, FLOAT_DTYPES)
    nd = w.rank - 2
    _check(nd >= 1 and x.rank == w.rank, f"{name}: input {x.shape}, weight {w.shape}")
    strides, pads, dil = tuple(a["strides"]), tuple(a["pads"]), tuple(a["dilations"])
    _check(len(strides) == len(dil) == nd and len(pads) == 2 * nd, "conv: bad attribute lengths")
    _check(min(strides) > 0 and min(dil) > 0 and min(pads, default=0) >= 0, "conv: bad attributes")
    return x, w, dtype, nd, (strides, pads, dil)


def conv(types, attrs):
    x, w, dtype, nd, (strides, pads, dil) = _conv_operands(types, attrs, "conv")
    g = attrs["group"]
    _check(g >= 1 and x.shape[1] == w.shape[1] * g and w.shape[0] % g == 0, "conv: channels/group")
    out = []
    for i in range(nd):
        extent = (w.shape[2 + i] - 1) * dil[i] + 1
        size = x.shape[2 + i] + pads[i] + pads[nd + i] - extent
        _check(size >= 0, f"conv: kernel {w.shape} larger than padded input {x.shape}")
        out.append(size // strides[i] + 1)
    return [TensorType((x.shape[0], w.shape[0], *out), dtype)]


def conv_transpose(types, attrs):
    x, w, dtype, nd, (strides, pads, dil) = _conv_operands(types, attrs, "conv_transpose")
    g, opad = attrs["group"], attrs["output_padding"]
    _check(g >= 1 and x.shape[1] == w.shape[0] and w.shape[0] % g == 0, "conv_transpose: channels")
    out = []
    for i in range(nd):
        full = (x.shape[2 + i] - 1) * strides[i] + (w.shape[2 + i] - 1) * dil[i] + 1 + opad[i]
        size = full - pads[i] - pads[nd + i]
        _check(size > 0, "conv_transpose: pads remove the whole output")
        out.append(size)
    return [TensorType((x.shape[0], w.shape[1] * g, *out), dtype)]


# --------------------------------------------------------------------- opaque


def opaque(types, attrs):
    """The types the embedded one-operator model was imported with, in and out."""
    expected = [TensorType(tuple(s), d) for s, d in attrs["in_types"]]
    _check(list(types) == expected, f"opaque {attrs['op_type']}: inputs {types} != {expected}")
    return [TensorType(tuple(s), d) for s, d in attrs["out_types"]]
