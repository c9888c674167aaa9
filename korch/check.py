"""Numerical checks: seeded random inputs, ONNX Runtime as the independent oracle, relative error."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import onnx

from korch.errors import KorchError, error_line
from korch.ir import Graph
from korch.prims import Prim


def index_limits(graph: Graph) -> dict[str, int]:
    """Integer inputs that a gather reads as they are: name -> the size of the dimension they
    index (valid values: -size <= i < size, as for ONNX's Gather)."""
    limits: dict[str, int] = {}
    for node in graph.nodes:
        if node.prim is Prim.GATHER and node.inputs[1] in graph.inputs:
            dim = graph.types[node.inputs[0]].shape[node.a["axis"]]
            limits[node.inputs[1]] = min(dim, limits.get(node.inputs[1], dim))
    return limits


def random_feeds(types, bounds: Mapping[str, int], seed: int = 0) -> dict[str, np.ndarray]:
    """Seeded inputs for (name, TensorType) pairs: normal floats, random bools, integers in
    [0, bounds.get(name, 2))."""
    rng = np.random.default_rng(seed)
    feeds = {}
    for name, t in types:
        if t.dtype == "bool":
            feeds[name] = rng.random(t.shape) < 0.5
        elif t.dtype.startswith(("int", "uint")):
            feeds[name] = rng.integers(0, bounds.get(name, 2), t.shape).astype(t.dtype)
        else:
            feeds[name] = rng.standard_normal(t.shape).astype(t.dtype)
    return feeds


def input_bounds(graph: Graph) -> dict[str, int]:
    """Random integer inputs are drawn in [0, bound): inside the dimension a gather indexes."""
    limits = index_limits(graph)
    return {
        v: max(limits[v], 1) if v in limits else 2
        for v in graph.inputs
        if graph.types[v].dtype.startswith(("int", "uint"))
    }


def random_inputs(graph: Graph, seed: int = 0) -> dict[str, np.ndarray]:
    return random_feeds([(v, graph.types[v]) for v in graph.inputs], input_bounds(graph), seed)


def onnxruntime_outputs(model: onnx.ModelProto, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    try:
        sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
        names = [o.name for o in sess.get_outputs()]
        return dict(zip(names, sess.run(names, dict(inputs))))
    except Exception as e:
        raise KorchError(f"ONNX Runtime cannot run this model: {error_line(e)}") from None


def rel_err(got: np.ndarray, want: np.ndarray) -> float:
    """max |got - want| / max |want|: one number per tensor, robust to values near zero."""
    got, want = np.asarray(got), np.asarray(want)
    if got.shape != want.shape:
        return float("inf")
    if want.dtype == bool or want.dtype.kind in "iu":
        return 0.0 if np.array_equal(got, want) else 1.0
    got64, want64 = got.astype(np.float64), want.astype(np.float64)
    nan_got, nan_want = np.isnan(got64), np.isnan(want64)
    if not np.array_equal(nan_got, nan_want):
        return float("inf")
    ok = ~nan_want
    if not ok.any():
        return 0.0
    inf_want = np.isinf(want64) & ok
    if not np.array_equal(got64[inf_want], want64[inf_want]):
        return float("inf")
    ok &= ~inf_want
    if not ok.any():
        return 0.0
    scale = max(float(np.max(np.abs(want64[ok]))), 1e-30)
    return float(np.max(np.abs(got64[ok] - want64[ok]))) / scale


def compare_outputs(got: Mapping[str, np.ndarray], want: Mapping[str, np.ndarray]) -> float:
    return max((rel_err(got[name], want[name]) for name in want), default=0.0)
