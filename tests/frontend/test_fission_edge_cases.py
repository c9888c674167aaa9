"""Edge cases found in review (dtypes, NaN/inf, empty axes, opset quirks), checked against ONNX Runtime."""

import warnings

import numpy as np
import pytest
from helpers import Const, check_op, rand

F32 = "float32"


def i64(*v):
    return Const(np.array(v, "int64"))


def test_pow_integer_base_float_exponent():
    check_op("Pow", [np.array([4, 9, 2], "int32"), np.array([1.5, 0.5, 2.0], F32)], opset=15)


def test_pow_negative_integer_exponent():
    check_op("Pow", [np.array([2, 1, 3], "int64"), np.array([-1, 2, -2], "int64")], opset=15)


@pytest.mark.parametrize("op", ["ReduceMax", "ReduceMin", "ReduceLogSumExp", "ReduceSum"])
def test_reduction_over_empty_axis(op):
    check_op(op, [rand(2, 0, 3)], {"axes": [1], "keepdims": 0}, opset=11)


def test_log_sum_exp_of_infinite_rows():
    x = np.array([[-np.inf, -np.inf], [1, 2], [np.inf, 1]], F32)
    check_op("ReduceLogSumExp", [x], {"axes": [1]}, opset=13)


@pytest.mark.parametrize("op", ["LessOrEqual", "GreaterOrEqual"])
def test_or_equal_comparisons_with_nan(op):
    a, b = np.array([np.nan, 1, 2, 3], F32), np.array([1, np.nan, 2, 1], F32)
    check_op(op, [a, b], opset=16, out_dtypes=["bool"])


def test_cumsum_1d():
    check_op("CumSum", [rand(6), Const(np.array(0, "int64"))], opset=14)


def test_resize_opset10_nearest_downsampling_uses_ceil():
    check_op(
        "Resize", [rand(1, 1, 5, 5), Const(np.array([1, 1, 0.6, 0.6], F32))], {"mode": "nearest"}, opset=10
    )


@pytest.mark.parametrize("dtype", ["uint8", "int32"])
def test_resize_linear_on_integers(dtype):
    x = (np.arange(9).reshape(1, 1, 3, 3) * 20).astype(dtype)
    check_op("Resize", [x, None, Const(np.array([1, 1, 2, 2], F32))], {"mode": "linear"}, opset=13)


def test_upsample_output_size_in_float32():
    x = rand(1, 1, 1, 6)
    check_op(
        "Upsample", [x, Const(np.array([1, 1, 1, 1.8333332538604736], F32))], {"mode": "nearest"}, opset=9
    )


def test_pad_keeps_large_int64_values():
    x = np.array([[1, 2]], "int64")
    check_op("Pad", [x, i64(1, 0, 0, 1), Const(np.array(2**60 + 1, "int64"))], opset=13)


def test_einsum_ellipsis_letters_do_not_clash():
    check_op("Einsum", [rand(2, 3), rand(4)], {"equation": "...i,A->...iA"}, opset=12)


def test_einsum_broadcasts_the_ellipsis():
    check_op("Einsum", [rand(1, 4), rand(3, 4)], {"equation": "...j,...j->..."}, opset=12)


def test_ceil_mode_pool_where_onnx_shape_inference_disagrees():
    attrs = {"kernel_shape": [2, 2], "strides": [2, 2], "pads": [1, 1, 1, 1], "ceil_mode": 1}
    check_op("MaxPool", [rand(1, 1, 5, 5)], attrs)
    check_op("AveragePool", [rand(1, 1, 5, 5)], attrs)


def test_dropout_opset7_mask_has_the_input_type():
    check_op("Dropout", [rand(2, 3)], {}, opset=7, n_outputs=2, out_dtypes=[F32, F32])


def test_batch_norm_float16_input_float32_statistics():
    stats = [Const(rand(3)), Const(rand(3)), Const(rand(3)), Const(rand(3, low=0.5, high=1))]
    check_op("BatchNormalization", [rand(2, 3, 4, dtype="float16"), *stats], opset=15, tol=1e-2)


def test_batch_norm_opset7_spatial0():
    stats = [Const(rand(3, 2)), Const(rand(3, 2)), Const(rand(3, 2)), Const(rand(3, 2, low=0.5, high=1))]
    check_op("BatchNormalization", [rand(2, 3, 2), *stats], {"spatial": 0}, opset=7)


@pytest.mark.parametrize(
    "fmod,dtype", [(0, "int32"), (0, "int64"), (1, "int32"), (1, "int64"), (1, "float32")]
)
def test_mod(fmod, dtype):  # ONNX requires fmod=1 for floating point
    a = np.array([-7, 7, -7, 7, 5, 0, -6], dtype)
    b = np.array([3, -3, -3, 3, 5, 4, 4], dtype)
    if dtype == "float32":
        a, b = a + 0.5, b * 1.25
    check_op("Mod", [a, b], {"fmod": fmod}, opset=13)


def test_folding_the_log_of_zero_prints_no_numpy_warning():
    """T5's relative position buckets take the log of a constant 0 (-inf, then clipped): folded at
    import, numpy's "divide by zero" warning reached the user's terminal. -inf is the answer."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_op("Log", [Const(np.array([0.0, 1.0, 4.0], F32))])
        check_op("Div", [Const(np.array([0.0, 1.0], F32)), Const(np.array([0.0, 0.0], F32))])
