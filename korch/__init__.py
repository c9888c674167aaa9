"""korch: optimal kernel orchestration for tensor programs."""

from __future__ import annotations

import os
from collections.abc import Mapping

from korch.errors import CheckFailed, KorchError
from korch.frontend import FissionResult, import_onnx
from korch.graph_io import load_graph, save_graph
from korch.ir import Graph
from korch.prims import Kind, Prim, TensorType

__version__ = "0.1.0"


def fission(
    model: str | os.PathLike,
    shapes: Mapping[str, tuple[int, ...]] | None = None,
    strict: bool = False,
) -> FissionResult:
    """Import an ONNX model and split every operator into primitives."""
    return import_onnx(model, shapes=shapes, strict=strict)


def check_fission(result: FissionResult, seed: int = 0) -> float:
    """Run the primitive graph (reference executor) and ONNX Runtime on the same seeded inputs;
    returns the largest relative error over all outputs."""
    from korch import check, reference

    inputs = check.random_inputs(result.graph, seed)
    want = check.onnxruntime_outputs(result.model, inputs)
    got = reference.run(result.graph, inputs)
    return check.compare_outputs(got, want)


def optimize(model, example_inputs=None, device: str = "cpu", shapes=None, **options):
    """Optimize an ONNX model (path or ModelProto) into a runnable, saveable Plan."""
    from korch.optimize import OptimizeOptions
    from korch.optimize import optimize as _optimize

    if example_inputs is not None:
        raise KorchError("PyTorch modules are not supported yet; export to ONNX first")
    return _optimize(model, shapes=shapes, options=OptimizeOptions(device=device, **options))


def load(directory):
    """Load a plan written by Plan.save or `korch optimize`."""
    from korch.plan import Plan

    return Plan.load(directory)


__all__ = [
    "load",
    "optimize",
    "CheckFailed",
    "FissionResult",
    "Graph",
    "Kind",
    "KorchError",
    "Prim",
    "TensorType",
    "check_fission",
    "fission",
    "load_graph",
    "save_graph",
]
