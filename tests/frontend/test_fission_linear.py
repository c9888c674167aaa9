"""Fission rules for MatMul, Gemm, Conv, ConvTranspose and Einsum, checked against ONNX Runtime."""

import numpy as np
import pytest
from helpers import Const, check_op, rand


@pytest.mark.parametrize(
    "a,b",
    [
        ((3, 4), (4, 5)),
        ((2, 3, 4), (4, 5)),
        ((2, 3, 4), (2, 4, 5)),
        ((2, 1, 3, 4), (5, 4, 2)),
        ((4,), (4, 5)),
        ((3, 4), (4,)),
        ((4,), (4,)),
        ((2, 3, 4), (4,)),
    ],
)
def test_matmul(a, b):
    check_op("MatMul", [rand(*a), rand(*b, seed=1)], opset=13)


def test_matmul_constant_weight():
    check_op("MatMul", [rand(2, 8, 16), Const(rand(16, 4, seed=1))], opset=13)


@pytest.mark.parametrize("trans_a", [0, 1])
@pytest.mark.parametrize("trans_b", [0, 1])
@pytest.mark.parametrize("c_shape", [None, (5,), (3, 5), (1,), ()])
def test_gemm(trans_a, trans_b, c_shape):
    a = rand(4, 3) if trans_a else rand(3, 4)
    b = rand(5, 4, seed=1) if trans_b else rand(4, 5, seed=1)
    inputs = [a, Const(b)] + ([] if c_shape is None else [Const(rand(*c_shape, seed=2))])
    check_op("Gemm", inputs, {"transA": trans_a, "transB": trans_b, "alpha": 0.5, "beta": 2.0}, opset=13)


def test_gemm_default_scalars():
    check_op("Gemm", [rand(3, 4), rand(4, 5, seed=1), rand(5, seed=2)], opset=11)


CONVS = [
    # (x shape, w shape, attrs)
    ((1, 3, 8, 8), (4, 3, 3, 3), {}),
    ((2, 3, 9, 9), (4, 3, 3, 3), {"pads": [1, 1, 1, 1], "strides": [2, 2]}),
    ((1, 4, 8, 8), (4, 1, 3, 3), {"pads": [1, 1, 1, 1], "group": 4}),
    ((1, 4, 8, 8), (6, 2, 3, 3), {"pads": [0, 1, 2, 1], "group": 2}),
    ((1, 3, 10, 10), (2, 3, 3, 3), {"dilations": [2, 2]}),
    ((1, 3, 7, 9), (2, 3, 3, 2), {"auto_pad": "SAME_UPPER", "strides": [2, 2]}),
    ((1, 3, 7, 9), (2, 3, 3, 2), {"auto_pad": "SAME_LOWER", "strides": [2, 1]}),
    ((1, 3, 7, 9), (2, 3, 3, 3), {"auto_pad": "VALID"}),
    ((1, 3, 16), (4, 3, 5), {"pads": [2, 2], "strides": [3]}),
    ((1, 2, 5, 5, 5), (3, 2, 3, 3, 3), {"pads": [1, 1, 1, 1, 1, 1]}),
    ((1, 2, 6, 6), (3, 2, 1, 1), {"strides": [2, 2]}),
]


@pytest.mark.parametrize("x,w,attrs", CONVS)
@pytest.mark.parametrize("bias", [False, True])
def test_conv(x, w, attrs, bias):
    inputs = [rand(*x), Const(rand(*w, seed=1))] + ([Const(rand(w[0], seed=2))] if bias else [])
    check_op("Conv", inputs, attrs, opset=11)


def test_conv_runtime_weight():
    check_op("Conv", [rand(1, 2, 5, 5), rand(3, 2, 3, 3, seed=1)], {"pads": [1, 1, 1, 1]})


CONV_TRANSPOSES = [
    ((1, 3, 4, 4), (3, 2, 3, 3), {}),
    ((1, 3, 4, 4), (3, 2, 3, 3), {"strides": [2, 2], "pads": [1, 1, 1, 1], "output_padding": [1, 1]}),
    ((1, 4, 5, 5), (4, 1, 3, 3), {"group": 2, "strides": [2, 2]}),
    ((1, 2, 4, 4), (2, 2, 2, 2), {"strides": [2, 2], "dilations": [2, 2]}),
    ((1, 2, 4, 4), (2, 3, 3, 3), {"strides": [2, 2], "output_shape": [8, 8]}),
    ((1, 2, 4, 4), (2, 3, 3, 3), {"strides": [2, 2], "auto_pad": "SAME_UPPER"}),
    ((1, 2, 6), (2, 3, 4), {"strides": [2], "pads": [1, 2]}),
]


@pytest.mark.parametrize("x,w,attrs", CONV_TRANSPOSES)
@pytest.mark.parametrize("bias", [False, True])
def test_conv_transpose(x, w, attrs, bias):
    out_c = w[1] * attrs.get("group", 1)
    inputs = [rand(*x), Const(rand(*w, seed=1))] + ([Const(rand(out_c, seed=2))] if bias else [])
    check_op("ConvTranspose", inputs, attrs, opset=11)


EINSUMS = [
    ("ij,jk->ik", [(3, 4), (4, 5)]),
    ("bij,bjk->bik", [(2, 3, 4), (2, 4, 5)]),
    ("bhqd,bhkd->bhqk", [(2, 3, 4, 5), (2, 3, 6, 5)]),
    ("ij->ji", [(3, 4)]),
    ("ij->i", [(3, 4)]),
    ("ij", [(3, 4)]),
    ("i,i->", [(5,), (5,)]),
    ("i,j->ij", [(3,), (4,)]),
    ("...ij,...jk->...ik", [(2, 3, 4), (2, 4, 5)]),
    ("bij,jk", [(2, 3, 4), (4, 5)]),
    ("ij,jk,kl->il", [(2, 3), (3, 4), (4, 5)]),
    ("abc,cd->abd", [(2, 3, 4), (4, 2)]),
    ("ijk,ikl->jl", [(2, 3, 4), (2, 4, 5)]),
]


@pytest.mark.parametrize("equation,shapes", EINSUMS)
def test_einsum(equation, shapes):
    check_op("Einsum", [rand(*s, seed=i) for i, s in enumerate(shapes)], {"equation": equation}, opset=12)


def test_einsum_diagonal_left_opaque_and_still_correct():
    from helpers import check_model, one_node_model

    model, feeds = one_node_model("Einsum", [rand(3, 3)], {"equation": "ii->i"}, opset=12)
    result = check_model(model, feeds, allow_opaque=True)
    assert result.opaque_ops == ["Einsum"]


def test_conv_reference_matches_torch():
    """The reference executor's convolution against an independent implementation (PyTorch)."""
    import torch

    from korch.ir.prims import Prim

    x, w = rand(2, 6, 9, 9), rand(4, 3, 3, 3, seed=1)
    attrs = {"strides": (2, 1), "pads": (1, 0, 2, 1), "dilations": (1, 2), "group": 2}
    got = Prim.CONV.ref([x, w], attrs)[0]
    xt = torch.nn.functional.pad(torch.from_numpy(x), (0, 1, 1, 2))
    want = torch.nn.functional.conv2d(xt, torch.from_numpy(w), stride=(2, 1), dilation=(1, 2), groups=2)
    np.testing.assert_allclose(got, want.numpy(), rtol=1e-4, atol=1e-4)
