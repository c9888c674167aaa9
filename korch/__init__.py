"""korch: optimal kernel orchestration for tensor programs."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping

import onnx

from korch.config import VERSION
from korch.errors import CheckFailed, KorchError, ShapeError
from korch.frontend import FissionResult, import_onnx
from korch.ir.graph import Graph
from korch.ir.prims import Kind, Prim, TensorType
from korch.ir.serialize import load_graph, save_graph
from korch.measure import openmp  # noqa: F401 (before torch loads: its OpenMP workers' spin)

__version__ = VERSION


def fission(
    model: str | os.PathLike,
    shapes: Mapping[str, tuple[int, ...]] | None = None,
    strict: bool = False,
    values: Mapping[str, object] | None = None,
) -> FissionResult:
    """Import an ONNX model and split every operator into primitives. `values={"flag": True}` pins
    an input to a value (broadcast to its shape): it becomes a constant of the model."""
    return import_onnx(model, shapes=shapes, strict=strict, values=values)


def check_fission(result: FissionResult, seed: int = 0) -> float:
    """Run the primitive graph (reference executor) and ONNX Runtime on the same seeded inputs;
    returns the largest relative error over all outputs. (A bfloat16 model's oracle is its float32
    twin in ONNX Runtime: korch.measure.check.onnxruntime_outputs.)"""
    from korch.ir import reference
    from korch.measure import check

    inputs = check.random_inputs(result.graph, seed)
    want = check.onnxruntime_outputs(result.model, inputs)
    got = reference.run(result.graph, inputs)
    return check.compare_outputs(got, want)


def optimize(model, example_inputs=None, device: str = "cpu", shapes=None, values=None, **options):
    """Optimize an ONNX model (path, bytes or ModelProto; `shapes={"x": (1, 3, 224, 224)}` pins
    symbolic input dimensions, `values={"use_cache_branch": False}` pins inputs to values), or a
    torch.nn.Module with example inputs (a tensor or a tuple of them, fixing the shapes), into a
    runnable, saveable Plan. `options` are OptimizeOptions'
    fields (backends="onnxruntime,vendor", time_budget=60, cache=..., ...)."""
    from korch.pipeline import OptimizeOptions, optimize_fission
    from korch.pipeline import optimize as _optimize

    opts = OptimizeOptions(device=device, **_known_options(options, OptimizeOptions))
    if _is_torch_module(model):
        from korch.frontend.torch.importer import import_torch

        opts.check_device()  # (korch.pipeline.optimize checks it for an ONNX model)
        if example_inputs is None:
            raise KorchError("a PyTorch module needs example_inputs (they fix the input shapes)")
        if shapes is not None or values is not None:
            raise KorchError("shapes= and values= are for ONNX models; a module's example_inputs fix both")
        if not isinstance(example_inputs, (tuple, list)):
            example_inputs = (example_inputs,)
        return optimize_fission(import_torch(model, example_inputs), opts)
    if not isinstance(model, (str, os.PathLike, bytes, onnx.ModelProto)):
        raise KorchError(
            "korch.optimize takes an ONNX model (a file path, its bytes or an onnx.ModelProto) or a "
            f"torch.nn.Module with example_inputs, got {type(model).__name__}"
        )
    if example_inputs is not None:
        raise KorchError("example_inputs are for PyTorch modules; ONNX models take shapes=")
    return _optimize(model, shapes=shapes, options=opts, values=values)


def _known_options(options: dict, cls) -> dict:
    """A misspelt option is bad input like any other, not a TypeError from a dataclass."""
    known = {f.name for f in dataclasses.fields(cls)} - {"device"}
    unknown = sorted(set(options) - known)
    if unknown:
        raise KorchError(f"unknown options {unknown}; known: {', '.join(sorted(known))}")
    return options


def _is_torch_module(model) -> bool:
    import sys

    torch = sys.modules.get("torch")  # a module object implies torch is already imported
    return torch is not None and isinstance(model, torch.nn.Module)


def load(directory, allow_mismatch: bool = False):
    """Load a plan written by Plan.save or `korch optimize` (see Plan.load for `allow_mismatch`)."""
    from korch.plan.plan import Plan

    return Plan.load(directory, allow_mismatch=allow_mismatch)


__all__ = [
    "load",
    "optimize",
    "CheckFailed",
    "FissionResult",
    "Graph",
    "Kind",
    "KorchError",
    "Prim",
    "ShapeError",
    "TensorType",
    "check_fission",
    "fission",
    "load_graph",
    "save_graph",
]
