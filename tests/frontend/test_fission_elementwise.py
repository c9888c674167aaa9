"""Fission rules for elementwise operators, each checked against ONNX Runtime."""

import numpy as np
import pytest
import torch
from helpers import Const, check_op, rand

BROADCASTS = [((2, 3, 4), (2, 3, 4)), ((2, 3, 4), (4,)), ((2, 1, 4), (3, 1)), ((1,), (2, 3)), ((), (5,))]


@pytest.mark.parametrize("op", ["Add", "Sub", "Mul", "Div"])
@pytest.mark.parametrize("shapes", BROADCASTS)
@pytest.mark.parametrize("opset", [13, 14, 21])
def test_arithmetic(op, shapes, opset):
    a, b = rand(*shapes[0]), rand(*shapes[1], seed=1)
    check_op(op, [a, b], opset=opset)


@pytest.mark.parametrize("op", ["Add", "Mul", "Sub", "Div"])
def test_arithmetic_int64(op):
    a = rand(3, 4, dtype="int64", low=1, high=20)
    b = rand(4, dtype="int64", seed=2, low=1, high=7)
    check_op(op, [a, b], opset=14)


def test_arithmetic_with_constant_operand():
    check_op("Mul", [rand(2, 5), Const(np.array([0.5], dtype="float32"))])
    check_op("Add", [Const(rand(5, seed=3)), rand(4, 5)])


@pytest.mark.parametrize("op", ["Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual"])
@pytest.mark.parametrize("shapes", BROADCASTS[:3])
def test_comparisons(op, shapes):
    a = rand(*shapes[0], dtype="int64")
    b = rand(*shapes[1], dtype="int64", seed=1)
    check_op(op, [a, b], opset=13, out_dtypes=["bool"])
    check_op(op, [a.astype("float32"), b.astype("float32")], opset=16, out_dtypes=["bool"])


@pytest.mark.parametrize("op", ["And", "Or", "Xor"])
def test_logical(op):
    check_op(op, [rand(3, 4, dtype="bool"), rand(4, dtype="bool", seed=5)])


def test_not():
    check_op("Not", [rand(3, 4, dtype="bool")])


UNARY = [
    "Neg",
    "Abs",
    "Exp",
    "Erf",
    "Tanh",
    "Sigmoid",
    "Floor",
    "Ceil",
    "Sin",
    "Cos",
    "Sign",
    "Relu",
    "Softplus",
    "Softsign",
    "Identity",
]


@pytest.mark.parametrize("op", UNARY)
@pytest.mark.parametrize("shape", [(7,), (2, 3, 5), ()])
def test_unary(op, shape):
    check_op(op, [rand(*shape) * 4], opset=13)


@pytest.mark.parametrize("op", ["Log", "Sqrt", "Reciprocal"])
def test_unary_positive(op):
    check_op(op, [rand(3, 4, low=0.1, high=5.0)], opset=13)


def test_round_half_to_even():
    check_op("Round", [np.array([-2.5, -1.5, -0.5, 0.5, 1.5, 2.5, 0.4, 2.6], dtype="float32")])


def test_softplus_large_inputs_do_not_overflow():
    check_op("Softplus", [np.array([-100, -20, 0, 20, 80, 100], dtype="float32")])


@pytest.mark.parametrize("alpha", [0.01, 0.2])
def test_leaky_relu(alpha):
    check_op("LeakyRelu", [rand(3, 8)], {"alpha": alpha})


def test_leaky_relu_default_alpha():
    check_op("LeakyRelu", [rand(3, 8)])


@pytest.mark.parametrize("slope_shape", [(1,), (8,), (3, 1)])
def test_prelu(slope_shape):
    check_op("PRelu", [rand(3, 8), Const(rand(*slope_shape, seed=4))])


@pytest.mark.parametrize(
    "op,attrs",
    [
        ("Elu", {}),
        ("Elu", {"alpha": 0.5}),
        ("Selu", {}),
        ("Selu", {"alpha": 1.5, "gamma": 1.1}),
        ("Celu", {"alpha": 2.0}),
        ("HardSigmoid", {}),
        ("HardSigmoid", {"alpha": 0.3, "beta": 0.4}),
        ("HardSwish", {}),
        ("ThresholdedRelu", {"alpha": 0.5}),
    ],
)
def test_parametric_activations(op, attrs):
    check_op(op, [rand(4, 6) * 3], attrs, opset=14)


@pytest.mark.parametrize("opset", [18, 21])
def test_mish(opset):
    check_op("Mish", [rand(4, 6) * 5], opset=opset)


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelu(approximate):
    check_op("Gelu", [rand(4, 6) * 3], {"approximate": approximate}, opset=20)


@pytest.mark.parametrize("exponent", [2.0, 0.5, 3.0, 1.0, -1.0])
def test_pow_constant_exponent(exponent):
    check_op("Pow", [rand(3, 4, low=0.1, high=3.0), Const(np.array(exponent, dtype="float32"))])


def test_pow_tensor_exponent():
    check_op("Pow", [rand(3, 4, low=0.1, high=3.0), rand(4, seed=2)])


def test_pow_int_exponent():
    check_op("Pow", [rand(3, 4, low=0.1, high=3.0), Const(np.array(2, dtype="int64"))], opset=15)


@pytest.mark.parametrize("opset", [6, 11, 13])
def test_clip(opset):
    x = rand(4, 5) * 3
    if opset < 11:
        check_op("Clip", [x], {"min": -1.0, "max": 0.5}, opset=opset)
    else:
        lo, hi = Const(np.array(-1.0, "float32")), Const(np.array(0.5, "float32"))
        check_op("Clip", [x, lo, hi], opset=opset)
        check_op("Clip", [x, None, hi], opset=opset)
        check_op("Clip", [x, lo], opset=opset)
        check_op("Clip", [x], opset=opset)


@pytest.mark.parametrize(
    "to,dtype", [(1, "float32"), (7, "int64"), (6, "int32"), (9, "bool"), (10, "float16")]
)
def test_cast(to, dtype):
    check_op("Cast", [rand(3, 4) * 10], {"to": to}, out_dtypes=[dtype], opset=13)


def test_cast_like():
    check_op("CastLike", [rand(3, 4) * 10, Const(np.zeros(1, "int64"))], out_dtypes=["int64"], opset=15)


@pytest.mark.parametrize("shapes", [((3, 4), (3, 4), (3, 4)), ((4,), (3, 1), ()), ((1, 4), (3, 4), (1,))])
def test_where(shapes):
    c = rand(*shapes[0], dtype="bool")
    check_op(
        "Where", [c, rand(*shapes[1], seed=1), rand(*shapes[2], seed=2)], opset=16, out_dtypes=["float32"]
    )


@pytest.mark.parametrize("op", ["Max", "Min", "Sum", "Mean"])
@pytest.mark.parametrize("n", [1, 2, 3])
def test_variadic(op, n):
    check_op(op, [rand(3, 4, seed=i) if i % 2 == 0 else rand(4, seed=i) for i in range(n)], opset=13)


@pytest.mark.parametrize("opset", [7, 12, 13])
def test_dropout_is_identity_at_inference(opset):
    if opset < 12:
        check_op("Dropout", [rand(3, 4)], {"ratio": 0.3}, opset=opset)
    else:
        check_op("Dropout", [rand(3, 4), Const(np.array(0.3, "float32"))], opset=opset)


def test_dropout_in_training_mode_with_a_zero_ratio_is_the_identity():
    """(ONNX Runtime, the oracle, returns the input and an all-true mask; a nonzero ratio in
    training mode is random and stays opaque.)"""
    ratio, training = Const(np.array(0.0, "float32")), Const(np.array(True))
    check_op("Dropout", [rand(3, 4), ratio, training], opset=13, n_outputs=2, out_dtypes=["float32", "bool"])


SPECIALS = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1.5, -2.0, 3e38, -3e38, 1e-30], dtype="float32")


@pytest.mark.parametrize("opset", [9, 13, 20])
@pytest.mark.parametrize("dtype", ["float32", "float64", "float16"])
def test_is_nan(opset, dtype):
    with np.errstate(over="ignore"):  # float16 turns 3e38 into inf
        x = np.concatenate([SPECIALS, rand(6)]).astype(dtype)
    check_op("IsNaN", [x.reshape(4, 4)], opset=opset, out_dtypes=["bool"])


@pytest.mark.parametrize("negative", [None, 0, 1])
@pytest.mark.parametrize("positive", [None, 0, 1])
@pytest.mark.parametrize("opset", [10, 20])
def test_is_inf(negative, positive, opset):
    attrs = {k: v for k, v in [("detect_negative", negative), ("detect_positive", positive)] if v is not None}
    for dtype in ["float32", "float64"]:
        x = np.concatenate([SPECIALS, rand(6)]).astype(dtype).reshape(2, 8)
        check_op("IsInf", [x], attrs, opset=opset, out_dtypes=["bool"])
    check_op("IsInf", [np.array(-np.inf, "float32")], attrs, opset=opset, out_dtypes=["bool"])


@pytest.mark.parametrize("attrs", [{}, {"lambd": 1.5}, {"lambd": 1.5, "bias": 0.7}, {"bias": -0.3}])
@pytest.mark.parametrize("dtype", ["float32", "float64", "float16", "int64", "int32", "int8", "uint8"])
def test_shrink(attrs, dtype):
    x = rand(4, 6) * 4 if dtype.startswith("float") else rand(4, 6, dtype="int64", low=-5, high=6)
    x = np.concatenate([x.reshape(-1), [0.5, -0.5, 1.5, -1.5, 0]]).astype(dtype)
    # ONNX Runtime computes in float32 (float64 too, where korch keeps float64): else bit for bit
    check_op("Shrink", [x], attrs, opset=9, tol=1e-4 if dtype == "float64" else 0)


@pytest.mark.parametrize("direction", ["LEFT", "RIGHT"])
def test_bit_shift_uint8(direction):
    x = np.arange(256, dtype="uint8").reshape(16, 16)
    y = np.array([0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 15, 31, 32, 33, 64, 255], dtype="uint8")
    check_op("BitShift", [x, y], {"direction": direction}, opset=11)
    check_op("BitShift", [x, Const(np.array(3, "uint8"))], {"direction": direction}, opset=11)


@pytest.mark.parametrize("dtype", ["int8", "int16", "int32", "int64"])
@pytest.mark.parametrize("direction", ["LEFT", "RIGHT"])
def test_bit_shift_signed(dtype, direction):
    """Opset 28's signed shifts against numpy's << and >> (ONNX Runtime has no opset 28): the
    extremes of the type, negative and too-large shifts; in the reference and in torch."""
    from helpers import one_node_model

    import korch
    from korch.backends.torch_ops import graph_function
    from korch.ir import reference

    info, bits = np.iinfo(dtype), np.iinfo(dtype).bits
    x = np.array([info.min, info.max, -1, 0, 1, -5, 5, 77, -77, info.min + 1] * 3, dtype)
    y = np.array([0, 1, bits - 1, bits, bits + 1, -1, 3, 7, bits // 2, 2] * 3, dtype)
    graph = korch.fission(one_node_model("BitShift", [x, y], {"direction": direction}, opset=28)[0]).graph
    fine = (y >= 0) & (y < bits)
    shift = np.where(fine, y, 0)
    if direction == "LEFT":  # (bits moved past the sign bit are dropped)
        want = np.where(fine, (x.astype("int64").view("uint64") << shift.astype("uint64")).view("int64"), 0)
    else:
        want = np.where(fine, x >> shift.astype(dtype), np.where(x < 0, -1, 0))
    want = want.astype(dtype)
    (got,) = reference.run(graph, dict(zip(graph.inputs, [x, y]))).values()
    assert np.array_equal(got, want)
    (torch_got,) = graph_function(graph)(torch.from_numpy(x), torch.from_numpy(y))
    assert np.array_equal(torch_got.numpy(), want)


# each function's inputs: inside its domain, near the places formulas lose accuracy, and huge
DOMAINS = {
    "Tan": (-1.5, 1.5),
    "Sinh": (-9.0, 9.0),
    "Cosh": (-9.0, 9.0),
    "Asinh": (-50.0, 50.0),
    "Acosh": (1.0, 50.0),
    "Atanh": (-0.999, 0.999),
    "Asin": (-1.0, 1.0),
    "Acos": (-1.0, 1.0),
    "Atan": (-50.0, 50.0),
}
EDGES = {
    "Tan": [0.0, -0.0, 1e-6, -3e-3, 3.0, 100.0, np.nan, np.inf],
    "Sinh": [0.0, 1e-6, -1e-3, 0.99, -1.01, 89.0, -89.0, 90.0, np.nan, np.inf, -np.inf],
    "Cosh": [0.0, 1e-6, -1e-3, 89.0, -89.0, 90.0, np.nan, np.inf, -np.inf],
    "Asinh": [0.0, 1e-6, -1e-3, 1e10, -3e38, np.nan, np.inf, -np.inf],
    "Acosh": [1.0, 1.0 + 2e-7, 1.001, 1e10, 3e38, 0.5, -2.0, -5000.0, -1e8, -3e38, np.nan, np.inf],
    "Atanh": [0.0, 1e-6, -1e-3, 0.9999999, -0.9999999, 1.0, -1.0, 1.5, np.nan],
    "Asin": [0.0, -0.0, 1e-6, -1e-3, 0.9999999, -0.9999999, 1.0, -1.0, 1.5, -2.0, np.nan, np.inf],
    "Acos": [0.0, 1e-6, 0.9999999, -0.9999999, 1.0, -1.0, 1.5, -1.5, np.nan, -np.inf],
    "Atan": [0.0, -0.0, 1e-6, -1e-3, 1e10, -3e38, np.nan, np.inf, -np.inf],
}


@pytest.mark.parametrize("op", list(DOMAINS))
@pytest.mark.parametrize("opset", [9, 22])
def test_trig_and_hyperbolic(op, opset):
    low, high = DOMAINS[op]
    check_op(op, [rand(5, 7, low=low, high=high)], opset=opset)
    check_op(op, [np.array(EDGES[op], dtype="float32")], opset=opset)
    check_op(op, [rand(low=low, high=high)], opset=opset)


@pytest.mark.parametrize("op", list(DOMAINS))
def test_trig_and_hyperbolic_small_inputs_keep_relative_accuracy(op):
    x = rand(50, low=-1e-5, high=1e-5)
    if op == "Acosh":  # the float32 values just above 1
        x = 1 + np.float32(2**-23) * np.arange(50, dtype="float32")
    check_op(op, [x], opset=9, tol=1e-5)


@pytest.mark.parametrize("op", list(DOMAINS))
def test_trig_and_hyperbolic_float16(op):
    low, high = DOMAINS[op]
    x = rand(5, 7, low=low, high=min(high, 8.0)).astype("float16")
    check_op(op, [x], opset=9, tol=1e-3)


@pytest.mark.parametrize("attrs", [{}, {"alpha": 1.0}, {"alpha": 0.5}, {"alpha": 1.702}])
def test_swish(attrs):
    check_op("Swish", [rand(4, 6) * 5], attrs, opset=24)
    edges = np.array([-100, -20, 0, 20, 100, np.nan, np.inf, -np.inf], "float32")
    check_op("Swish", [edges], attrs, opset=24)
