"""The ATen rule registry and the node view rules see: arguments by schema name, torch's types."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from korch.errors import KorchError
from korch.frontend.lowering import Lowering
from korch.ir.prims import DTYPES, TensorType, is_float


def torch_dtype_name(dtype) -> str:
    """torch.float32 -> "float32"; dtypes korch has no primitive for are refused."""
    name = str(dtype).removeprefix("torch.")
    if name not in DTYPES:
        raise KorchError(f"dtype {name} is not supported")
    return name


def meta_type(val) -> TensorType | None:
    """The TensorType of an FX node's example value (a FakeTensor), or None for non-tensors."""
    shape = getattr(val, "shape", None)
    if shape is None or not hasattr(val, "dtype"):
        return None
    try:
        return TensorType(tuple(int(d) for d in shape), torch_dtype_name(val.dtype))
    except TypeError:
        raise KorchError("symbolic shapes are not supported; export with static shapes") from None


@dataclass
class AtenNode:
    """One ATen call as a rule sees it: tensors are korch value names, other arguments as given."""

    target: str  # e.g. "aten.add.Tensor"
    params: dict[str, Any]  # every schema argument by name, defaults filled in
    out_types: list[TensorType | None]  # torch's own output types (the oracle for shapes)
    vals: dict[str, Any] = field(default_factory=dict)  # FakeTensor example values of tensor params
    op: Any = None  # the torch OpOverload itself
    fx: Any = None  # the FX node (its users tell whether a value has other readers)

    def __getitem__(self, key: str) -> Any:
        return self.params[key]

    def get(self, key: str, default: Any = None) -> Any:
        value = self.params.get(key)
        return default if value is None else value

    @property
    def out(self) -> TensorType:
        return self.out_types[0]


AtenRule = Callable[[Lowering, AtenNode], "str | list[str | None]"]
ATEN_RULES: dict[str, AtenRule] = {}


def aten(*names: str) -> Callable[[AtenRule], AtenRule]:
    """Register a rule for ATen overloads by name ("aten.add.Tensor"); duplicates are an error."""

    def register(fn: AtenRule) -> AtenRule:
        for name in names:
            if name in ATEN_RULES:
                raise RuntimeError(f"ATen rule for {name} registered twice")
            ATEN_RULES[name] = fn
        return fn

    return register


def operand(ctx: Lowering, v: Any, dtype: str) -> str:
    """A tensor value cast to dtype, or a Python scalar as a rank-0 constant of dtype."""
    if isinstance(v, str):
        return ctx.cast(v, dtype)
    if dtype == "bool":
        return ctx.scalar(bool(v), dtype)
    if not is_float(dtype):
        return ctx.scalar(int(v), dtype)
    return ctx.scalar(float(v), dtype)


def vector(ctx: Lowering, v: str) -> str:
    """A 0-d tensor as one element along axis 0: torch takes dim 0 or -1 of a scalar."""
    return ctx.reshape(v, [1]) if ctx.rank(v) == 0 else v


def int_list(value, nd: int, default: int) -> list[int]:
    """torch's int[N] arguments: a list, one int for every axis, or empty for the default."""
    if value is None or (isinstance(value, (list, tuple)) and not value):
        return [default] * nd
    if isinstance(value, int):
        return [value] * nd
    return list(value) * nd if len(value) == 1 else list(value)


class TorchLowering(Lowering):
    """Lowering for ATen graphs, which spell every linear layer as view -> addmm -> view: chains
    of reshapes and of transposes collapse onto their source, and convolutions are remembered so
    an inference batch norm after one folds into its weights."""

    def __init__(self, builder):
        super().__init__(builder)
        self._reshaped: dict[str, str] = {}  # value -> the value a chain of reshapes started from
        self._transposed: dict[str, tuple[str, tuple[int, ...]]] = {}  # value -> (source, perm)
        self.convs: dict[str, tuple] = {}  # conv output -> (input, weight, bias, attrs)

    def reshape(self, v: str, shape) -> str:
        root = self._reshaped.get(v, v)
        out = super().reshape(root, shape)
        if out != root:
            self._reshaped[out] = root
        return out

    def unmerged(self, v: str, keep: int) -> str:
        """The value v was reshaped from when that reshape only merged leading (batch) axes and
        kept the last `keep` axes: a matmul can run on it directly, as ONNX models do."""
        root = self._reshaped.get(v)
        if (
            root is None
            or self.rank(root) <= self.rank(v)
            or self.shape(root)[-keep:] != self.shape(v)[-keep:]
        ):
            return v
        return root

    def transpose(self, v: str, perm) -> str:
        root, first = self._transposed.get(v, (v, tuple(range(self.rank(v)))))
        composed = tuple(first[int(p)] for p in perm)
        out = super().transpose(root, composed)
        if out != root:
            self._transposed[out] = (root, composed)
        return out
