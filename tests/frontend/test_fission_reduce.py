"""Fission rules for reductions, softmax and normalizations, checked against ONNX Runtime."""

import numpy as np
import pytest
from helpers import Const, check_op, one_node_model, rand

import korch
from korch.ir import reference
from korch.measure import check

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


@pytest.mark.parametrize("axis", [0, 1, -1])
@pytest.mark.parametrize("exclusive", [0, 1])
@pytest.mark.parametrize("reverse", [0, 1])
def test_cumprod(axis, exclusive, reverse):
    """A log-step scan: lengths 3, 9 and 5 take 2, 4 and 3 steps; a zero and negative integers
    stay exact (a product through logarithms would lose both)."""
    x = rand(3, 9, 5)
    x[1, 2, 3] = 0.0
    attrs = {"exclusive": exclusive, "reverse": reverse}
    check_op("CumProd", [x, Const(np.array(axis, "int64"))], attrs, opset=26)
    ints = rand(3, 9, 5, dtype="int64", low=-3, high=4)
    check_op("CumProd", [ints, Const(np.array(axis, "int64"))], attrs, opset=26)


@pytest.mark.parametrize("axes", [None, [1], [2, 3], [0, 1, 2, 3], [-1]])
@pytest.mark.parametrize("opset", [9, 13])
def test_mean_variance_norm(axes, opset):
    attrs = {} if axes is None else {"axes": axes}
    check_op("MeanVarianceNormalization", [rand(2, 3, 4, 5) * 2 + 1], attrs, opset=opset)


@pytest.mark.parametrize("p", [1, 2])
@pytest.mark.parametrize("axis", [0, 1, -1, None])
@pytest.mark.parametrize("opset", [1, 22])
def test_lp_norm(p, axis, opset):
    attrs = {"p": p} if axis is None else {"p": p, "axis": axis}
    check_op("LpNormalization", [rand(2, 3, 4) * 3], attrs, opset=opset)


@pytest.mark.parametrize("p", [1, 2])
def test_lp_norm_zero_slice_gives_zeros(p):
    x = rand(3, 4)
    x[1] = 0.0
    check_op("LpNormalization", [x], {"p": p, "axis": 1}, opset=13)


@pytest.mark.parametrize("axis", [-1, -2, 0, None])
@pytest.mark.parametrize("epsilon", [1e-5, 0.5])
def test_rms_norm(axis, epsilon):
    x = rand(2, 3, 8) * 3 + 1
    attrs = {"epsilon": epsilon}
    if axis is not None:
        attrs["axis"] = axis
    normalized = x.shape[axis if axis is not None else -1 :]
    check_op("RMSNormalization", [x, Const(rand(*normalized, seed=1))], attrs, opset=23)


def test_rms_norm_runtime_broadcast_scale():
    check_op("RMSNormalization", [rand(2, 4, 6), rand(1, 6, seed=1)], {"axis": 1}, opset=23)


@pytest.mark.parametrize("stash_type", [0, 1])
@pytest.mark.parametrize("dtype", ["float16", "float64"])
def test_rms_norm_dtypes(stash_type, dtype):
    x = (rand(2, 3, 8) * 3 + 1).astype(dtype)
    scale = Const(rand(8, seed=1).astype(dtype))
    check_op("RMSNormalization", [x, scale], {"stash_type": stash_type}, opset=23)


@pytest.mark.parametrize("axis", [0, 1, 2, -1, None])
@pytest.mark.parametrize("opset", [1, 11, 13])
def test_hardmax(axis, opset):
    attrs = {} if axis is None else {"axis": axis}
    check_op("Hardmax", [rand(2, 3, 4)], attrs, opset=opset)


@pytest.mark.parametrize("opset", [11, 13])
def test_hardmax_ties_pick_the_first(opset):
    x = np.array([[[1, 3, 3, 2], [5, 5, 5, 5], [0, 0, 0, 0]], [[2, 1, 2, 1], [-1, 0, 0, -1], [7, 6, 7, 6]]])
    check_op("Hardmax", [x.astype("float32")], {"axis": -1}, opset=opset)


def test_hardmax_flattens_before_opset13():
    # axis 1 of [2, 2, 3] before opset 13: one winner among all 6 values of each batch row; a tie
    # across the flattened rows (index 1 and 3) goes to the first
    x = np.array([[[0, 4, 1], [4, 2, 3]], [[1, 1, 0], [0, 0, 1]]], dtype="float32")
    check_op("Hardmax", [x], {"axis": 1}, opset=11)


def _lrn_spec(x, size, alpha, beta, bias):
    """The ONNX spec's LRN formula in float64 (its window for even sizes is one wider after c)."""
    channels = x.shape[1]
    before, after = (size - 1) // 2, size - 1 - (size - 1) // 2
    x64 = x.astype("float64")
    square_sum = np.stack(
        [(x64[:, max(0, c - before) : c + after + 1] ** 2).sum(axis=1) for c in range(channels)], axis=1
    )
    return (x64 / (bias + alpha / size * square_sum) ** beta).astype(x.dtype)


LRN_ATTRS = {"alpha": 0.5, "beta": 0.75, "bias": 2.0}


@pytest.mark.parametrize("size", [1, 3, 5, 9])
@pytest.mark.parametrize("opset", [1, 13])
def test_lrn(size, opset):
    # ONNX Runtime (1.32) runs LRN on 4-D inputs with an odd size only
    x = rand(2, 6, 3, 4) * 2
    check_op("LRN", [x], {"size": size, **LRN_ATTRS}, opset=opset)
    model, feeds = one_node_model("LRN", [x], {"size": size, **LRN_ATTRS}, opset)
    want = check.onnxruntime_outputs(model, feeds)["out0"]
    assert check.rel_err(_lrn_spec(x, size, **LRN_ATTRS), want) < 1e-5  # the spec oracle used below


def test_lrn_in_float16_sums_its_squares_in_float32():
    """Squares of values near 200 sum past float16's 65504 over a window of 3 channels."""
    check_op("LRN", [(rand(1, 5, 4, 4) * 200).astype("float16")], {"size": 3}, opset=13)


def test_lrn_default_attributes():
    check_op("LRN", [rand(1, 7, 2, 3) * 20], {"size": 3}, opset=13)


@pytest.mark.parametrize("size", [2, 4])
@pytest.mark.parametrize("shape", [(2, 6, 3, 4), (2, 5, 7), (1, 4, 2, 2, 3)])
def test_lrn_even_size_and_other_ranks_follow_the_spec(size, shape):
    # ONNX Runtime refuses these, so the spec formula (checked against it above) is the reference
    x = rand(*shape) * 2
    model, feeds = one_node_model("LRN", [x], {"size": size, **LRN_ATTRS}, 13)
    result = korch.fission(model)
    assert not result.opaque
    got = reference.run(result.graph, feeds)["out0"]
    assert check.rel_err(got, _lrn_spec(x, size, **LRN_ATTRS)) < 1e-5


@pytest.mark.parametrize("reduction", ["none", "sum", "mean"])
@pytest.mark.parametrize("weighted,ignore", [(False, None), (True, 2), (False, 0)])
def test_losses_against_onnxruntime(reduction, weighted, ignore):
    """NegativeLogLikelihoodLoss and SoftmaxCrossEntropyLoss (both outputs) over [N, C, d] scores:
    class weights, an ignored class (excluded from the mean's denominator)."""
    rng = np.random.default_rng(5)
    scores, target = rand(3, 5, 4), rng.integers(0, 5, (3, 4)).astype("int64")
    weight = Const(rng.uniform(0.5, 2, 5).astype("float32")) if weighted else None
    attrs = {"reduction": reduction, **({} if ignore is None else {"ignore_index": ignore})}
    check_op("NegativeLogLikelihoodLoss", [scores, target, weight], attrs, opset=13, out_dtypes=["float32"])
    check_op(
        "SoftmaxCrossEntropyLoss",
        [scores, target, weight],
        attrs,
        opset=13,
        n_outputs=2,
        out_dtypes=["float32"] * 2,
    )
