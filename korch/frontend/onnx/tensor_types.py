"""Mapping between ONNX tensor element types and the numpy dtype names korch uses."""

from __future__ import annotations

from onnx import TensorProto

from korch.errors import KorchError

_TO_NUMPY = {
    TensorProto.FLOAT: "float32",
    TensorProto.FLOAT16: "float16",
    TensorProto.DOUBLE: "float64",
    TensorProto.BFLOAT16: "bfloat16",
    TensorProto.INT64: "int64",
    TensorProto.INT32: "int32",
    TensorProto.INT16: "int16",
    TensorProto.INT8: "int8",
    TensorProto.UINT8: "uint8",
    TensorProto.BOOL: "bool",
}
_TO_ONNX = {v: k for k, v in _TO_NUMPY.items()}


def onnx_dtype(elem_type: int) -> str:
    if elem_type not in _TO_NUMPY:
        name = (
            TensorProto.DataType.Name(elem_type) if elem_type in TensorProto.DataType.values() else elem_type
        )
        raise KorchError(f"element type {name} is not supported")
    return _TO_NUMPY[elem_type]


def to_onnx_dtype(dtype: str) -> int:
    return _TO_ONNX[dtype]
