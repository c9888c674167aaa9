"""External data: the only files an ONNX model's tensors may be read from (its own folder's)."""

from __future__ import annotations

import os
import warnings
from pathlib import Path

import onnx
from google.protobuf.message import Message
from onnx.external_data_helper import ExternalDataInfo, load_external_data_for_tensor

from korch.errors import KorchError, error_line

# the messages that can hold a tensor: initializers, sparse tensors' parts, node attributes,
# subgraphs, functions, training graphs
_HOLDERS = frozenset(
    {"ModelProto", "GraphProto", "NodeProto", "AttributeProto", "FunctionProto", "SparseTensorProto"}
    | {"TrainingInfoProto", "TensorProto"}
)


def external_tensors(message: Message) -> list[onnx.TensorProto]:
    """Every tensor in `message` (a model or any part of one) whose bytes live in another file, as
    ONNX Runtime sees it (data_location EXTERNAL). Only messages that can hold a tensor are
    visited, and no tensor's data is read."""
    found, todo = [], [message]
    while todo:
        m = todo.pop()
        if isinstance(m, onnx.TensorProto):
            if m.data_location == onnx.TensorProto.EXTERNAL:
                found.append(m)
            continue
        for field, value in m.ListFields():
            if field.message_type is not None and field.message_type.name in _HOLDERS:
                todo.extend([value] if isinstance(value, Message) else value)
    return found


def refuse_external_data(model: onnx.ModelProto, label: str) -> None:
    """A model korch hands to ONNX Runtime as bytes may keep no tensor in another file: ONNX Runtime
    would read it relative to the current folder, whatever that holds (a home folder's keys)."""
    tensors = external_tensors(model)
    if tensors:
        raise KorchError(
            f"{label}: tensor {tensors[0].name!r} keeps its data in another file "
            f"({_location(tensors[0])!r}), which korch reads only for a model file given by its path"
        )


def read_external_data(model: onnx.ModelProto, path: Path) -> None:
    """Read the tensors that the model file `path` keeps in other files into the model, only from
    inside its own folder: no absolute path, no `..` or symbolic link leading out. (Checked here,
    not left to onnx: the onnx versions korch accepts differ in what they refuse.)"""
    folder = os.path.realpath(path.parent)
    for tensor in external_tensors(model):
        location = _location(tensor)
        target = os.path.realpath(os.path.join(folder, location))
        if os.path.isabs(location) or os.path.commonpath([folder, target]) != folder:
            raise KorchError(
                f"{path}: tensor {tensor.name!r} keeps its data in {location!r}, which leads out of the "
                "model's folder; korch reads external data only from inside it"
            )
        try:
            with warnings.catch_warnings():  # (onnx warns of unknown keys: no second line on stderr)
                warnings.simplefilter("ignore")
                load_external_data_for_tensor(tensor, folder)
        except (onnx.checker.ValidationError, ValueError, OSError) as e:
            raise KorchError(
                f"{path}: tensor {tensor.name!r}: cannot read its data from {location!r} ({error_line(e)})"
            ) from None


def _location(tensor: onnx.TensorProto) -> str:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return ExternalDataInfo(tensor).location
    except (ValueError, TypeError):  # a damaged offset or length: the location still names the file
        return next((e.value for e in tensor.external_data if e.key == "location"), "")
