"""A tensor's type (shape and dtype), the dtypes korch knows, and the error a shape rule raises."""

from __future__ import annotations

import math
from dataclasses import dataclass

import ml_dtypes  # noqa: F401  (registers "bfloat16" as a numpy dtype)
import numpy as np

from korch.errors import KorchError

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
