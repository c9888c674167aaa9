"""The OpenVINO backend: a candidate written as an ONNX model (korch.backends.onnxrt.to_onnx, weights
as its constants) and compiled by OpenVINO's CPU plugin; the source model run whole is one such
kernel, its bytes read as they are. Float32 stays float32 (OpenVINO would otherwise pick bfloat16 or
float16 where the CPU has them), and each call returns arrays of its own."""

from __future__ import annotations

import functools
import sys

import numpy as np
import onnx
import torch

from korch.backends import Backend, CompiledKernel, Weights, onnx_patterns, onnx_view, onnxrt, source_digest
from korch.backends.onnxrt import source_model, to_onnx, unfused_window
from korch.frontend.onnx.importer import DEFAULT_DOMAINS
from korch.ir.graph import Graph
from korch.ir.prims import Prim
from korch.search.kernel import KernelSpec


def _prims(*names: str) -> frozenset[Prim]:
    return frozenset(map(Prim, names))


# the dtypes refused, with why
_DTYPES = {
    "float64": "OpenVINO's CPU plugin computes float64 in float32",
    "bfloat16": "korch hands OpenVINO numpy arrays, and torch makes none of bfloat16 tensors",
}
# integer arithmetic that OpenVINO saturates where ONNX (and the reference) wraps around
_WRAPS = _prims("add", "sub", "mul", "div", "neg", "abs", "pow", "reduce_sum", "reduce_prod")
_NARROW = ("int8", "uint8")
_LINEAR = _prims("matmul", "conv", "conv_transpose")  # (in float32, integers too)
# it holds int64 as int32: int64 values are taken where they are indices (bounded by a dimension)
_BOUNDED = _prims("argmax", "argmin", "argsort")
_INDEXED = _prims("gather", "scatter")  # (operand 1: the indices)
_MOVES = _prims("slice", "reshape", "transpose", "broadcast", "concat", "gather")
# primitives that carry indices to an index operand (negative ones wrapped, flattened, ...)
_INDEX_MATH = _prims("mul", "cast", "add", "sub", "neg", "where", "max", "min") | _MOVES
_TESTS = _prims("lt", "gt", "eq")  # (read an index beside its way to an index operand)
_INT32 = 2**31


@functools.cache
def _core():
    """One OpenVINO Core per process (it holds the plugins and their caches)."""
    import openvino

    return openvino.Core()


def _config() -> dict:
    import openvino
    import openvino.properties as props
    import openvino.properties.hint as hints

    return {
        props.inference_num_threads(): torch.get_num_threads(),
        hints.inference_precision(): openvino.Type.f32,
        hints.performance_mode(): hints.PerformanceMode.LATENCY,
        # (activations of fully connected layers quantized on the fly: off)
        hints.dynamic_quantization_group_size(): 0,
        # a plan's kernels and the profiler's workers share the cores: no thread pinned to one
        hints.enable_cpu_pinning(): False,
    }


class OpenVinoBackend(Backend):
    name = "openvino"
    default_on = ("cpu",)
    bakes_weights = True
    fresh_outputs = True  # (each call copies its results out of the infer request's buffers)

    def version(self) -> str:
        import openvino

        digest = source_digest(sys.modules[__name__], onnxrt, onnx_patterns, onnx_view)
        return f"openvino-{openvino.__version__}+{digest}"

    def supports(self, spec: KernelSpec, device: str) -> str | None:
        if device != "cpu":
            return "korch runs OpenVINO on its CPU plugin only"
        graph = spec.graph
        source = source_model(graph)
        if source is not None:
            domains = {n.domain for n in onnx.load_from_string(source).graph.node} - set(DEFAULT_DOMAINS)
            if domains:
                return f"operators of domain {min(domains)}: OpenVINO reads some as other operators"
            return _dtype_reason(graph)
        if any(n.prim is Prim.OPAQUE for n in graph.nodes):
            return (
                "an opaque operator (one korch could not lower): OpenVINO fails on or misreads such operators"
            )
        if unfused_window(graph):
            return "window outside a pool has no ONNX equivalent"
        if any(n.prim is Prim.GROUPED_MATMUL for n in graph.nodes):
            return "a grouped matmul has no ONNX equivalent"
        return _dtype_reason(graph) or _integer_reason(graph)

    def compile(self, spec: KernelSpec, device: str, weights: Weights | None = None) -> CompiledKernel:
        from openvino import Tensor

        graph = spec.graph
        source = source_model(graph)
        core = _core()
        if source is not None:
            weights = None  # (it holds its own weights and takes its inputs as they are)
            model = core.read_model(source)
            nodes = dict(graph.nodes[0].attrs).get("nodes", 1)
        else:
            proto = to_onnx(graph, weights, onnx_patterns.OPENVINO_PATTERNS)
            model = core.read_model(proto.SerializeToString())
            nodes = len(proto.graph.node)
        compiled = core.compile_model(model, "CPU", _config())
        request = compiled.create_infer_request()
        # the model's inputs, by position among the kernel's (baked weights are not among them):
        # to_onnx keeps the kernel's input names, and a source model's inputs are the graph's
        position = {v: i for i, v in enumerate(graph.inputs)}
        order = [position.get(p.get_any_name()) for p in compiled.inputs]
        if None in order:
            raise ValueError(f"OpenVINO's model reads inputs the kernel does not have: {compiled.inputs}")
        outputs = range(len(compiled.outputs))

        def call(feeds) -> list[np.ndarray]:
            # inputs read in place (each call sets every one before it runs; OpenVINO shares only
            # writeable arrays); outputs copied out of the request's buffers, which the next call
            # writes again
            for i, x in enumerate(feeds):
                request.set_input_tensor(i, Tensor(x if x.flags.writeable else x.copy(), shared_memory=True))
            request.infer()
            return [request.get_output_tensor(i).data.copy() for i in outputs]

        def arrays(*inputs: np.ndarray) -> list[np.ndarray]:
            return call([np.asarray(inputs[i], order="C") for i in order])  # (0-d stays 0-d)

        def run(*inputs: torch.Tensor) -> list[torch.Tensor]:
            return [
                torch.from_numpy(y) for y in call([inputs[i].detach().contiguous().numpy() for i in order])
            ]

        return CompiledKernel(run, kernels=nodes, arrays=arrays)


def _dtype_reason(graph: Graph) -> str | None:
    return next((reason for dtype, reason in _DTYPES.items() if dtype in graph.dtypes()), None)


def _integer_reason(graph: Graph) -> str | None:
    if any(n.prim in _WRAPS and graph.types[n.outputs[0]].dtype in _NARROW for n in graph.nodes):
        return "OpenVINO saturates 8-bit integer arithmetic (ONNX wraps around)"
    if any(
        n.prim in _LINEAR and graph.types[n.outputs[0]].dtype.startswith(("int", "uint")) for n in graph.nodes
    ):
        return "OpenVINO computes integer matmuls and convolutions in float32 (inexact past 2**24)"
    wide = "OpenVINO's CPU plugin holds int64 as int32 (korch gives it int64 values only as indices)"
    if any(a.dtype == "int64" and a.size and np.abs(a).max() >= _INT32 for a in graph.constants.values()):
        return wide
    indices = _bounded(graph)  # int64 values that are indices
    readers = graph.consumers()
    values = [*graph.inputs, *(v for n in graph.nodes for v in n.outputs)]
    for v in reversed(values):  # (readers before what they read)
        if graph.types[v].dtype != "int64" or v in indices:
            continue
        uses = readers.get(v, [])
        towards = [r for r in uses if _carries_index(r, v, indices)]
        if (
            v in graph.outputs
            or not towards
            or len(towards) + sum(r.prim in _TESTS for r in uses) < len(uses)
        ):
            return wide
        indices.add(v)
    return None


def _bounded(graph: Graph) -> set[str]:
    """The int64 values bounded by a dimension: an argmax's, an argsort's, and those values moved."""
    bounded: set[str] = set()
    for n in graph.nodes:
        moved = n.inputs[:1] if n.prim is Prim.GATHER else n.inputs  # (a gather moves its operand 0)
        if graph.types[n.outputs[0]].dtype == "int64" and (
            n.prim in _BOUNDED or n.prim in _MOVES and all(v in bounded for v in moved)
        ):
            bounded.update(n.outputs)
    return bounded


def _carries_index(reader, v: str, indices: set[str]) -> bool:
    """Whether `reader` takes `v` as indices: as an index operand, or on the way to one."""
    if reader.prim in _INDEXED and reader.inputs[1] == v:
        return v not in (reader.inputs[0], *reader.inputs[2:])
    return reader.prim in _INDEX_MATH and all(o in indices for o in reader.outputs)
