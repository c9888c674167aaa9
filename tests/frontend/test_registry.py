"""The fission registry: version lookup, duplicate detection, and a test for every rule."""

import re
from pathlib import Path

import pytest

from korch.frontend.lowering import find_rule, fission, registered_ops


def test_highest_version_at_or_below_the_opset_wins():
    v1, v13 = find_rule("Softmax", 11), find_rule("Softmax", 13)
    assert v1 is not v13
    assert find_rule("Softmax", 21) is v13
    assert find_rule("GroupNormalization", 17) is None
    assert find_rule("NoSuchOp", 17) is None


def test_rules_are_per_domain():
    onnx_gelu, ms_gelu = find_rule("Gelu", 20), find_rule("Gelu", 1, "com.microsoft")
    assert None not in (onnx_gelu, ms_gelu) and onnx_gelu is not ms_gelu
    assert find_rule("Gelu", 1) is None  # (ONNX's is from opset 20)
    assert find_rule("FusedMatMul", 1) is None and find_rule("Gelu", 1, "ai.onnx.ml") is None
    assert "com.microsoft:SkipLayerNormalization" in registered_ops()


def test_duplicate_registration_is_an_error():
    with pytest.raises(RuntimeError, match="registered twice"):
        fission("Softmax", 13)(lambda ctx, n: [])


def test_every_registered_op_has_a_test():
    here = Path(__file__)
    sources = "".join(p.read_text() for p in here.parents[1].rglob("test_*.py") if p != here)
    quoted = set(re.findall(r'"([A-Z][A-Za-z0-9]+)"', sources))
    missing = sorted(op for op in registered_ops() if op.split(":")[-1] not in quoted)  # (domain:op)
    assert not missing, f"fission rules without a test: {missing}"


REQUIRED = [
    "Add",
    "Sub",
    "Mul",
    "Div",
    "Pow",
    "Neg",
    "Abs",
    "Exp",
    "Log",
    "Sqrt",
    "Reciprocal",
    "Erf",
    "Tanh",
    "Sigmoid",
    "Relu",
    "LeakyRelu",
    "Elu",
    "Selu",
    "HardSigmoid",
    "HardSwish",
    "Mish",
    "Softplus",
    "Clip",
    "Min",
    "Max",
    "Where",
    "Equal",
    "Less",
    "Greater",
    "Not",
    "And",
    "Cast",
    "Identity",
    "Dropout",
    "Softmax",
    "LogSoftmax",
    "LayerNormalization",
    "InstanceNormalization",
    "GroupNormalization",
    "BatchNormalization",
    "ReduceSum",
    "ReduceMean",
    "ReduceMax",
    "ReduceMin",
    "ReduceProd",
    "ReduceL2",
    "GlobalAveragePool",
    "AveragePool",
    "MaxPool",
    "MatMul",
    "Gemm",
    "Conv",
    "ConvTranspose",
    "Einsum",
    "Transpose",
    "Reshape",
    "Flatten",
    "Squeeze",
    "Unsqueeze",
    "Expand",
    "Slice",
    "Split",
    "Concat",
    "Pad",
    "Gather",
    "Tile",
    "Resize",
    "Trilu",
    "Shape",
    "Gather",
    "ConstantOfShape",
    "Range",
    "Constant",
]


@pytest.mark.parametrize("op", REQUIRED)
def test_required_ops_have_rules_for_opsets_13_to_21(op):
    import onnx.defs

    introduced = min(
        s.since_version for s in onnx.defs.get_all_schemas_with_history() if s.name == op and s.domain == ""
    )
    for opset in range(max(13, introduced), 22):
        assert find_rule(op, opset) is not None, (op, opset)
