"""Arrays across the numpy / torch boundary: dtype names, copies and shared views (bfloat16 as
ml_dtypes' type on the numpy side)."""

from __future__ import annotations

import numpy as np
import torch

from korch.ir.tensor_type import BFLOAT16

DTYPES = {
    "float32": torch.float32,
    "float16": torch.float16,
    "float64": torch.float64,
    "bfloat16": torch.bfloat16,
    "int64": torch.int64,
    "int32": torch.int32,
    "int16": torch.int16,
    "int8": torch.int8,
    "uint8": torch.uint8,
    "bool": torch.bool,
}


def to_tensor(array, device: str = "cpu") -> torch.Tensor:
    """A writable copy as a tensor (np.ascontiguousarray would turn a 0-d array into 1-d)."""
    return as_tensor(np.array(array, copy=True, order="C")).to(device)


def as_tensor(array: np.ndarray) -> torch.Tensor:
    """The array as a tensor sharing its memory; torch takes no numpy bfloat16 (an ml_dtypes
    type), so its bits go across as int16."""
    if array.dtype == BFLOAT16:
        return torch.from_numpy(array.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(array)


def to_numpy(tensor: torch.Tensor) -> np.ndarray:
    """A tensor's values as a numpy array on the host (bfloat16 as ml_dtypes' bfloat16)."""
    if tensor.dtype == torch.bfloat16:
        return tensor.detach().cpu().view(torch.int16).numpy().view(BFLOAT16)
    return tensor.numpy(force=True)  # (detached, on the host; shares a CPU tensor's memory)
