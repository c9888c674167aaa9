"""The fission registry, the helpers rules use to emit primitives (broadcasting, axes, constants),
and what both front ends return (FissionResult)."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from korch.errors import KorchError, Unsupported
from korch.ir.graph import Graph, GraphBuilder
from korch.ir.prims import HALF_DTYPES, Prim, TensorType

if TYPE_CHECKING:
    import onnx

_REQUIRED = object()


@dataclass
class FissionResult:
    """What a front end returns: the primitive graph, the source it came from, and what was kept whole."""

    graph: Graph
    model: onnx.ModelProto | None  # the model with input shapes pinned (None from PyTorch)
    onnx_nodes: int  # source operators: ONNX nodes, or ATen calls from PyTorch
    opaque: list[tuple[str, str]] = field(default_factory=list)  # (op type, reason)
    warnings: list[str] = field(default_factory=list)
    source: str = "onnx"  # "onnx" or "torch"
    onnx_names: dict[str, str] = field(default_factory=dict)  # primitive value -> ONNX tensor name

    @property
    def opaque_ops(self) -> list[str]:
        return sorted({op for op, _ in self.opaque})


class Attributes(dict):
    """A node's attributes, remembering which ones its rule looked up (`read`): an attribute the
    rule never looked at was not lowered (a newer opset's `mode`, say), and korch.frontend.onnx.importer
    does not let it pass silently."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.read: set[str] = set()

    def __getitem__(self, key):
        self.read.add(key)
        return super().__getitem__(key)

    def get(self, key, default=None):
        self.read.add(key)
        return super().get(key, default)

    def __contains__(self, key) -> bool:
        self.read.add(key)
        return super().__contains__(key)


class Inputs(list):
    """A node's inputs, remembering which positions its rule looked at (`read`): an input the
    rule never looked at (an optional one a newer opset added, say) was not lowered."""

    def __init__(self, *args):
        super().__init__(*args)
        self.read: set[int] = set()

    def __getitem__(self, index):
        if isinstance(index, slice):
            self.read.update(range(len(self))[index])
        else:
            self.read.add(range(len(self))[index])
        return super().__getitem__(index)

    def __iter__(self):
        self.read.update(range(len(self)))
        return super().__iter__()


@dataclass
class OnnxNode:
    """One ONNX node as a fission rule sees it: inputs are already korch value names."""

    op_type: str
    name: str
    opset: int
    inputs: list[str | None]
    n_outputs: int
    attrs: Attributes = field(default_factory=Attributes)
    outputs: tuple[str, ...] = ()  # the node's output names, "" where one is left out

    def wants(self, i: int) -> bool:
        """Whether the model names output i (a rule may give None for one it does not)."""
        return i < len(self.outputs) and bool(self.outputs[i])

    def __post_init__(self) -> None:
        if not isinstance(self.attrs, Attributes):
            self.attrs = Attributes(self.attrs)
        if not isinstance(self.inputs, Inputs):
            self.inputs = Inputs(self.inputs)

    def attr(self, key: str, default: Any = _REQUIRED) -> Any:
        if key in self.attrs:
            return self.attrs[key]
        if default is _REQUIRED:
            raise KorchError(f"required attribute {key!r} is missing")
        return default

    def input(self, i: int) -> str | None:
        return self.inputs[i] if i < len(self.inputs) else None


Rule = Callable[["Lowering", OnnxNode], list[str]]
_RULES: dict[str, list[tuple[int, Rule]]] = {}  # keyed by op type, "domain:op type" outside ONNX's
DEFAULT_DOMAINS = ("", "ai.onnx")  # (ONNX's, by either name)


def _key(op_type: str, domain: str) -> str:
    return op_type if domain in DEFAULT_DOMAINS else f"{domain}:{op_type}"


def fission(op_type: str, *since: int, domain: str = "") -> Callable[[Rule], Rule]:
    """Register a rule for an op type from each listed opset version on (until the next one);
    `domain` for an operator outside ONNX's (ONNX Runtime's "com.microsoft")."""

    def register(fn: Rule) -> Rule:
        versions = _RULES.setdefault(_key(op_type, domain), [])
        for v in since or (1,):
            if any(v == have for have, _ in versions):
                raise RuntimeError(f"fission rule for {op_type} opset {v} registered twice")
            versions.append((v, fn))
        versions.sort(key=lambda item: item[0])
        return fn

    return register


def find_rule(op_type: str, opset: int, domain: str = "") -> Rule | None:
    """The rule with the highest version at or below the model's opset (for the node's domain)."""
    best = None
    for version, fn in _RULES.get(_key(op_type, domain), []):
        if version <= opset:
            best = fn
    return best


def registered_ops() -> dict[str, list[int]]:
    """{op type ("domain:op type" outside ONNX's domain): versions}."""
    return {op: [v for v, _ in rules] for op, rules in sorted(_RULES.items())}


def normalize_axes(axes: Sequence[int], rank: int) -> tuple[int, ...]:
    out = []
    for a in axes:
        a = int(a)
        if not -rank <= a < max(rank, 1):
            raise KorchError(f"axis {a} out of range for rank {rank}")
        out.append(a % rank if rank else 0)
    return tuple(sorted(set(out)))


class Lowering:
    """What a fission rule may do: read types and constants, emit primitives."""

    def __init__(self, builder: GraphBuilder):
        self.b = builder

    # --- reading
    def type(self, v: str) -> TensorType:
        return self.b.types[v]

    def shape(self, v: str) -> tuple[int, ...]:
        return self.b.types[v].shape

    def dtype(self, v: str) -> str:
        return self.b.types[v].dtype

    def rank(self, v: str) -> int:
        return self.b.types[v].rank

    def const_value(self, v: str | None) -> np.ndarray | None:
        return None if v is None else self.b.constants.get(v)

    def require_const(self, v: str, what: str) -> np.ndarray:
        value = self.const_value(v)
        if value is None:
            raise KorchError(f"{what} must be known at compile time (it depends on runtime data)")
        return value

    def ints(self, v: str | None, what: str) -> list[int] | None:
        """A constant integer list input (axes, shapes, pads), or None when the input is omitted."""
        if v is None:
            return None
        return [int(x) for x in self.require_const(v, what).reshape(-1)]

    def keep_packed(self, v: str) -> str:
        """v, a constant whose expansions are computed in kernels, never folded at import."""
        self.b.unfolded.add(v)
        return v

    # --- emitting
    def emit(self, prim: Prim, *inputs: str, **attrs) -> str:
        (out,) = self.b.emit(prim, inputs, **attrs)
        return out

    def emit_multi(self, prim: Prim, inputs: Sequence[str], n_out: int, **attrs) -> list[str]:
        return self.b.emit(prim, inputs, n_out, **attrs)

    def scalar(self, value: Any, dtype: str) -> str:
        return self.b.const(np.array(value, dtype=dtype))

    def const(self, array: np.ndarray) -> str:
        return self.b.const(np.asarray(array))

    # --- shape helpers (no-ops when nothing changes)
    def reshape(self, v: str, shape: Sequence[int]) -> str:
        shape = tuple(int(d) for d in shape)
        return v if shape == self.shape(v) else self.emit(Prim.RESHAPE, v, shape=shape)

    def transpose(self, v: str, perm: Sequence[int]) -> str:
        perm = tuple(int(p) for p in perm)
        return v if perm == tuple(range(len(perm))) else self.emit(Prim.TRANSPOSE, v, perm=perm)

    def cast(self, v: str, dtype: str) -> str:
        return v if self.dtype(v) == dtype else self.emit(Prim.CAST, v, to=dtype)

    def widened(self, v: str) -> tuple[str, str]:
        """v in float32 when it is float16 or bfloat16 (float16 sums overflow at 65504, small
        constants round to 0, and rounding once at the end matches ONNX Runtime and torch), and the
        dtype to cast back to."""
        dtype = self.dtype(v)
        return (self.cast(v, "float32") if dtype in HALF_DTYPES else v), dtype

    def broadcast_to(self, v: str, shape: Sequence[int]) -> str:
        shape = tuple(shape)
        return v if self.shape(v) == shape else self.emit(Prim.BROADCAST, v, shape=shape)

    def elementwise(self, prim: Prim, *inputs: str) -> str:
        """ONNX multidirectional broadcasting made explicit: scalars stay scalars, others broadcast."""
        try:
            shape = tuple(np.broadcast_shapes(*(self.shape(v) for v in inputs)))
        except ValueError:
            raise KorchError(f"shapes {[list(self.shape(v)) for v in inputs]} do not broadcast") from None
        operands = []
        for v in inputs:
            if self.shape(v) == shape or self.rank(v) == 0:
                operands.append(v)
            elif self.type(v).numel == 1 and v in self.b.constants:
                operands.append(self.reshape(v, ()))
            else:
                operands.append(self.broadcast_to(v, shape))
        return self.emit(prim, *operands)

    def unary(self, prim: Prim, v: str) -> str:
        return self.emit(prim, v)

    def _reduced_axes(self, v: str, axes: Sequence[int]) -> tuple[int, ...]:
        """normalize_axes, except that a scalar has no axis to reduce (torch takes dim 0 or -1
        of a 0-d tensor: the reduction is the value itself)."""
        return normalize_axes(axes, self.rank(v)) if self.rank(v) else ()

    def reduce(self, prim: Prim, v: str, axes: Sequence[int], keepdims: bool = True) -> str:
        if self.dtype(v) == "bool" and prim in (Prim.REDUCE_MAX, Prim.REDUCE_MIN):
            # any / all: as 0 and 1 (kernels' max and argmax do not all take bools)
            return self.cast(self.reduce(prim, self.cast(v, "int32"), axes, keepdims), "bool")
        axes = self._reduced_axes(v, axes)
        out = self.emit(prim, v, axes=axes) if axes else v
        if keepdims:
            return out
        return self.reshape(out, [d for i, d in enumerate(self.shape(v)) if i not in axes])

    def mean(self, v: str, axes: Sequence[int], keepdims: bool = True) -> str:
        axes = self._reduced_axes(v, axes)
        count = math.prod(self.shape(v)[a] for a in axes)
        total = self.reduce(Prim.REDUCE_SUM, v, axes, keepdims)
        scale = 1.0 / count if count else math.nan  # (the mean of nothing is 0 / 0, as in torch)
        return self.elementwise(Prim.MUL, total, self.scalar(scale, self.dtype(v)))

    def slice_axis(self, v: str, axis: int, start: int, size: int, step: int = 1) -> str:
        shape = self.shape(v)
        if start == 0 and step == 1 and size == shape[axis]:
            return v
        starts = [0] * len(shape)
        steps = [1] * len(shape)
        sizes = list(shape)
        starts[axis], steps[axis], sizes[axis] = start, step, size
        return self.emit(Prim.SLICE, v, starts=starts, steps=steps, sizes=sizes)

    def concat(self, values: Sequence[str], axis: int) -> str:
        values = [v for v in values if self.shape(v)[axis] > 0] or list(values[:1])
        if len(values) == 1:
            return values[0]
        return self.emit(Prim.CONCAT, *values, axis=axis)

    def unsupported(self, reason: str) -> None:
        raise Unsupported(reason)
