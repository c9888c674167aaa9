"""How close a checked result must be to its oracle: per dtype, and for graphs that quantize.
Part of every backend's version (korch.backends.source_digest): a profile, or a kernel refused as
a wrong result, holds only under the policy it was checked by."""

from __future__ import annotations

from korch.ir.graph import Graph
from korch.ir.prims import Prim, is_float

# float16 carries about three decimal digits, bfloat16 two
CHECK_TOLERANCE = {"float16": 1e-2, "bfloat16": 5e-2}
DEFAULT_TOLERANCE = 1e-4
# A graph that rounds float values to 8-bit integers (QuantizeLinear and its kin) moves a value by
# one step, 1/256 of its range, wherever two correct orders of float arithmetic put it either side
# of a rounding tie, and later layers carry the step on and multiply it. ONNX Runtime's own results
# with and without its QDQ fusions differ that way on models quantized by its tools; this sits above
# the largest difference measured (BENCHMARKS.md). Single-node rules are tested to equality instead.
QUANTIZED_TOLERANCE = 0.25


def tolerance(dtypes) -> float:
    """The largest relative error a check accepts over values of these dtypes."""
    return max((CHECK_TOLERANCE.get(d, DEFAULT_TOLERANCE) for d in dtypes), default=DEFAULT_TOLERANCE)


def graph_tolerance(graph: Graph) -> float:
    """What a check of the graph's outputs accepts: the tolerance of the least precise dtype
    anywhere in it, not only among its outputs (a float32 output computed from bfloat16 values
    carries bfloat16's rounding, past float32's tolerance: a bfloat16 layer's last kernel that
    casts to float32 for a final norm, say)."""
    limit = tolerance(graph.dtypes())
    return max(limit, QUANTIZED_TOLERANCE) if quantizes(graph) else limit


QUANTIZING_OPS = (
    "QuantizeLinear",
    "DynamicQuantizeLinear",
    "QLinearConv",
    "QLinearMatMul",
    # ONNX Runtime's (com.microsoft)
    "QLinearAdd",
    "QLinearMul",
    "QLinearSigmoid",
    "QLinearLeakyRelu",
    "QLinearConcat",
    "QLinearSoftmax",
    "QLinearAveragePool",
    "QLinearGlobalAveragePool",
    "QGemm",
    "DynamicQuantizeMatMul",
    "MatMulNBits",  # (at accuracy_level 4, which rounds its input to 8 bits)
)


def quantizes(graph: Graph) -> bool:
    """Whether the graph rounds float values to 8-bit integers: a cast that a quantizing operator
    lowered to (a model's own cast to uint8, an image's, say, does not loosen its checks)."""
    return any(
        n.prim is Prim.CAST
        and n.a["to"] in ("int8", "uint8")
        and is_float(graph.types[n.inputs[0]].dtype)
        and n.origin.split(":", 1)[0] in QUANTIZING_OPS
        for n in graph.nodes
    )
