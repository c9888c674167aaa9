"""The closed set of tensor primitives: each one's kind, shape/dtype rule and numpy reference."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import Enum, IntEnum

import ml_dtypes  # noqa: F401  (registers "bfloat16" as a numpy dtype)
import numpy as np
import scipy.special
from numpy.lib.stride_tricks import sliding_window_view

from korch.errors import KorchError


class Kind(IntEnum):
    """Primitive kinds, ordered from most to least fusible (a comparison answers legality questions)."""

    ELEMENTWISE = 0
    BROADCAST = 1
    REDUCE = 2
    LAYOUT = 3
    LINEAR = 4
    OPAQUE = 5


DTYPES = {
    "float32": "f32",
    "float16": "f16",
    "float64": "f64",
    "bfloat16": "bf16",
    "int64": "i64",
    "int32": "i32",
    "int16": "i16",
    "int8": "i8",
    "uint8": "u8",
    "bool": "bool",
}
FLOAT_DTYPES = ("float32", "float16", "float64", "bfloat16")
HALF_DTYPES = ("float16", "bfloat16")  # computed in float32 where rounding at every step would show
INT_DTYPES = ("int64", "int32", "int16", "int8", "uint8")


BFLOAT16 = np.dtype("bfloat16")


def is_float(dtype: str) -> bool:
    return dtype in FLOAT_DTYPES


def from_npy(array: np.ndarray) -> np.ndarray:
    """An array read back from an .npy or .npz file: numpy writes bfloat16 (a type it knows only
    through ml_dtypes) as raw 2-byte records, and korch has no other such dtype, so those are
    bfloat16 again; other arrays are returned as they are."""
    if array.dtype.kind == "V" and array.dtype.itemsize == 2:
        return array.view(BFLOAT16)
    return array


class ShapeError(KorchError):
    """A primitive was applied to operands its shape/dtype rule rejects."""


@dataclass(frozen=True)
class TensorType:
    shape: tuple[int, ...]
    dtype: str

    def __post_init__(self):
        if self.dtype not in DTYPES:
            raise ShapeError(f"unsupported dtype {self.dtype}")
        if any((not isinstance(d, int)) or d < 0 for d in self.shape):
            raise ShapeError(f"bad shape {self.shape}")

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.numel * np.dtype(self.dtype).itemsize

    def __str__(self) -> str:
        return f"{DTYPES[self.dtype]}[{','.join(map(str, self.shape))}]"

    @staticmethod
    def of(array: np.ndarray) -> TensorType:
        return TensorType(tuple(int(d) for d in array.shape), str(array.dtype))


class Prim(str, Enum):
    # elementwise, unary
    NEG = "neg"
    ABS = "abs"
    EXP = "exp"
    LOG = "log"
    SQRT = "sqrt"
    RECIPROCAL = "reciprocal"
    ERF = "erf"
    TANH = "tanh"
    SIGMOID = "sigmoid"
    FLOOR = "floor"
    CEIL = "ceil"
    ROUND = "round"
    SIN = "sin"
    COS = "cos"
    ATAN = "atan"
    SIGN = "sign"
    NOT = "not"
    CAST = "cast"
    # elementwise, binary and ternary
    ADD = "add"
    SUB = "sub"
    MUL = "mul"
    DIV = "div"
    POW = "pow"
    MAX = "max"
    MIN = "min"
    EQ = "eq"
    LT = "lt"
    GT = "gt"
    AND = "and"
    OR = "or"
    XOR = "xor"
    WHERE = "where"
    # broadcast
    BROADCAST = "broadcast"
    # reduce (keepdims always: reduced axes stay as size 1)
    REDUCE_SUM = "reduce_sum"
    REDUCE_MAX = "reduce_max"
    REDUCE_MIN = "reduce_min"
    REDUCE_PROD = "reduce_prod"
    ARGMAX = "argmax"
    ARGMIN = "argmin"
    ARGSORT = "argsort"
    # layout
    RESHAPE = "reshape"
    TRANSPOSE = "transpose"
    SLICE = "slice"
    CONCAT = "concat"
    PAD = "pad"
    GATHER = "gather"
    WINDOW = "window"
    SCATTER = "scatter"
    # linear
    MATMUL = "matmul"
    CONV = "conv"
    CONV_TRANSPOSE = "conv_transpose"
    GROUPED_MATMUL = "grouped_matmul"
    # run whole by ONNX Runtime
    OPAQUE = "opaque"

    @property
    def kind(self) -> Kind:
        return DEFS[self].kind

    def infer(self, types: Sequence[TensorType], attrs: dict) -> list[TensorType]:
        return DEFS[self].infer(list(types), attrs)

    def ref(self, arrays: Sequence[np.ndarray], attrs: dict) -> list[np.ndarray]:
        """The numpy reference. numpy has no bfloat16 arithmetic (ml_dtypes' matmul gives float32,
        scipy's erf float64): bfloat16 operands are computed in float32 and the results rounded
        once to the dtypes the rule says, as torch computes bfloat16 on a CPU. IEEE results
        (log(0) = -inf, 0/0 = nan) are the reference's, not news: numpy's warnings about them are
        not printed (the import folds constants with this: T5's relative position buckets take
        the log of 0)."""
        arrays = list(arrays)
        with np.errstate(all="ignore"):
            if not any(np.asarray(a).dtype == BFLOAT16 for a in arrays):
                return DEFS[self].ref(arrays, attrs)
            types = self.infer([TensorType.of(np.asarray(a)) for a in arrays], attrs)
            wide = [a.astype(np.float32) if a.dtype == BFLOAT16 else a for a in map(np.asarray, arrays)]
            return [np.asarray(r).astype(t.dtype) for r, t in zip(DEFS[self].ref(wide, attrs), types)]


InferFn = Callable[[list[TensorType], dict], list[TensorType]]
RefFn = Callable[[list[np.ndarray], dict], list[np.ndarray]]


@dataclass(frozen=True)
class PrimDef:
    kind: Kind
    infer: InferFn
    ref: RefFn


DEFS: dict[Prim, PrimDef] = {}


def _define(prim: Prim, kind: Kind, infer: InferFn, ref: RefFn) -> None:
    if prim in DEFS:
        raise RuntimeError(f"primitive {prim.value} defined twice")
    DEFS[prim] = PrimDef(kind, infer, ref)


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


def _int_div(a, b):
    q = np.abs(a) // np.abs(b)
    return (q * np.sign(a) * np.sign(b)).astype(a.dtype)


def _div(a, b):
    return _int_div(a, b) if a.dtype.kind in "iu" else np.divide(a, b)


def _pow(a, b):
    if a.dtype.kind in "iu":  # numpy refuses negative integer powers
        return np.trunc(np.power(a.astype("float64"), b.astype("float64"))).astype(a.dtype)
    return np.power(a, b).astype(a.dtype, copy=False)


_NUMERIC = FLOAT_DTYPES + INT_DTYPES
_UNARY: dict[Prim, tuple[Callable, Sequence[str]]] = {
    Prim.NEG: (np.negative, _NUMERIC),
    Prim.ABS: (np.abs, _NUMERIC),
    Prim.EXP: (np.exp, FLOAT_DTYPES),
    Prim.LOG: (np.log, FLOAT_DTYPES),
    Prim.SQRT: (np.sqrt, FLOAT_DTYPES),
    Prim.RECIPROCAL: (np.reciprocal, FLOAT_DTYPES),
    Prim.ERF: (scipy.special.erf, FLOAT_DTYPES),
    Prim.TANH: (np.tanh, FLOAT_DTYPES),
    Prim.SIGMOID: (scipy.special.expit, FLOAT_DTYPES),
    Prim.FLOOR: (np.floor, FLOAT_DTYPES),
    Prim.CEIL: (np.ceil, FLOAT_DTYPES),
    Prim.ROUND: (np.round, FLOAT_DTYPES),
    Prim.SIN: (np.sin, FLOAT_DTYPES),
    Prim.COS: (np.cos, FLOAT_DTYPES),
    Prim.ATAN: (np.arctan, FLOAT_DTYPES),
    Prim.SIGN: (np.sign, _NUMERIC),
    Prim.NOT: (np.logical_not, ("bool",)),
}
_ARITH: dict[Prim, Callable] = {
    Prim.ADD: np.add,
    Prim.SUB: np.subtract,
    Prim.MUL: np.multiply,
    Prim.DIV: _div,
    Prim.POW: _pow,
    Prim.MAX: np.maximum,
    Prim.MIN: np.minimum,
}
_COMPARE: dict[Prim, Callable] = {Prim.EQ: np.equal, Prim.LT: np.less, Prim.GT: np.greater}
_LOGICAL: dict[Prim, Callable] = {
    Prim.AND: np.logical_and,
    Prim.OR: np.logical_or,
    Prim.XOR: np.logical_xor,
}


def _unary_def(prim: Prim, fn: Callable, allowed: Sequence[str]) -> None:
    def infer(types, attrs):
        _arity(types, 1, prim.value)
        return [TensorType(types[0].shape, _same_dtype(types, prim.value, allowed))]

    def ref(xs, attrs):
        return [np.asarray(fn(xs[0]), dtype=xs[0].dtype)]

    _define(prim, Kind.ELEMENTWISE, infer, ref)


def _binary_def(prim: Prim, fn: Callable, allowed: Sequence[str], out_dtype: str | None) -> None:
    def infer(types, attrs):
        _arity(types, 2, prim.value)
        dtype = _same_dtype(types, prim.value, allowed)
        return [TensorType(_elementwise_shape(types, prim.value), out_dtype or dtype)]

    def ref(xs, attrs):
        return [np.asarray(fn(xs[0], xs[1]))]

    _define(prim, Kind.ELEMENTWISE, infer, ref)


for _p, (_fn, _allowed) in _UNARY.items():
    _unary_def(_p, _fn, _allowed)
for _p, _fn in _ARITH.items():
    _binary_def(_p, _fn, _NUMERIC, None)
for _p, _fn in _COMPARE.items():
    _binary_def(_p, _fn, _NUMERIC + ("bool",), "bool")
for _p, _fn in _LOGICAL.items():
    _binary_def(_p, _fn, ("bool",), "bool")


def _cast_infer(types, attrs):
    _arity(types, 1, "cast")
    return [TensorType(types[0].shape, attrs["to"])]


_define(Prim.CAST, Kind.ELEMENTWISE, _cast_infer, lambda xs, a: [np.asarray(xs[0]).astype(a["to"])])


def _where_infer(types, attrs):
    _arity(types, 3, "where")
    _check(types[0].dtype == "bool", "where: condition must be bool")
    dtype = _same_dtype(types[1:], "where")
    return [TensorType(_elementwise_shape(types, "where"), dtype)]


_define(Prim.WHERE, Kind.ELEMENTWISE, _where_infer, lambda xs, a: [np.asarray(np.where(*xs))])


# ------------------------------------------------------------------ broadcast


def _broadcast_infer(types, attrs):
    _arity(types, 1, "broadcast")
    shape = tuple(attrs["shape"])
    try:
        ok = np.broadcast_shapes(types[0].shape, shape) == shape
    except ValueError:
        ok = False
    _check(ok, f"broadcast: {types[0].shape} cannot broadcast to {shape}")
    return [TensorType(shape, types[0].dtype)]


_define(
    Prim.BROADCAST,
    Kind.BROADCAST,
    _broadcast_infer,
    lambda xs, a: [np.broadcast_to(xs[0], tuple(a["shape"]))],
)


# --------------------------------------------------------------------- reduce


def _reduce_infer(types, attrs):
    _arity(types, 1, "reduce")
    t = types[0]
    axes = tuple(attrs["axes"])
    _check(
        list(axes) == sorted(set(axes)) and all(0 <= a < t.rank for a in axes),
        f"reduce: axes {axes} must be sorted, unique and in range for rank {t.rank}",
    )
    shape = tuple(1 if i in axes else d for i, d in enumerate(t.shape))
    return [TensorType(shape, t.dtype)]


def _reduce_def(prim: Prim, fn: Callable) -> None:
    def ref(xs, attrs):
        x = xs[0]
        return [np.asarray(fn(x, axis=tuple(attrs["axes"]), keepdims=True), dtype=x.dtype)]

    _define(prim, Kind.REDUCE, _reduce_infer, ref)


_reduce_def(Prim.REDUCE_SUM, lambda x, **kw: np.sum(x, dtype=x.dtype, **kw))
_reduce_def(Prim.REDUCE_PROD, lambda x, **kw: np.prod(x, dtype=x.dtype, **kw))


def _extreme(dtype, lowest: bool):
    if str(dtype) in FLOAT_DTYPES:
        return -np.inf if lowest else np.inf
    info = np.iinfo(dtype)
    return info.min if lowest else info.max


# the initial value makes reductions over empty axes well defined (-inf for max, as in ONNX Runtime)
_reduce_def(Prim.REDUCE_MAX, lambda x, **kw: np.max(x, initial=_extreme(x.dtype, True), **kw))
_reduce_def(Prim.REDUCE_MIN, lambda x, **kw: np.min(x, initial=_extreme(x.dtype, False), **kw))


def _arg_infer(types, attrs):
    _arity(types, 1, "argmax")
    t = types[0]
    axis = attrs["axis"]
    _check(0 <= axis < t.rank, f"argmax: axis {axis} out of range")
    return [TensorType(tuple(1 if i == axis else d for i, d in enumerate(t.shape)), "int64")]


_define(
    Prim.ARGMAX,
    Kind.REDUCE,
    _arg_infer,
    lambda xs, a: [np.argmax(xs[0], axis=a["axis"], keepdims=True).astype("int64")],
)
_define(
    Prim.ARGMIN,
    Kind.REDUCE,
    _arg_infer,
    lambda xs, a: [np.argmin(xs[0], axis=a["axis"], keepdims=True).astype("int64")],
)


def _argsort_infer(types, attrs):
    _arity(types, 1, "argsort")
    t = types[0]
    _check(0 <= attrs["axis"] < t.rank, f"argsort: axis {attrs['axis']} out of range")
    _check(t.dtype in _NUMERIC, f"argsort: dtype {t.dtype} not supported")
    return [TensorType(t.shape, "int64")]


def _argsort_ref(xs, a):
    """Stable: equal values keep their order, descending too; NaN sorts as the largest value."""
    x, axis = xs[0], a["axis"]
    if not a["descending"]:
        return [np.argsort(x, axis=axis, kind="stable").astype("int64")]
    backwards = np.argsort(np.flip(x, axis), axis=axis, kind="stable")
    return [np.flip(x.shape[axis] - 1 - backwards, axis).astype("int64")]


_define(Prim.ARGSORT, Kind.REDUCE, _argsort_infer, _argsort_ref)


# --------------------------------------------------------------------- layout


def _reshape_infer(types, attrs):
    _arity(types, 1, "reshape")
    shape = tuple(attrs["shape"])
    _check(math.prod(shape) == types[0].numel, f"reshape: {types[0].shape} to {shape}")
    return [TensorType(shape, types[0].dtype)]


_define(
    Prim.RESHAPE,
    Kind.LAYOUT,
    _reshape_infer,
    lambda xs, a: [np.reshape(xs[0], tuple(a["shape"]))],
)


def _transpose_infer(types, attrs):
    _arity(types, 1, "transpose")
    perm = tuple(attrs["perm"])
    _check(sorted(perm) == list(range(types[0].rank)), f"transpose: bad perm {perm}")
    return [TensorType(tuple(types[0].shape[p] for p in perm), types[0].dtype)]


_define(
    Prim.TRANSPOSE,
    Kind.LAYOUT,
    _transpose_infer,
    lambda xs, a: [np.transpose(xs[0], tuple(a["perm"]))],
)


def _slice_infer(types, attrs):
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


def _slice_ref(xs, a):
    index = []
    for start, step, size in zip(a["starts"], a["steps"], a["sizes"]):
        stop = start + size * step
        index.append(slice(start, stop if stop >= 0 else None, step))
    return [xs[0][tuple(index)]]


_define(Prim.SLICE, Kind.LAYOUT, _slice_infer, _slice_ref)


def _concat_infer(types, attrs):
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


_define(
    Prim.CONCAT,
    Kind.LAYOUT,
    _concat_infer,
    lambda xs, a: [np.concatenate(xs, axis=a["axis"])],
)


def _pad_infer(types, attrs):
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


def _pad_ref(xs, a):
    x = xs[0]
    widths = list(zip(a["pads"][: x.ndim], a["pads"][x.ndim :]))
    if a["mode"] == "constant":
        return [np.pad(x, widths, mode="constant", constant_values=a["value"])]
    return [np.pad(x, widths, mode=a["mode"])]


_define(Prim.PAD, Kind.LAYOUT, _pad_infer, _pad_ref)


def _gather_infer(types, attrs):
    _arity(types, 2, "gather")
    data, idx = types
    axis = attrs["axis"]
    _check(0 <= axis < data.rank, f"gather: axis {axis} out of range")
    _check(idx.dtype in ("int64", "int32"), "gather: indices must be int32 or int64")
    shape = data.shape[:axis] + idx.shape + data.shape[axis + 1 :]
    return [TensorType(shape, data.dtype)]


_define(
    Prim.GATHER,
    Kind.LAYOUT,
    _gather_infer,
    lambda xs, a: [np.take(xs[0], xs[1], axis=a["axis"])],
)


def repeat_factor(index: np.ndarray | None, extent: int) -> int | None:
    """s >= 2 when a gather's constant index repeats each of `extent` positions s times in order
    ([0]*s + [1]*s + ...: a nearest-neighbour upsampling by s), else None."""
    if index is None or index.ndim != 1 or extent <= 0 or len(index) % extent:
        return None
    s = len(index) // extent
    return s if s >= 2 and np.array_equal(index, np.arange(len(index)) // s) else None


def _window_infer(types, attrs):
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


def _window_ref(xs, a):
    x = xs[0]
    kernel, strides, dil = a["kernel"], a["strides"], a["dilations"]
    k = len(kernel)
    axes = tuple(range(x.ndim - k, x.ndim))
    extents = [(kk - 1) * d + 1 for kk, d in zip(kernel, dil)]
    v = sliding_window_view(x, extents, axis=axes)
    lead = (slice(None),) * (x.ndim - k)
    return [v[lead + tuple(slice(None, None, s) for s in strides) + tuple(slice(None, None, d) for d in dil)]]


_define(Prim.WINDOW, Kind.LAYOUT, _window_infer, _window_ref)

SCATTER_REDUCTIONS = ("none", "add", "mul", "max", "min")


def _scatter_infer(types, attrs):
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


_SCATTER_UFUNCS = {"add": np.add, "mul": np.multiply, "max": np.maximum, "min": np.minimum}


def _scatter_ref(xs, a):
    data, idx, upd = xs
    out = data.copy()
    if a["reduction"] == "none":
        out[idx] = upd  # (a repeated index: the last update wins, as in ONNX Runtime on CPU)
    else:
        _SCATTER_UFUNCS[a["reduction"]].at(out, idx, upd)
    return [out]


_define(Prim.SCATTER, Kind.LAYOUT, _scatter_infer, _scatter_ref)


# --------------------------------------------------------------------- linear


def _matmul_infer(types, attrs):
    _arity(types, 2, "matmul")
    a, b = types
    dtype = _same_dtype(types, "matmul", _NUMERIC)
    _check(a.rank >= 2 and b.rank >= 2, "matmul: operands need rank >= 2")
    _check(a.shape[-1] == b.shape[-2], f"matmul: {a.shape} @ {b.shape}")
    try:
        batch = np.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    except ValueError:
        raise ShapeError(f"matmul: batch dims {a.shape} @ {b.shape}") from None
    return [TensorType(tuple(batch) + (a.shape[-2], b.shape[-1]), dtype)]


_define(Prim.MATMUL, Kind.LINEAR, _matmul_infer, lambda xs, a: [np.matmul(xs[0], xs[1])])


def _grouped_matmul_infer(types, attrs):
    _arity(types, 3, "grouped_matmul")
    x, w, ends = types
    dtype = _same_dtype(types[:2], "grouped_matmul", _NUMERIC)
    _check(x.rank == 2 and w.rank == 3 and ends.rank == 1, "grouped_matmul: x [S, K], w [E, K, N], ends [E]")
    _check(
        x.shape[1] == w.shape[1] and ends.shape[0] == w.shape[0],
        f"grouped_matmul: {x.shape}, {w.shape}, {ends.shape}",
    )
    _check(ends.dtype in ("int32", "int64"), "grouped_matmul: integer ends")
    return [TensorType((x.shape[0], w.shape[2]), dtype)]


def _grouped_rows(ends: np.ndarray, rows: int) -> np.ndarray:
    """Each row's group: how many ends are <= the row (E, past the last end: no group)."""
    return (ends.reshape(-1, 1) <= np.arange(rows)).sum(0)


def _grouped_matmul_ref(xs, a):
    x, w, ends = xs
    group = _grouped_rows(ends, x.shape[0])
    out = np.zeros((x.shape[0], w.shape[2]), dtype=x.dtype)
    for e in range(w.shape[0]):
        mine = group == e
        out[mine] = x[mine] @ w[e]
    return [out]


# a mixture of experts' matmul: row s of x times w[g(s)], g(s) = how many ends are <= s (rows past
# the last end are zero); with sorted ends, the rows of group e are ends[e-1] .. ends[e] - 1
_define(Prim.GROUPED_MATMUL, Kind.LINEAR, _grouped_matmul_infer, _grouped_matmul_ref)


def _conv_attrs(a, nd):
    strides, pads, dil = tuple(a["strides"]), tuple(a["pads"]), tuple(a["dilations"])
    _check(len(strides) == len(dil) == nd and len(pads) == 2 * nd, "conv: bad attribute lengths")
    _check(min(strides) > 0 and min(dil) > 0 and min(pads, default=0) >= 0, "conv: bad attributes")
    return strides, pads, dil


def _conv_infer(types, attrs):
    _arity(types, 2, "conv")
    x, w = types
    dtype = _same_dtype(types, "conv", FLOAT_DTYPES)
    nd = w.rank - 2
    _check(nd >= 1 and x.rank == w.rank, f"conv: input {x.shape}, weight {w.shape}")
    strides, pads, dil = _conv_attrs(attrs, nd)
    g = attrs["group"]
    _check(g >= 1 and x.shape[1] == w.shape[1] * g and w.shape[0] % g == 0, "conv: channels/group")
    out = []
    for i in range(nd):
        extent = (w.shape[2 + i] - 1) * dil[i] + 1
        size = x.shape[2 + i] + pads[i] + pads[nd + i] - extent
        _check(size >= 0, f"conv: kernel {w.shape} larger than padded input {x.shape}")
        out.append(size // strides[i] + 1)
    return [TensorType((x.shape[0], w.shape[0], *out), dtype)]


def _conv_ref(xs, a):
    x, w = xs
    nd = w.ndim - 2
    g = a["group"]
    pads = a["pads"]
    x = np.pad(x, [(0, 0), (0, 0)] + [(pads[i], pads[nd + i]) for i in range(nd)])
    win = _window_ref([x], {"kernel": w.shape[2:], "strides": a["strides"], "dilations": a["dilations"]})[0]
    n, c = x.shape[:2]
    out_sp = win.shape[2 : 2 + nd]
    if g == 1:
        # im2col then one BLAS call: [N, *out, C*K] @ [C*K, M]
        cols = np.moveaxis(win, 1, 1 + nd).reshape(n, *out_sp, -1)
        y = cols @ w.reshape(w.shape[0], -1).T
        return [np.ascontiguousarray(np.moveaxis(y, -1, 1))]
    letters = "hijkl"[:nd]
    kl = "pqrst"[:nd]
    win = win.reshape(n, g, c // g, *out_sp, *w.shape[2:])
    wg = w.reshape(g, w.shape[0] // g, c // g, *w.shape[2:])
    y = np.einsum(f"ngc{letters}{kl},gmc{kl}->ngm{letters}", win, wg, optimize=True)
    return [np.ascontiguousarray(y.reshape(n, w.shape[0], *out_sp), dtype=x.dtype)]


_define(Prim.CONV, Kind.LINEAR, _conv_infer, _conv_ref)


def _conv_transpose_infer(types, attrs):
    _arity(types, 2, "conv_transpose")
    x, w = types
    dtype = _same_dtype(types, "conv_transpose", FLOAT_DTYPES)
    nd = w.rank - 2
    _check(nd >= 1 and x.rank == w.rank, f"conv_transpose: input {x.shape}, weight {w.shape}")
    strides, pads, dil = _conv_attrs(attrs, nd)
    g, opad = attrs["group"], attrs["output_padding"]
    _check(g >= 1 and x.shape[1] == w.shape[0] and w.shape[0] % g == 0, "conv_transpose: channels")
    out = []
    for i in range(nd):
        full = (x.shape[2 + i] - 1) * strides[i] + (w.shape[2 + i] - 1) * dil[i] + 1 + opad[i]
        size = full - pads[i] - pads[nd + i]
        _check(size > 0, "conv_transpose: pads remove the whole output")
        out.append(size)
    return [TensorType((x.shape[0], w.shape[1] * g, *out), dtype)]


def _conv_transpose_ref(xs, a):
    """Scatter-add one matmul per kernel offset into the full output, then crop the pads."""
    x, w = xs
    nd = w.ndim - 2
    g, s, d, pads, opad = a["group"], a["strides"], a["dilations"], a["pads"], a["output_padding"]
    n, c = x.shape[:2]
    m_g = w.shape[1]
    in_sp = x.shape[2:]
    full = [(in_sp[i] - 1) * s[i] + (w.shape[2 + i] - 1) * d[i] + 1 + opad[i] for i in range(nd)]
    y = np.zeros((n, g, m_g, *full), dtype=x.dtype)
    xg = x.reshape(n, g, c // g, -1)
    wg = w.reshape(g, c // g, m_g, *w.shape[2:])
    for offset in np.ndindex(*w.shape[2:]):
        wk = wg[(slice(None),) * 3 + offset]  # [g, c/g, m/g]
        contrib = np.einsum("ngcp,gcm->ngmp", xg, wk).reshape(n, g, m_g, *in_sp)
        index = tuple(
            slice(offset[i] * d[i], offset[i] * d[i] + (in_sp[i] - 1) * s[i] + 1, s[i]) for i in range(nd)
        )
        y[(slice(None),) * 3 + index] += contrib
    crop = tuple(slice(pads[i], full[i] - pads[nd + i]) for i in range(nd))
    y = y.reshape(n, g * m_g, *full)[(slice(None), slice(None)) + crop]
    return [np.ascontiguousarray(y)]


_define(Prim.CONV_TRANSPOSE, Kind.LINEAR, _conv_transpose_infer, _conv_transpose_ref)


# --------------------------------------------------------------------- opaque


def _opaque_infer(types, attrs):
    expected = [TensorType(tuple(s), d) for s, d in attrs["in_types"]]
    _check(list(types) == expected, f"opaque {attrs['op_type']}: inputs {types} != {expected}")
    return [TensorType(tuple(s), d) for s, d in attrs["out_types"]]


@functools.lru_cache(maxsize=64)
def _opaque_session(model: bytes):
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    return ort.InferenceSession(model, opts, providers=["CPUExecutionProvider"])


def _opaque_ref(xs, a):
    sess = _opaque_session(a["model"])
    feeds = {i.name: x for i, x in zip(sess.get_inputs(), xs)}
    return sess.run(None, feeds)


_define(Prim.OPAQUE, Kind.OPAQUE, _opaque_infer, _opaque_ref)

assert set(DEFS) == set(Prim), "every primitive needs a definition"
