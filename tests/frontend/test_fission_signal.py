"""DFT, STFT and the window functions, against ONNX Runtime."""

import numpy as np
import pytest
from helpers import Const, check_op, rand

CASES = [(None, 0, 0), (None, 0, 1), (12, 0, 0), (5, 0, 1), (None, 1, 0), (9, 1, 0)]


@pytest.mark.parametrize(
    "parts,length,inverse,onesided",
    [(parts, *case) for parts in (1, 2) for case in CASES if not (parts == 2 and case[2])],
)
def test_dft_along_an_axis(parts, length, inverse, onesided):
    """Real or complex signals cut or zero-padded to dft_length, forward or inverse, full or
    one-sided (ONNX Runtime takes one-sided transforms of real signals only); opset 17: axis 1."""
    inputs = [rand(2, 8, 3, parts), Const(np.array(length, "int64")) if length else None]
    check_op("DFT", inputs, {"inverse": inverse, "onesided": onesided, "axis": 1}, opset=17)


def test_dft_inverse_one_sided_is_real():
    """The inverse of a half spectrum (irfft), opset 20 with its axis an input."""
    spectrum = rand(2, 3, 5, 2)
    check_op(
        "DFT",
        [spectrum, Const(np.array(8, "int64")), Const(np.array(-2, "int64"))],
        {"inverse": 1, "onesided": 1},
        opset=20,
    )


@pytest.mark.parametrize("onesided", [0, 1])
def test_stft_with_a_hann_window(onesided):
    window = (0.5 - 0.5 * np.cos(2 * np.pi * np.arange(16) / 16)).astype("float32")
    inputs = [rand(2, 64, 1), Const(np.array(6, "int64")), Const(window), Const(np.array(16, "int64"))]
    check_op("STFT", inputs, {"onesided": onesided}, opset=17)


@pytest.mark.parametrize("op", ["HannWindow", "HammingWindow", "BlackmanWindow"])
@pytest.mark.parametrize("periodic", [0, 1])
def test_window_functions_are_constants(op, periodic):
    check_op(op, [Const(np.array(10, "int64"))], {"periodic": periodic}, opset=17, out_dtypes=["float32"])


@pytest.mark.parametrize(
    "mels,length,rate,low,high", [(8, 16, 8192, 0.0, 4096.0), (20, 64, 16000, 80.0, 7600.0)]
)
def test_mel_weight_matrix_is_a_constant(mels, length, rate, low, high):
    inputs = [
        Const(np.array(v, dtype))
        for v, dtype in zip((mels, length, rate, low, high), ["int64"] * 3 + ["float32"] * 2)
    ]
    check_op("MelWeightMatrix", inputs, {}, opset=17, out_dtypes=["float32"])
