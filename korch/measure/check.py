"""Numerical checks: seeded random inputs, ONNX Runtime as the independent oracle, relative error."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import onnx
from onnx import TensorProto, numpy_helper

from korch.errors import KorchError, error_line
from korch.ir.graph import Graph, integer_division
from korch.ir.prims import BFLOAT16, Prim

_BF16, _F32 = TensorProto.BFLOAT16, TensorProto.FLOAT
_DTYPE_ATTRS = ("to", "dtype", "output_dtype")  # (attributes naming an output's element type)


def index_limits(graph: Graph) -> dict[str, int]:
    """Integer inputs that a gather or scatter reads as they are: name -> the size of the dimension
    they index (valid values: -size <= i < size, as for ONNX's Gather)."""
    limits: dict[str, int] = {}
    for node in graph.nodes:
        if node.prim in _INDEXING and node.inputs[1] in graph.inputs:
            dim = graph.types[node.inputs[0]].shape[node.a.get("axis", 0)]
            limits[node.inputs[1]] = min(dim, limits.get(node.inputs[1], dim))
    return limits


_INDEXING = (Prim.GATHER, Prim.SCATTER)  # (their indices are input 1; a scatter's axis is 0)


# Integer inputs are drawn from 1 unless they index: any of them may be a divisor, and an integer
# division by zero fails in ONNX Runtime and in torch (values 1 and 2, as narrow as 0 and 1 were, so
# products and powers stay small).
NONZERO_INTS = (1, 3)
# Inputs that reach a gather's indices only through arithmetic (GatherElements, GatherND), or that
# an opaque operator reads, may be indices of an unknown range: 0 and 1 fit any dimension of 2.
SMALL_INDICES = (0, 2)


def random_feeds(types, bounds: Mapping, seed: int = 0) -> dict[str, np.ndarray]:
    """Seeded inputs for (name, TensorType) pairs: normal floats, random bools, integers in
    [low, high) for bounds[name] = (low, high) ((low, high, "sorted"): non-decreasing along the last
    axis), else in NONZERO_INTS."""
    rng = np.random.default_rng(seed)
    feeds = {}
    for name, t in types:
        if t.dtype == "bool":
            feeds[name] = rng.random(t.shape) < 0.5
        elif t.dtype.startswith(("int", "uint")):
            low, high, *order = bounds.get(name, NONZERO_INTS)
            feeds[name] = rng.integers(low, high, t.shape).astype(t.dtype)
            if order == ["sorted"]:
                feeds[name] = np.sort(feeds[name], axis=-1)
        else:
            feeds[name] = rng.standard_normal(t.shape).astype(t.dtype)
    return feeds


def input_bounds(graph: Graph) -> dict[str, list[int]]:
    """[low, high) of every random integer input: inside the dimension a gather indexes with it;
    never zero where it reaches an integer divisor; small indices where it may index otherwise;
    a grouped matmul's ends sorted and within its rows."""
    limits = index_limits(graph)
    ends = {
        n.inputs[2]: graph.types[n.inputs[0]].shape[0] for n in graph.nodes if n.prim is Prim.GROUPED_MATMUL
    }
    divisors = _reaching(graph, [n.inputs[1] for n in graph.nodes if integer_division(graph.types, n)])
    indices = _reaching(graph, [n.inputs[1] for n in graph.nodes if n.prim in _INDEXING])
    opaque = {v for n in graph.nodes if n.prim is Prim.OPAQUE for v in n.inputs}
    bounds = {}
    for v in graph.inputs:
        if not graph.types[v].dtype.startswith(("int", "uint")):
            continue
        if v in ends:  # (a grouped matmul's ends: sorted, within the rows, as its sources promise)
            bounds[v] = [0, ends[v] + 1, "sorted"]
        elif v in limits:
            bounds[v] = [0, max(limits[v], 1)]
        elif v in divisors or not (v in indices or v in opaque):
            bounds[v] = list(NONZERO_INTS)
        else:
            bounds[v] = list(SMALL_INDICES)
    return bounds


def _reaching(graph: Graph, values) -> set[str]:
    """The graph inputs from which any of `values` is computed (or that are among them)."""
    producers = graph.producers()
    todo, seen = list(values), set()
    while todo:
        v = todo.pop()
        if v not in seen:
            seen.add(v)
            todo.extend(producers[v].inputs if v in producers else ())
    return seen & set(graph.inputs)


def random_inputs(graph: Graph, seed: int = 0) -> dict[str, np.ndarray]:
    return random_feeds([(v, graph.types[v]) for v in graph.inputs], input_bounds(graph), seed)


def onnxruntime_outputs(model: onnx.ModelProto, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The model's outputs in ONNX Runtime; a bfloat16 model's by its float32 twin (ONNX Runtime
    has no bfloat16 kernels on a CPU), from the same inputs widened (exactly) to float32."""
    if has_bfloat16(model):
        model = float32_twin(model)
        inputs = {k: v.astype(np.float32) if v.dtype == BFLOAT16 else v for k, v in inputs.items()}
    return _onnxruntime_run(model, inputs)


def _onnxruntime_run(model: onnx.ModelProto, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    try:
        sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
        names = [o.name for o in sess.get_outputs()]
        return dict(zip(names, sess.run(names, dict(inputs))))
    except Exception as e:
        raise KorchError(f"ONNX Runtime cannot run this model: {error_line(e)}") from None


def float32_twin(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of `model` that computes in float32 wherever it computes in bfloat16: initializers,
    constants and declared types widened, casts to bfloat16 made casts to float32. ONNX Runtime
    runs it on a CPU (it has no bfloat16 kernels there), as an oracle for bfloat16 results."""
    twin = onnx.ModelProto()
    twin.CopyFrom(model)
    _widen_graph(twin.graph)
    for f in twin.functions:
        for node in f.node:
            _widen_node(node)
    return twin


def _widen_tensor(t: onnx.TensorProto) -> None:
    if t.data_type == _BF16:
        t.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(t).astype(np.float32), t.name))


def _widen_type(tp: onnx.TypeProto) -> None:
    which = tp.WhichOneof("value")
    if which == "tensor_type" and tp.tensor_type.elem_type == _BF16:
        tp.tensor_type.elem_type = _F32
    elif which in ("sequence_type", "optional_type"):
        _widen_type(getattr(tp, which).elem_type)


def _widen_graph(g: onnx.GraphProto) -> None:
    for t in g.initializer:
        _widen_tensor(t)
    for v in [*g.input, *g.output, *g.value_info]:
        _widen_type(v.type)
    for node in g.node:
        _widen_node(node)


def _widen_node(node: onnx.NodeProto) -> None:
    for a in node.attribute:
        if a.type == onnx.AttributeProto.INT and a.name in _DTYPE_ATTRS and a.i == _BF16:
            a.i = _F32
        elif a.type == onnx.AttributeProto.TENSOR:
            _widen_tensor(a.t)
        elif a.type == onnx.AttributeProto.GRAPH:
            _widen_graph(a.g)
        elif a.type == onnx.AttributeProto.GRAPHS:
            for g in a.graphs:
                _widen_graph(g)


def has_bfloat16(model: onnx.ModelProto) -> bool:
    """Whether any initializer, declared value, cast or constant is bfloat16, in the main graph,
    its subgraphs or its functions (what float32_twin widens)."""
    nodes = [n for f in model.functions for n in f.node]
    return _BF16 in _dtypes(model.graph) or any(_BF16 in _node_dtypes(n) for n in nodes)


def _dtypes(g: onnx.GraphProto):
    yield from (t.data_type for t in g.initializer)
    yield from (v.type.tensor_type.elem_type for v in [*g.input, *g.output, *g.value_info])
    for node in g.node:
        yield from _node_dtypes(node)


def _node_dtypes(node: onnx.NodeProto):
    for a in node.attribute:
        if a.type == onnx.AttributeProto.INT and a.name in _DTYPE_ATTRS:
            yield a.i
        elif a.type == onnx.AttributeProto.TENSOR:
            yield a.t.data_type
        elif a.type == onnx.AttributeProto.GRAPH:
            yield from _dtypes(a.g)
        elif a.type == onnx.AttributeProto.GRAPHS:
            for g in a.graphs:
                yield from _dtypes(g)


def rel_err(got: np.ndarray, want: np.ndarray) -> float:
    """max |got - want| / max |want|: one number per tensor, robust to values near zero. Integers
    must be equal, except 8-bit ones (quantized values), which are compared as numbers: a
    difference of one is at least 1/255 of their largest, past float32's tolerance."""
    got, want = np.asarray(got), np.asarray(want)
    if got.shape != want.shape:
        return float("inf")
    if want.dtype == bool or (want.dtype.kind in "iu" and want.dtype.itemsize > 1):
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
