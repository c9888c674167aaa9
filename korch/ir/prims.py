"""The closed set of tensor primitives and one table of what korch knows about each: its kind, its
shape/dtype rule (korch.ir.shapes), its numpy reference (korch.ir.numpy_ops), its FLOP count and
whether it moves data (korch.ir.work counts a kernel's work from these).

A new primitive is a member of Prim and a row of DEFS here, then a lowering in each backend's table
(korch.backends.torch_ops.LOWERINGS, korch.backends.onnxrt.EMITTERS); tests/ir/test_primitive_table.py
names any place it is missing from."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import Enum, IntEnum

import numpy as np
import scipy.special

from korch.ir import numpy_ops, shapes
from korch.ir.shapes import NUMERIC
from korch.ir.tensor_type import (  # noqa: F401  (the primitives' operand types, imported from here too)
    BFLOAT16,
    DTYPES,
    FLOAT_DTYPES,
    HALF_DTYPES,
    INT_DTYPES,
    ShapeError,
    TensorType,
    from_npy,
    is_float,
)


class Kind(IntEnum):
    """Primitive kinds, ordered from most to least fusible (a comparison answers legality questions)."""

    ELEMENTWISE = 0
    BROADCAST = 1
    REDUCE = 2
    LAYOUT = 3
    LINEAR = 4
    OPAQUE = 5


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
FlopsFn = Callable[[list[TensorType], list[TensorType]], int]  # (operand types, result types)


def no_flops(ins: list[TensorType], outs: list[TensorType]) -> int:
    """Only linear primitives count FLOPs; the others are bounded by the bytes they move."""
    return 0


def _matmul_flops(ins, outs):
    """A matmul's, and a grouped matmul's (each row by one group's matrix)."""
    return 2 * outs[0].numel * ins[0].shape[-1]


def _conv_flops(ins, outs):
    return 2 * outs[0].numel * math.prod(ins[1].shape[1:])


def _conv_transpose_flops(ins, outs):
    """A transposed convolution's: every input element times a whole kernel slice."""
    return 2 * ins[0].numel * math.prod(ins[1].shape[1:])


@dataclass(frozen=True)
class PrimDef:
    """What korch knows about a primitive, whichever backend runs it. `flops`: multiply-adds counted
    as two FLOPs. `view`: a backend may return it as a view of its input (torch's expand, view,
    permute, slicing, unfold), moving no data."""

    kind: Kind
    infer: InferFn
    ref: RefFn
    flops: FlopsFn = no_flops
    view: bool = False


Row = PrimDef | Callable[[Prim], PrimDef]  # a definition, or one made for the primitive (its name)


def _unary(allowed: Sequence[str], fn: Callable) -> Row:
    """An elementwise function of one operand of a dtype in `allowed` (its shape rule's errors name
    the primitive)."""

    def row(prim: Prim) -> PrimDef:
        return PrimDef(Kind.ELEMENTWISE, shapes.unary(prim.value, allowed), numpy_ops.unary(fn))

    return row


def _binary(allowed: Sequence[str], fn: Callable, out: str | None = None) -> Row:
    """An elementwise function of two operands of one dtype in `allowed`, its result of `out`."""

    def row(prim: Prim) -> PrimDef:
        return PrimDef(Kind.ELEMENTWISE, shapes.binary(prim.value, allowed, out), numpy_ops.binary(fn))

    return row


def _linear(infer: InferFn, ref: RefFn, flops: FlopsFn) -> PrimDef:
    return PrimDef(Kind.LINEAR, infer, ref, flops)


def _table(rows: dict[Prim, Row]) -> dict[Prim, PrimDef]:
    missing = [p.value for p in Prim if p not in rows]
    if missing:
        raise RuntimeError(f"primitives without a definition: {missing}")
    return {p: row if isinstance(row, PrimDef) else row(p) for p, row in rows.items()}


_BOOL = ("bool",)

# every primitive's PrimDef(kind, shape rule, numpy reference, FLOPs (a linear primitive's only),
# view=True where it moves no data); _unary, _binary and _linear make those of one kind
_ROWS: dict[Prim, Row] = {
    # elementwise: operands of the result's shape or of rank 0 (other broadcasts are explicit)
    Prim.NEG: _unary(NUMERIC, np.negative),
    Prim.ABS: _unary(NUMERIC, np.abs),
    Prim.EXP: _unary(FLOAT_DTYPES, np.exp),
    Prim.LOG: _unary(FLOAT_DTYPES, np.log),
    Prim.SQRT: _unary(FLOAT_DTYPES, np.sqrt),
    Prim.RECIPROCAL: _unary(FLOAT_DTYPES, np.reciprocal),
    Prim.ERF: _unary(FLOAT_DTYPES, scipy.special.erf),
    Prim.TANH: _unary(FLOAT_DTYPES, np.tanh),
    Prim.SIGMOID: _unary(FLOAT_DTYPES, scipy.special.expit),
    Prim.FLOOR: _unary(FLOAT_DTYPES, np.floor),
    Prim.CEIL: _unary(FLOAT_DTYPES, np.ceil),
    Prim.ROUND: _unary(FLOAT_DTYPES, np.round),
    Prim.SIN: _unary(FLOAT_DTYPES, np.sin),
    Prim.COS: _unary(FLOAT_DTYPES, np.cos),
    Prim.ATAN: _unary(FLOAT_DTYPES, np.arctan),
    Prim.SIGN: _unary(NUMERIC, np.sign),
    Prim.NOT: _unary(_BOOL, np.logical_not),
    Prim.CAST: PrimDef(Kind.ELEMENTWISE, shapes.cast, numpy_ops.cast),
    Prim.ADD: _binary(NUMERIC, np.add),
    Prim.SUB: _binary(NUMERIC, np.subtract),
    Prim.MUL: _binary(NUMERIC, np.multiply),
    Prim.DIV: _binary(NUMERIC, numpy_ops.div),
    Prim.POW: _binary(NUMERIC, numpy_ops.pow_),
    Prim.MAX: _binary(NUMERIC, np.maximum),
    Prim.MIN: _binary(NUMERIC, np.minimum),
    Prim.EQ: _binary(NUMERIC + _BOOL, np.equal, "bool"),
    Prim.LT: _binary(NUMERIC + _BOOL, np.less, "bool"),
    Prim.GT: _binary(NUMERIC + _BOOL, np.greater, "bool"),
    Prim.AND: _binary(_BOOL, np.logical_and, "bool"),
    Prim.OR: _binary(_BOOL, np.logical_or, "bool"),
    Prim.XOR: _binary(_BOOL, np.logical_xor, "bool"),
    Prim.WHERE: PrimDef(Kind.ELEMENTWISE, shapes.where, numpy_ops.where),
    # broadcast
    Prim.BROADCAST: PrimDef(Kind.BROADCAST, shapes.broadcast, numpy_ops.broadcast, view=True),
    # reduce: the reduced axes kept as size 1
    Prim.REDUCE_SUM: PrimDef(Kind.REDUCE, shapes.reduce, numpy_ops.reduce_sum),
    Prim.REDUCE_MAX: PrimDef(Kind.REDUCE, shapes.reduce, numpy_ops.reduce_max),
    Prim.REDUCE_MIN: PrimDef(Kind.REDUCE, shapes.reduce, numpy_ops.reduce_min),
    Prim.REDUCE_PROD: PrimDef(Kind.REDUCE, shapes.reduce, numpy_ops.reduce_prod),
    Prim.ARGMAX: PrimDef(Kind.REDUCE, shapes.arg_reduce, numpy_ops.argmax),
    Prim.ARGMIN: PrimDef(Kind.REDUCE, shapes.arg_reduce, numpy_ops.argmin),
    Prim.ARGSORT: PrimDef(Kind.REDUCE, shapes.argsort, numpy_ops.argsort),
    # layout
    Prim.RESHAPE: PrimDef(Kind.LAYOUT, shapes.reshape, numpy_ops.reshape, view=True),
    Prim.TRANSPOSE: PrimDef(Kind.LAYOUT, shapes.transpose, numpy_ops.transpose, view=True),
    Prim.SLICE: PrimDef(Kind.LAYOUT, shapes.slice_, numpy_ops.slice_, view=True),
    Prim.CONCAT: PrimDef(Kind.LAYOUT, shapes.concat, numpy_ops.concat),
    Prim.PAD: PrimDef(Kind.LAYOUT, shapes.pad, numpy_ops.pad),
    Prim.GATHER: PrimDef(Kind.LAYOUT, shapes.gather, numpy_ops.gather),
    Prim.WINDOW: PrimDef(Kind.LAYOUT, shapes.window, numpy_ops.window, view=True),
    Prim.SCATTER: PrimDef(Kind.LAYOUT, shapes.scatter, numpy_ops.scatter),
    # linear: multiply-adds counted as two FLOPs
    Prim.MATMUL: _linear(shapes.matmul, numpy_ops.matmul, _matmul_flops),
    Prim.CONV: _linear(shapes.conv, numpy_ops.conv, _conv_flops),
    Prim.CONV_TRANSPOSE: _linear(shapes.conv_transpose, numpy_ops.conv_transpose, _conv_transpose_flops),
    Prim.GROUPED_MATMUL: _linear(shapes.grouped_matmul, numpy_ops.grouped_matmul, _matmul_flops),
    # an operator kept whole, run by ONNX Runtime
    Prim.OPAQUE: PrimDef(Kind.OPAQUE, shapes.opaque, numpy_ops.opaque),
}
DEFS: dict[Prim, PrimDef] = _table(_ROWS)


def repeat_factor(index: np.ndarray | None, extent: int) -> int | None:
    """s >= 2 when a gather's constant index repeats each of `extent` positions s times in order
    ([0]*s + [1]*s + ...: a nearest-neighbour upsampling by s), else None."""
    if index is None or index.ndim != 1 or extent <= 0 or len(index) % extent:
        return None
    s = len(index) // extent
    return s if s >= 2 and np.array_equal(index, np.arange(len(index)) // s) else None
