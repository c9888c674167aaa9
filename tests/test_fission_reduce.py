"""Fission rules for reductions, softmax and normalizations, checked against ONNX Runtime."""

import numpy as np
import pytest
from helpers import Const, check_op, rand

REDUCE_OPS = [
    "ReduceSum",
    "ReduceMean",
    "ReduceMax",
    "ReduceMin",
    "ReduceProd",
    "ReduceL1",
    "ReduceL2",
    "ReduceSumSquare",
    "ReduceLogSumExp",
]
AXES = [[1], [-1], [0, 2], [], None]


def _reduce(op, x, axes, keepdims, opset, noop=None):
    attrs = {"keepdims": keepdims}
    if noop is not None:
        attrs["noop_with_empty_axes"] = noop
    axes_in_input = opset >= 18 or (op == "ReduceSum" and opset >= 13)
    if axes is None:
        return check_op(op, [x], attrs, opset=opset)
    if axes_in_input:
        return check_op(op, [x, Const(np.array(axes, dtype="int64"))], attrs, opset=opset)
    if axes:
        attrs["axes"] = axes
    return check_op(op, [x], attrs, opset=opset)


@pytest.mark.parametrize("op", REDUCE_OPS)
@pytest.mark.parametrize("axes", AXES)
@pytest.mark.parametrize("keepdims", [0, 1])
@pytest.mark.parametrize("opset", [13, 18])
def test_reductions(op, axes, keepdims, opset):
    x = rand(3, 4, 5, low=0.5, high=1.5) if op == "ReduceProd" else rand(3, 4, 5)
    _reduce(op, x, axes, keepdims, opset)


def test_reduce_log_sum():
    _reduce("ReduceLogSum", rand(3, 4, low=0.1, high=2.0), [1], 1, 13)


@pytest.mark.parametrize("op", ["ReduceSum", "ReduceMean"])
def test_reduce_noop_with_empty_axes(op):
    _reduce(op, rand(3, 4), None, 1, 18, noop=1)


def test_reduce_int64():
    _reduce("ReduceSum", rand(3, 4, dtype="int64"), [1], 0, 13)
    _reduce("ReduceMax", rand(3, 4, dtype="int64"), [0], 1, 13)


@pytest.mark.parametrize("op", ["ArgMax", "ArgMin"])
@pytest.mark.parametrize("axis", [0, 1, -1])
@pytest.mark.parametrize("keepdims", [0, 1])
def test_arg_reductions(op, axis, keepdims):
    check_op(op, [rand(3, 4, 5)], {"axis": axis, "keepdims": keepdims}, out_dtypes=["int64"], opset=13)


@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax"])
@pytest.mark.parametrize("axis", [0, 1, -1, None])
@pytest.mark.parametrize("opset", [11, 13])
def test_softmax(op, axis, opset):
    attrs = {} if axis is None else {"axis": axis}
    check_op(op, [rand(2, 3, 5) * 5], attrs, opset=opset)


def test_softmax_large_logits_do_not_overflow():
    x = np.array([[1000.0, 1001.0, 999.0], [-1000.0, 0.0, 88.0]], dtype="float32")
    check_op("Softmax", [x], {"axis": -1}, opset=13)
    check_op("LogSoftmax", [x], {"axis": -1}, opset=13)


@pytest.mark.parametrize("axis", [-1, -2, 1])
@pytest.mark.parametrize("with_bias", [True, False])
def test_layer_norm(axis, with_bias):
    x = rand(2, 3, 8) * 3 + 1
    normalized = x.shape[axis:]
    inputs = [x, Const(rand(*normalized, seed=1))]
    if with_bias:
        inputs.append(Const(rand(*normalized, seed=2)))
    check_op("LayerNormalization", inputs, {"axis": axis, "epsilon": 1e-5}, opset=17)


def test_layer_norm_extra_outputs():
    x = rand(2, 3, 8)
    check_op(
        "LayerNormalization",
        [x, Const(rand(8, seed=1)), Const(rand(8, seed=2))],
        {"axis": -1},
        opset=17,
        n_outputs=3,
    )


def test_layer_norm_runtime_scale():
    check_op("LayerNormalization", [rand(2, 4, 6), rand(6, seed=1)], opset=17)


@pytest.mark.parametrize("shape", [(2, 3, 5), (1, 4, 6, 6), (2, 2, 3, 3, 3)])
def test_instance_norm(shape):
    c = shape[1]
    check_op(
        "InstanceNormalization",
        [rand(*shape) * 2 + 1, Const(rand(c, seed=1)), Const(rand(c, seed=2))],
        {"epsilon": 1e-3},
        opset=6,
    )


@pytest.mark.parametrize("groups", [1, 2, 4])
def test_group_norm_opset21(groups):
    x = rand(2, 4, 3, 3) * 2
    check_op(
        "GroupNormalization",
        [x, Const(rand(4, seed=1)), Const(rand(4, seed=2))],
        {"num_groups": groups, "epsilon": 1e-5},
        opset=21,
    )


@pytest.mark.parametrize("shape", [(2, 3), (2, 3, 5), (1, 3, 4, 4)])
@pytest.mark.parametrize("opset", [9, 14, 15])
def test_batch_norm(shape, opset):
    c = shape[1]
    params = [
        Const(rand(c, seed=1)),
        Const(rand(c, seed=2)),
        Const(rand(c, seed=3)),
        Const(rand(c, seed=4, low=0.5, high=2.0)),
    ]
    check_op("BatchNormalization", [rand(*shape), *params], {"epsilon": 1e-3}, opset=opset)


@pytest.mark.parametrize("op", ["GlobalAveragePool", "GlobalMaxPool"])
@pytest.mark.parametrize("shape", [(1, 3, 5), (2, 3, 4, 4), (1, 2, 2, 3, 3)])
def test_global_pools(op, shape):
    check_op(op, [rand(*shape)], opset=13)


@pytest.mark.parametrize("groups", [1, 2])
def test_group_norm_opset18_per_group_scale(groups):
    x = rand(2, 4, 3, 3) * 2
    check_op(
        "GroupNormalization",
        [x, Const(rand(groups, seed=1)), Const(rand(groups, seed=2))],
        {"num_groups": groups, "epsilon": 1e-5},
        opset=18,
    )


@pytest.mark.parametrize("axis", [0, 1, -1])
@pytest.mark.parametrize("exclusive", [0, 1])
@pytest.mark.parametrize("reverse", [0, 1])
def test_cumsum(axis, exclusive, reverse):
    check_op(
        "CumSum",
        [rand(3, 4, 5), Const(np.array(axis, "int64"))],
        {"exclusive": exclusive, "reverse": reverse},
        opset=14,
    )
    check_op(
        "CumSum",
        [rand(3, 4, 5, dtype="int64"), Const(np.array(axis, "int64"))],
        {"reverse": reverse},
        opset=14,
    )
