"""Pins for an ONNX model's inputs: shapes that fix its symbolic dimensions (never contradicting its
fixed ones), and values that make inputs constants of the model."""

from __future__ import annotations

import copy
import logging
from collections.abc import Mapping

import numpy as np
import onnx
from onnx import numpy_helper

from korch.errors import KorchError, ShapeError, error_line
from korch.frontend.onnx.tensor_types import onnx_dtype
from korch.ir.prims import FLOAT_DTYPES, INT_DTYPES, TensorType

log = logging.getLogger("korch")

MAX_TENSOR_BYTES = 2**36  # no value may be larger: more than any machine korch runs on holds

# The two spellings of a pin, named in errors: the importer cannot tell who called it.
PIN_HELP = "--shape NAME=1x3x224x224 on the command line, shapes={'NAME': (1, 3, 224, 224)} in Python"


def input_types(model: onnx.ModelProto, shapes: Mapping[str, tuple[int, ...]]) -> dict[str, TensorType]:
    """Static types for the graph inputs, with user-pinned shapes; symbolic dims must be pinned."""
    initializers = {t.name for t in model.graph.initializer}
    real = [i for i in model.graph.input if i.name not in initializers]
    unknown = set(shapes) - {i.name for i in real}
    if unknown:
        raise ShapeError(f"shapes name unknown inputs {sorted(unknown)}; inputs: {[i.name for i in real]}")
    types, unpinned = {}, []
    for inp in real:
        tt = inp.type.tensor_type
        if not inp.type.HasField("tensor_type"):
            raise KorchError(f"input {inp.name!r} is not a tensor")
        dtype = onnx_dtype(tt.elem_type)
        if inp.name in shapes:
            types[inp.name] = TensorType(_pinned_shape(inp, shapes[inp.name]), dtype)
            continue
        if not tt.HasField("shape"):
            unpinned.append(f"{inp.name}[unknown rank]")
            continue
        dims = []
        for i, d in enumerate(tt.shape.dim):
            if d.HasField("dim_value") and d.dim_value >= 0:
                dims.append(int(d.dim_value))
            else:
                unpinned.append(f"{inp.name}[{i}]={d.dim_param or '?'}")
        types[inp.name] = TensorType(tuple(dims), dtype) if len(dims) == len(tt.shape.dim) else None
    if unpinned:
        raise ShapeError(f"symbolic input dimensions {', '.join(unpinned)} must be pinned, e.g. {PIN_HELP}")
    for name, t in types.items():
        if t.nbytes > MAX_TENSOR_BYTES:
            raise KorchError(f"input {name!r} of shape {list(t.shape)} is too large ({t.nbytes} bytes)")
    _check_initializer_defaults(model)
    _warn_frozen_inputs([i.name for i in model.graph.input if i.name in initializers])
    return types


def _warn_frozen_inputs(names: list[str]) -> None:
    """ONNX Runtime lets a caller feed an input that has an initializer, the initializer being
    its default; korch compiles the default in, so the plan does not take the input. Said on one
    line (old exporters list every weight as an input)."""
    if len(names) == 1:
        log.warning(
            f"warning: input {names[0]!r} has an initializer: korch compiles its value in as a constant "
            "(what ONNX Runtime uses when it is not fed); the plan does not take it"
        )
    elif names:
        more = f" and {len(names) - 3} more" if len(names) > 3 else ""
        log.warning(
            f"warning: inputs {', '.join(map(repr, names[:3]))}{more} have initializers: korch compiles "
            "their values in as constants (what ONNX Runtime uses when they are not fed); the plan does "
            "not take them"
        )


def pin_values(model: onnx.ModelProto, values: Mapping[str, object], shapes, owned: bool) -> onnx.ModelProto:
    """The model with each input named in `values` turned into an initializer holding that value
    (broadcast to the input's shape, pinned or declared): a flag such as the use_cache_branch of a
    Hugging Face decoder exported by optimum, which selects an If's branch. ONNX Runtime then runs
    the same function (verify, the onnxruntime peer), and the plan no longer takes the input."""
    pinned = model if owned else copy.deepcopy(model)
    inputs = {i.name: i for i in pinned.graph.input}
    initialized = {t.name for t in pinned.graph.initializer}
    for name, value in values.items():
        inp = inputs.get(name)
        if inp is None or name in initialized:
            real = [n for n in inputs if n not in initialized]
            raise ShapeError(f"values name {name!r}, which is not an input; inputs: {real}")
        tt = inp.type.tensor_type
        if not inp.type.HasField("tensor_type"):
            raise KorchError(f"input {name!r} is not a tensor")
        if name in shapes:
            shape = _pinned_shape(inp, shapes[name])
        elif tt.HasField("shape") and all(d.HasField("dim_value") for d in tt.shape.dim):
            shape = tuple(d.dim_value for d in tt.shape.dim)
        else:
            raise ShapeError(f"the value of {name!r} needs its shape: pin it too, e.g. {PIN_HELP}")
        array = _value_array(name, value, shape, onnx_dtype(tt.elem_type))
        pinned.graph.initializer.append(numpy_helper.from_array(array, name))
        pinned.graph.input.remove(inp)
    return pinned


def _value_array(name: str, value, shape: tuple[int, ...], dtype: str) -> np.ndarray:
    """A pinned value cast to its input's dtype, refused where the cast would change it: a bool or
    an integer must hold it exactly (2 is no bool, 1.5 and NaN no int, 2**40 no int32), and a float
    must not overflow to infinity (a float otherwise rounds to its type)."""
    try:
        # (a Python int past 64 bits is no numpy number; as a float it may fit)
        given = np.asarray(float(value) if _is_int(value) and dtype in FLOAT_DTYPES else value)
        if given.dtype.hasobject:
            raise TypeError(f"{type(value).__name__} is not a number")
        with np.errstate(all="ignore"):  # what the cast breaks is refused below, not warned about
            array = np.broadcast_to(given, shape).astype(dtype)
    except (TypeError, ValueError, OverflowError) as e:
        if _is_int(value) and dtype in (*INT_DTYPES, *FLOAT_DTYPES):
            limits = f" {_int_range(dtype)}" if dtype in INT_DTYPES else ""
            raise ShapeError(
                f"value of {name!r}: {_digits(value)} is out of {dtype}'s range{limits}"
            ) from None
        raise ShapeError(
            f"value of {name!r}: not a {dtype} array of shape {list(shape)} ({error_line(e)})"
        ) from None
    wanted = np.broadcast_to(given, shape)
    if array.dtype.kind in "biu" and given.dtype.kind in "biuf" and not np.array_equal(array, wanted):
        shown = given.tolist()
        if dtype in INT_DTYPES and given.dtype.kind in "iu":
            raise ShapeError(f"value of {name!r}: {shown!r} is out of {dtype}'s range {_int_range(dtype)}")
        raise ShapeError(f"value of {name!r}: {shown!r} is not a {dtype}")
    if dtype in FLOAT_DTYPES and given.dtype.kind in "biuf":
        overflow = np.isfinite(wanted) & ~np.isfinite(array.astype(np.float64))
        if overflow.any():
            raise ShapeError(f"value of {name!r}: {given.tolist()!r} is out of {dtype}'s range")
    return array


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _digits(value: int) -> str:
    text = str(value)
    return text if len(text) <= 40 else f"{text[:12]}... ({len(text.lstrip('-'))} digits)"


def _int_range(dtype: str) -> str:
    info = np.iinfo(dtype)
    return f"[{info.min}, {info.max}]"


def _pinned_shape(inp: onnx.ValueInfoProto, pin) -> tuple[int, ...]:
    """A pin may fix the model's symbolic dimensions, never contradict its fixed ones: running a
    4x16 model on 8x16 inputs silently computes something the model never promised."""
    try:
        pinned = tuple(int(d) for d in pin)
    except (TypeError, ValueError):
        raise ShapeError(f"shape of {inp.name}: wants a tuple of ints, got {pin!r}") from None
    if any(d < 0 for d in pinned):
        raise ShapeError(f"shape of {inp.name}: negative dimension in {list(pinned)}")
    tt = inp.type.tensor_type
    if not tt.HasField("shape"):  # unknown rank: the pin says it all
        return pinned
    if len(tt.shape.dim) != len(pinned):
        raise ShapeError(f"shape of {inp.name}: rank {len(pinned)}, the model says {len(tt.shape.dim)}")
    for i, (dim, got) in enumerate(zip(tt.shape.dim, pinned)):
        # a 0 stays pinnable: some exporters wrote 0 for "set by the user" (Paddle2ONNX #53)
        if dim.HasField("dim_value") and dim.dim_value > 0 and dim.dim_value != got:
            raise ShapeError(f"shape of {inp.name}: dimension {i} is {dim.dim_value} in the model, got {got}")
    return pinned


def _check_initializer_defaults(model: onnx.ModelProto) -> None:
    """An initializer named like a graph input is that input's default: their types must agree."""
    declared = {i.name: i.type.tensor_type for i in model.graph.input}
    for init in model.graph.initializer:
        tt = declared.get(init.name)
        if tt is None or not tt.HasField("shape"):
            continue
        dims = [d.dim_value if d.HasField("dim_value") else None for d in tt.shape.dim]
        if len(dims) != len(init.dims) or any(d is not None and d != i for d, i in zip(dims, init.dims)):
            raise KorchError(
                f"initializer {init.name!r} has shape {list(init.dims)}, its graph input declares {dims}"
            )


def pin_shapes(model: onnx.ModelProto, types: Mapping[str, TensorType], owned: bool) -> onnx.ModelProto:
    pinned = model if owned else copy.deepcopy(model)
    for inp in pinned.graph.input:
        if inp.name in types:
            shape = inp.type.tensor_type.shape
            shape.Clear()
            shape.SetInParent()  # an empty shape is rank 0; a missing one would be unknown rank
            for d in types[inp.name].shape:
                shape.dim.add().dim_value = d
    return pinned
