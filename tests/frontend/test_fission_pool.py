"""Fission rules for pooling and resampling, checked against ONNX Runtime."""

import numpy as np
import pytest
from helpers import Const, check_model, check_op, one_node_model, rand

import korch

POOLS = [
    {"kernel_shape": [2, 2], "strides": [2, 2]},
    {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]},
    {"kernel_shape": [3, 3], "strides": [1, 1], "pads": [1, 1, 1, 1]},
    {"kernel_shape": [5, 5], "strides": [1, 1], "pads": [2, 2, 2, 2]},
    {"kernel_shape": [3, 2], "strides": [2, 3], "pads": [0, 1, 1, 0]},
    {"kernel_shape": [3, 3], "strides": [2, 2], "ceil_mode": 1},
    {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1], "ceil_mode": 1},
    {"kernel_shape": [3, 3], "strides": [2, 2], "auto_pad": "SAME_UPPER"},
    {"kernel_shape": [2, 2], "strides": [2, 2], "auto_pad": "SAME_LOWER"},
    {"kernel_shape": [3, 3], "auto_pad": "VALID"},
    # kernels past the whole input, kept by ceil_mode's partial windows: trimmed to what they reach
    {"kernel_shape": [12, 16], "strides": [12, 16], "ceil_mode": 1},
    {"kernel_shape": [8, 12], "strides": [8, 12], "pads": [1, 0, 0, 1], "ceil_mode": 1},
]


@pytest.mark.parametrize("attrs", POOLS)
@pytest.mark.parametrize("opset", [11, 13, 19])
def test_max_pool(attrs, opset):
    check_op("MaxPool", [rand(1, 3, 9, 10)], attrs, opset=opset)


@pytest.mark.parametrize("attrs", POOLS[:7])
def test_max_pool_indices(attrs):
    """Indices count over the whole tensor, batch and channels too; ties go to the first."""
    x = np.round(rand(2, 3, 9, 10) * 2)
    check_op("MaxPool", [x], attrs, opset=12, n_outputs=2, out_dtypes=["float32", "int64"])


@pytest.mark.parametrize("attrs", POOLS[-2:])
def test_max_pool_indices_of_a_kernel_past_the_input(attrs):
    x = np.round(rand(2, 3, 9, 10) * 2)
    check_op("MaxPool", [x], attrs, opset=12, n_outputs=2, out_dtypes=["float32", "int64"])


def test_a_kernel_past_the_input_is_trimmed_to_it():
    """Hugging Face's EfficientNet pools its last 2x2 pixels with AvgPool2d(1280, ceil_mode=True):
    untrimmed, 1280x1280 taps per channel, 8 GB of windows. Checked against ONNX Runtime, and no
    value of the primitive graph is larger than the input."""
    x = rand(1, 4, 2, 2)
    attrs = {"kernel_shape": [1280, 1280], "strides": [1280, 1280], "ceil_mode": 1}
    for op in ("AveragePool", "MaxPool"):
        model, feeds = one_node_model(op, [x], attrs, opset=19)
        check_model(model, feeds)
        graph = korch.fission(model).graph
        assert max(t.nbytes for t in graph.types.values()) <= x.nbytes


def test_max_pool_dilated_and_1d():
    check_op("MaxPool", [rand(1, 2, 9, 9)], {"kernel_shape": [2, 2], "dilations": [2, 2]}, opset=12)
    check_op("MaxPool", [rand(2, 3, 11)], {"kernel_shape": [3], "strides": [2], "pads": [1, 1]}, opset=12)


@pytest.mark.parametrize("attrs", POOLS)
@pytest.mark.parametrize("count_include_pad", [0, 1])
def test_average_pool(attrs, count_include_pad):
    check_op("AveragePool", [rand(1, 3, 9, 10)], {**attrs, "count_include_pad": count_include_pad}, opset=19)


@pytest.mark.parametrize("attrs", POOLS)
@pytest.mark.parametrize("p", [1, 2, 3])
def test_lp_pool(attrs, p):
    """A sum pool of |x|^p, then the p-th root; ceil_mode is new in opset 18."""
    opset = 18 if "ceil_mode" in attrs else 11
    check_op("LpPool", [rand(1, 3, 9, 10)], {**attrs, "p": p}, opset=opset)


def test_lp_pool_dilated_1d_and_opset_2():
    check_op("LpPool", [rand(1, 2, 9, 9)], {"kernel_shape": [2, 2], "dilations": [2, 2], "p": 3}, opset=18)
    check_op("LpPool", [rand(2, 3, 11)], {"kernel_shape": [3], "strides": [2], "pads": [1, 1]}, opset=2)


@pytest.mark.parametrize("align_corners", [0, 1])
@pytest.mark.parametrize("padding", ["zeros", "border", "reflection"])
@pytest.mark.parametrize("opset,mode", [(16, "bilinear"), (16, "nearest"), (20, "linear")])
def test_grid_sample(align_corners, padding, opset, mode):
    """A grid reaching three times past the edges: reflection mirrors more than once."""
    grid = rand(2, 4, 6, 2, seed=1) * 3
    attrs = {"mode": mode, "padding_mode": padding, "align_corners": align_corners}
    check_op("GridSample", [rand(2, 3, 5, 7), grid], attrs, opset=opset)


@pytest.mark.parametrize("padding", ["zeros", "border", "reflection"])
@pytest.mark.parametrize("align_corners", [0, 1])
def test_grid_sample_bicubic(padding, align_corners):
    """16 taps around each grid point, each tap's coordinates padded on their own, against ONNX
    Runtime; the grid reaches past the image."""
    grid = (np.random.default_rng(3).uniform(-1.4, 1.4, (2, 5, 3, 2))).astype("float32")
    attrs = {"mode": "bicubic", "padding_mode": padding, "align_corners": align_corners}
    check_op("GridSample", [rand(2, 3, 4, 6), grid], attrs, opset=16)


@pytest.mark.parametrize(
    "attrs,offset_groups,mask,bias",
    [
        ({}, 1, False, False),
        ({"strides": [2, 1], "pads": [1, 0, 1, 2], "dilations": [1, 2]}, 1, True, True),
        ({"group": 2}, 2, True, False),
    ],
)
def test_deform_conv(attrs, offset_groups, mask, bias):
    """Offsets that move taps past the image (read as zero), masks and biases, groups of channels
    and of offsets, against ONNX Runtime."""
    rng = np.random.default_rng(4)
    x, w = rand(2, 4, 7, 6), rand(6, 4 // attrs.get("group", 1), 3, 2, seed=1)
    s, p, d = attrs.get("strides", [1, 1]), attrs.get("pads", [0] * 4), attrs.get("dilations", [1, 1])
    oh, ow = [
        (size + p[i] + p[i + 2] - d[i] * (k - 1) - 1) // s[i] + 1
        for i, (size, k) in enumerate([(7, 3), (6, 2)])
    ]
    offset = rng.uniform(-2.5, 2.5, (2, offset_groups * 2 * 6, oh, ow)).astype("float32")
    inputs = [x, Const(w), offset, Const(rand(6, seed=2)) if bias else None]
    if mask:
        inputs.append(rng.uniform(0, 1, (2, offset_groups * 6, oh, ow)).astype("float32"))
    attrs = {"kernel_shape": [3, 2], "offset_group": offset_groups, **attrs}
    check_model(*one_node_model("DeformConv", inputs, attrs, 19))


@pytest.mark.parametrize(
    "mode,ctm,nearest",
    [
        ("nearest", "asymmetric", "floor"),
        ("nearest", "half_pixel", "round_prefer_floor"),
        ("nearest", "half_pixel", "round_prefer_ceil"),
        ("nearest", "align_corners", "round_prefer_floor"),
        ("nearest", "asymmetric", "ceil"),
        ("nearest", "pytorch_half_pixel", "floor"),
        ("linear", "half_pixel", None),
        ("linear", "asymmetric", None),
        ("linear", "align_corners", None),
        ("linear", "pytorch_half_pixel", None),
        ("linear", "half_pixel_symmetric", None),
        ("nearest", "tf_half_pixel_for_nn", "floor"),
    ],
)
@pytest.mark.parametrize("scales", [(1, 1, 2, 2), (1, 1, 0.5, 0.5), (1, 1, 1.5, 3), (1, 1, 0.6, 1.7)])
def test_resize_scales(mode, ctm, nearest, scales):
    attrs = {"mode": mode, "coordinate_transformation_mode": ctm}
    if nearest:
        attrs["nearest_mode"] = nearest
    scales = Const(np.array(scales, dtype="float32"))
    check_op("Resize", [rand(1, 2, 5, 6), None, scales], attrs, opset=19)


@pytest.mark.parametrize("sizes", [(1, 2, 10, 12), (1, 2, 3, 4), (1, 2, 7, 1)])
@pytest.mark.parametrize("mode", ["nearest", "linear"])
def test_resize_sizes(sizes, mode):
    check_op(
        "Resize", [rand(1, 2, 5, 6), None, None, Const(np.array(sizes, "int64"))], {"mode": mode}, opset=13
    )


def test_resize_axes_opset18():
    check_op(
        "Resize",
        [rand(1, 2, 5, 6), None, Const(np.array([2.0, 3.0], "float32"))],
        {"mode": "linear", "axes": [2, 3]},
        opset=18,
    )


def test_resize_opset10_and_11():
    check_op(
        "Resize", [rand(1, 2, 4, 4), Const(np.array([1, 1, 2, 2], "float32"))], {"mode": "nearest"}, opset=10
    )
    roi = Const(np.array([], "float32"))
    check_op(
        "Resize",
        [rand(1, 2, 4, 4), roi, Const(np.array([1, 1, 2, 2], "float32"))],
        {"mode": "linear"},
        opset=11,
    )


@pytest.mark.parametrize("mode", ["nearest", "linear"])
def test_upsample(mode):
    check_op(
        "Upsample", [rand(1, 2, 3, 4), Const(np.array([1, 1, 2, 3], "float32"))], {"mode": mode}, opset=9
    )
    check_op("Upsample", [rand(1, 2, 3, 4)], {"mode": mode, "scales": [1.0, 1.0, 2.0, 2.0]}, opset=7)


@pytest.mark.parametrize(
    "attrs",
    [
        {},
        {"coordinate_transformation_mode": "align_corners"},
        {"coordinate_transformation_mode": "asymmetric", "cubic_coeff_a": -0.5},
        {"coordinate_transformation_mode": "pytorch_half_pixel", "exclude_outside": 1},
    ],
)
@pytest.mark.parametrize("scales", [[1, 1, 2, 2], [1, 1, 0.75, 1.5]])
def test_resize_cubic(attrs, scales):
    """Four taps per axis, the edge repeated past it (or with exclude_outside the taps outside
    dropped and the rest renormalized), against ONNX Runtime."""
    check_op(
        "Resize", [rand(1, 2, 4, 6), None, Const(np.array(scales, "float32"))], {"mode": "cubic", **attrs}
    )


def test_resize_tf_crop_and_resize():
    """A region of interest resampled, the coordinates past the input given the extrapolation value."""
    roi = Const(np.array([0, 0, -0.2, 0.1, 1, 1, 0.9, 1.3], "float32"))
    for mode in ("nearest", "linear", "cubic"):
        attrs = {
            "mode": mode,
            "coordinate_transformation_mode": "tf_crop_and_resize",
            "extrapolation_value": 7.0,
        }
        check_op("Resize", [rand(1, 2, 5, 6), roi, Const(np.array([1, 1, 1.6, 1.5], "float32"))], attrs)


@pytest.mark.parametrize("mode", ["linear", "cubic"])
@pytest.mark.parametrize("scales", [[1, 1, 0.5, 0.5], [1, 1, 0.3, 0.75], [1, 1, 0.45, 1.6]])
def test_resize_antialiased_downsampling(mode, scales):
    """The filter stretched by 1 / scale over more taps, normalized, on the downsampled axes only,
    against ONNX Runtime (ONNX's own cases are 4x4 inputs)."""
    for ctm in ("half_pixel", "align_corners"):
        attrs = {"mode": mode, "antialias": 1, "coordinate_transformation_mode": ctm}
        check_op("Resize", [rand(1, 2, 17, 12), None, Const(np.array(scales, "float32"))], attrs, opset=18)


@pytest.mark.parametrize("scale", [1.1376531, 1.2857975, 0.95])
def test_nearest_resize_axis_keeping_its_size_is_copied(scale):
    n = 7 if scale > 1 else 20
    check_op(
        "Resize", [rand(1, 2, 3, n), None, Const(np.array([1, 1, 1, scale], "float32"))], {"mode": "nearest"}
    )


@pytest.mark.parametrize("seed", range(30))
def test_resize_random_scales(seed):
    rng = np.random.default_rng(seed)
    scales = np.array([1, 1, *rng.integers(1, 13, 2) / 4], "float32")  # exact in binary: no near-ties
    mode = ["nearest", "linear"][seed % 2]
    ctm = ["half_pixel", "asymmetric", "align_corners", "pytorch_half_pixel"][seed % 4]
    check_op(
        "Resize",
        [rand(1, 1, 5, 7), None, Const(scales)],
        {"mode": mode, "coordinate_transformation_mode": ctm},
        opset=13,
    )


@pytest.mark.parametrize("size,align_corners", [([2, 3, 4, 5], 0), ([2, 3, 4, 5], 1), ([2, 3, 2, 4, 3], 0)])
def test_affine_grid(size, align_corners):
    """theta times the output's normalized coordinates, 2-d and 3-d, against ONNX Runtime."""
    nd = len(size) - 2
    check_op(
        "AffineGrid",
        [rand(2, nd, nd + 1), Const(np.array(size, "int64"))],
        {"align_corners": align_corners},
        opset=20,
    )


@pytest.mark.parametrize(
    "attrs", [{}, {"strides": [2, 1], "pads": [1, 0, 1, 1], "dilations": [1, 2]}], ids=["plain", "strided"]
)
def test_col2im(attrs):
    """Blocks summed back into images (overlaps add up), against ONNX Runtime."""
    image, block = [6, 5], [3, 2]
    s, p, d = attrs.get("strides", [1, 1]), attrs.get("pads", [0] * 4), attrs.get("dilations", [1, 1])
    positions = [(image[i] + p[i] + p[i + 2] - d[i] * (block[i] - 1) - 1) // s[i] + 1 for i in range(2)]
    x = rand(2, 2 * 6, positions[0] * positions[1])
    check_op("Col2Im", [x, Const(np.array(image, "int64")), Const(np.array(block, "int64"))], attrs, opset=18)
