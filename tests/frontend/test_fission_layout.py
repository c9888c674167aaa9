"""Fission rules for layout operators and static shape arithmetic, checked against ONNX Runtime."""

import numpy as np
import onnx
import pytest
from helpers import Const, check_model, check_op, onnx_model, rand
from onnx import helper

import korch
from korch.ir.prims import Prim


def i64(*values):
    return Const(np.array(values, dtype="int64"))


@pytest.mark.parametrize(
    "shape,target",
    [
        ((2, 3, 4), (6, 4)),
        ((2, 3, 4), (-1,)),
        ((2, 3, 4), (0, -1)),
        ((2, 3, 4), (4, 0, 2)),
        ((6,), (1, 2, 1, 3)),
    ],
)
def test_reshape(shape, target):
    check_op("Reshape", [rand(*shape), i64(*target)], opset=13)


def test_reshape_allowzero():
    check_op("Reshape", [rand(0, 3), i64(3, 0)], {"allowzero": 1}, opset=14)


@pytest.mark.parametrize("axis", [0, 1, 2, -1, -3])
def test_flatten(axis):
    check_op("Flatten", [rand(2, 3, 4)], {"axis": axis}, opset=13)


@pytest.mark.parametrize("opset", [11, 13])
@pytest.mark.parametrize("axes", [[1], [-1], [1, 3], None])
def test_squeeze(opset, axes):
    x = rand(2, 1, 3, 1)
    if axes is None:
        check_op("Squeeze", [x], opset=opset)
    elif opset < 13:
        check_op("Squeeze", [x], {"axes": axes}, opset=opset)
    else:
        check_op("Squeeze", [x, i64(*axes)], opset=opset)


@pytest.mark.parametrize("opset", [11, 13])
@pytest.mark.parametrize("axes", [[0], [-1], [1, 3], [0, 4]])
def test_unsqueeze(opset, axes):
    x = rand(2, 3, 4)
    if opset < 13:
        check_op("Unsqueeze", [x], {"axes": axes}, opset=opset)
    else:
        check_op("Unsqueeze", [x, i64(*axes)], opset=opset)


@pytest.mark.parametrize("perm", [None, [0, 2, 1], [2, 0, 1], [0, 1, 2]])
def test_transpose(perm):
    check_op("Transpose", [rand(2, 3, 4)], {} if perm is None else {"perm": perm})


@pytest.mark.parametrize(
    "shape,target", [((3, 1), (2, 3, 4)), ((1,), (5,)), ((2, 3), (1, 1)), ((4,), (3, 1, 4))]
)
def test_expand(shape, target):
    check_op("Expand", [rand(*shape), i64(*target)], opset=13)


@pytest.mark.parametrize("reps", [(1, 1), (2, 3), (1, 4), (3, 1)])
def test_tile(reps):
    check_op("Tile", [rand(2, 3), i64(*reps)], opset=13)


SLICES = [
    ([1], [3], [0], [1]),
    ([0], [-1], [1], [1]),
    ([-3], [100], [2], [1]),
    ([3], [0], [0], [-1]),
    ([-1], [-100], [1], [-2]),
    ([0, 1], [5, 4], [0, 2], [2, 2]),
    ([2], [2], [0], [1]),
    ([0], [2**62], [-1], [3]),
]


@pytest.mark.parametrize("starts,ends,axes,steps", SLICES)
def test_slice(starts, ends, axes, steps):
    check_op("Slice", [rand(4, 5, 6), i64(*starts), i64(*ends), i64(*axes), i64(*steps)], opset=13)


def test_slice_default_axes_and_steps():
    check_op("Slice", [rand(4, 5), i64(1, 0), i64(3, 4)], opset=13)


def test_slice_opset1_attributes():
    check_op("Slice", [rand(4, 5)], {"starts": [1], "ends": [3], "axes": [1]}, opset=9)


@pytest.mark.parametrize("opset", [11, 13, 18])
@pytest.mark.parametrize("axis,split", [(0, [1, 3]), (1, None), (-1, [2, 2, 2])])
def test_split(opset, axis, split):
    x = rand(4, 6, 6)
    n = len(split) if split else 3
    attrs = {"axis": axis}
    inputs = [x]
    if split is not None and opset < 13:
        attrs["split"] = split
    elif split is not None:
        inputs.append(i64(*split))
    elif opset >= 18:
        attrs["num_outputs"] = n
    check_op("Split", inputs, attrs, opset=opset, n_outputs=n)


def test_split_uneven_num_outputs():
    check_op("Split", [rand(7, 2)], {"axis": 0, "num_outputs": 3}, opset=18, n_outputs=3)


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_concat(axis):
    shapes = [[2, 3, 4] for _ in range(3)]
    for i, s in enumerate(shapes):
        s[axis] = i + 1
    check_op("Concat", [rand(*s, seed=i) for i, s in enumerate(shapes)], {"axis": axis})


def test_concat_with_constant_and_empty():
    check_op("Concat", [rand(2, 3), Const(rand(2, 0)), Const(rand(2, 2, seed=3))], {"axis": 1})


@pytest.mark.parametrize(
    "axis,indices",
    [
        (0, np.array([2, 0, 1])),
        (1, np.array([[0, 1], [2, 2]])),
        (-1, np.array(1)),
        (0, np.array([-1, 0])),
    ],
)
def test_gather(axis, indices):
    check_op("Gather", [rand(3, 4, 3), Const(indices.astype("int64"))], {"axis": axis}, opset=13)


def test_gather_runtime_indices():
    check_op("Gather", [Const(rand(10, 4)), np.array([[1, 9], [0, 3]], dtype="int64")], {"axis": 0})


@pytest.mark.parametrize("mode", ["constant", "reflect", "edge"])
@pytest.mark.parametrize("pads", [[0, 1, 2, 0, 2, 1], [1, 0, 0, 1, 0, 0], [0, 0, 2, 0, 0, 2]])
@pytest.mark.parametrize("opset", [11, 13, 19])
def test_pad(mode, pads, opset):
    check_op("Pad", [rand(2, 3, 4), i64(*pads), Const(np.array(1.5, "float32"))], {"mode": mode}, opset=opset)


def test_pad_opset2_attributes():
    check_op("Pad", [rand(2, 3)], {"pads": [0, 1, 1, 0], "value": 2.0}, opset=2)


def test_pad_negative_crops():
    check_op("Pad", [rand(4, 5), i64(-1, 2, 1, -2)], opset=13)


def test_pad_axes():
    check_op("Pad", [rand(2, 3, 4), i64(1, 2), Const(np.array(0.0, "float32")), i64(-1)], opset=18)


@pytest.mark.parametrize("upper", [0, 1])
@pytest.mark.parametrize("k", [None, 0, 1, -1, 5])
def test_trilu(upper, k):
    inputs = [rand(2, 4, 5)] + ([] if k is None else [i64(k)])
    check_op("Trilu", inputs, {"upper": upper}, opset=14)


@pytest.mark.parametrize("mode", ["DCR", "CRD"])
def test_depth_to_space(mode):
    check_op("DepthToSpace", [rand(1, 8, 2, 3)], {"blocksize": 2, "mode": mode}, opset=13)


def test_space_to_depth():
    check_op("SpaceToDepth", [rand(1, 2, 4, 6)], {"blocksize": 2}, opset=13)


@pytest.mark.parametrize("op,opset", [("DepthToSpace", 13), ("SpaceToDepth", 28)])  # (its mode: opset 28)
def test_a_depth_mode_other_than_dcr_or_crd_is_refused(op, opset):
    from helpers import one_node_model

    model, _ = one_node_model(op, [rand(1, 8, 4, 4)], {"blocksize": 2, "mode": "XYZ"}, opset=opset)
    with pytest.raises(korch.KorchError, match="mode 'XYZ' is not DCR or CRD"):
        korch.fission(model)


def _shape_model(opset=15):
    """x -> Shape -> Gather/Slice/Concat/ConstantOfShape arithmetic -> Reshape and Expand."""
    nodes = [
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Gather", ["s", "zero"], ["batch"], axis=0),
        helper.make_node("Slice", ["s", "one", "big"], ["rest"]),
        helper.make_node("ReduceProd", ["rest"], ["flat"], keepdims=1),
        helper.make_node("Unsqueeze", ["batch", "zero1"], ["batch1"]),
        helper.make_node("Concat", ["batch1", "flat"], ["newshape"], axis=0),
        helper.make_node("Reshape", ["x", "newshape"], ["y"]),
        helper.make_node("Shape", ["y"], ["ys"], start=-1),
        helper.make_node(
            "ConstantOfShape",
            ["ys"],
            ["ones"],
            value=helper.make_tensor("v", onnx.TensorProto.FLOAT, [1], [1.0]),
        ),
        helper.make_node("Add", ["y", "ones"], ["z"]),
        helper.make_node("Size", ["x"], ["n"]),
        helper.make_node("Cast", ["n"], ["nf"], to=onnx.TensorProto.FLOAT),
        helper.make_node("Range", ["r0", "nf", "r1"], ["r"]),
        helper.make_node("Shape", ["r"], ["rs"]),
        helper.make_node("Cast", ["rs"], ["rsf"], to=onnx.TensorProto.FLOAT),
        helper.make_node("Mul", ["z", "rsf"], ["out"]),
    ]
    inits = [
        onnx.numpy_helper.from_array(np.array(0, "int64"), "zero"),
        onnx.numpy_helper.from_array(np.array([0], "int64"), "zero1"),
        onnx.numpy_helper.from_array(np.array([1], "int64"), "one"),
        onnx.numpy_helper.from_array(np.array([100], "int64"), "big"),
        onnx.numpy_helper.from_array(np.array(0.0, "float32"), "r0"),
        onnx.numpy_helper.from_array(np.array(1.0, "float32"), "r1"),
    ]
    graph = helper.make_graph(
        nodes,
        "shapes",
        [helper.make_tensor_value_info("x", 1, [2, 3, 4])],
        [helper.make_tensor_value_info("out", 1, None)],
        inits,
    )
    return onnx_model(graph, opset)


def test_shape_arithmetic_folds_away():
    model = _shape_model()
    result = check_model(model, {"x": rand(2, 3, 4)})
    prims = [n.prim for n in result.graph.nodes]
    # only the real tensor work survives: reshape, add of a broadcast constant, mul
    assert prims == [Prim.RESHAPE, Prim.ADD, Prim.MUL], prims


def test_constant_node_variants():
    nodes = [
        helper.make_node("Constant", [], ["a"], value_float=2.0),
        helper.make_node("Constant", [], ["b"], value_floats=[1.0, 2.0, 3.0]),
        helper.make_node("Constant", [], ["c"], value=onnx.numpy_helper.from_array(np.ones(3, "float32"))),
        helper.make_node("Mul", ["x", "a"], ["t1"]),
        helper.make_node("Add", ["t1", "b"], ["t2"]),
        helper.make_node("Sub", ["t2", "c"], ["out"]),
    ]
    graph = helper.make_graph(
        nodes,
        "c",
        [helper.make_tensor_value_info("x", 1, [2, 3])],
        [helper.make_tensor_value_info("out", 1, None)],
    )
    model = onnx_model(graph, 13)
    check_model(model, {"x": rand(2, 3)})


def test_dynamic_reshape_target_is_refused():
    model, _ = __import__("helpers").one_node_model(
        "Reshape", [rand(2, 3), np.array([3, 2], "int64")], opset=13
    )
    with pytest.raises(korch.KorchError, match="known at compile time"):
        korch.fission(model)


def _runtime_or_const(value, const):
    return Const(value) if const else value


def _prims(result):
    return [n.prim for n in result.graph.nodes]


def idx_in(shape, dim, dtype="int64", seed=0):
    """Random indices in [-dim, dim): about half of them negative."""
    return np.random.default_rng(seed).integers(-dim, dim, shape).astype(dtype)


@pytest.mark.parametrize("const", [False, True])
@pytest.mark.parametrize("dtype", ["int64", "int32"])
@pytest.mark.parametrize("opset", [11, 13])
@pytest.mark.parametrize(
    "axis,ishape", [(0, (5, 4, 2)), (1, (3, 6, 5)), (2, (2, 3, 7)), (-1, (3, 4, 1)), (-3, (1, 1, 1))]
)
def test_gather_elements(const, dtype, opset, axis, ishape):
    shape = (3, 4, 5)
    idx = idx_in(ishape, shape[axis], dtype, seed=len(ishape) + axis)
    result = check_op("GatherElements", [rand(*shape), _runtime_or_const(idx, const)], {"axis": axis}, opset)
    assert Prim.GATHER in _prims(result)


@pytest.mark.parametrize("const", [False, True])
def test_gather_elements_rank1_and_default_axis(const):
    idx = np.array([3, -1, 0, -6, 5, 5, 2], dtype="int64")
    check_op("GatherElements", [rand(6), _runtime_or_const(idx, const)], opset=13)
    check_op("GatherElements", [rand(4, 3), _runtime_or_const(idx_in((6, 2), 4), const)], opset=13)


def test_gather_elements_runtime_data_and_int_dtype():
    data = rand(2, 3, 4, dtype="int32", high=100)
    check_op("GatherElements", [data, idx_in((2, 3, 9), 4)], {"axis": 2}, opset=13)


def test_gather_elements_shape_mismatch_is_refused():
    model, _ = __import__("helpers").one_node_model(
        "GatherElements", [rand(2, 3), idx_in((2, 4), 2)], {"axis": 0}, opset=13
    )
    with pytest.raises(korch.KorchError, match="do not fit"):
        korch.fission(model)


GATHER_ND = [
    # (data shape, indices shape, batch_dims)
    ((4, 5), (3, 2), 0),
    ((4, 5), (3, 1), 0),
    ((4, 5, 6), (2, 3, 2), 0),
    ((4, 5, 6), (2, 3), 0),
    ((4, 5, 6), (7, 1), 0),
    ((4,), (2, 2, 1), 0),
    ((2, 5, 6), (2, 1), 1),
    ((2, 5, 6), (2, 3, 2), 1),
    ((2, 3, 4, 5), (2, 3, 4, 1), 2),
    ((2, 3, 4, 5), (2, 3, 2), 2),
]


@pytest.mark.parametrize("const", [False, True])
@pytest.mark.parametrize("opset", [11, 12, 13])
@pytest.mark.parametrize("shape,ishape,batch_dims", GATHER_ND)
def test_gather_nd(const, opset, shape, ishape, batch_dims):
    if batch_dims and opset < 12:
        pytest.skip("batch_dims is new in opset 12")
    m = ishape[-1]
    dims = shape[batch_dims : batch_dims + m]
    rng = np.random.default_rng(sum(ishape))
    idx = np.stack([rng.integers(-d, d, ishape[:-1]) for d in dims], axis=-1).astype("int64")
    attrs = {"batch_dims": batch_dims} if opset >= 12 else {}
    check_op("GatherND", [rand(*shape), _runtime_or_const(idx, const)], attrs, opset)


@pytest.mark.parametrize("const", [False, True])
@pytest.mark.parametrize("opset", [9, 11])
@pytest.mark.parametrize("axis", [-1, 0, 1, -2, 2, -3])
def test_one_hot(const, opset, axis):
    # out of range [-4, 4) on both sides: all off; negative in range: counts from depth
    idx = np.array([[0, 3, -1, 5], [-4, -5, 2, 1]], dtype="int64")
    if opset < 11 and const:  # ONNX shape inference rejects constant negatives before opset 11
        idx = np.where(idx < 0, idx + 8, idx)  # (ONNX Runtime wraps runtime ones all the same)
    values = np.array([-2.0, 5.0], dtype="float32")
    check_op(
        "OneHot",
        [_runtime_or_const(idx, const), i64(4), Const(values)],
        {"axis": axis},
        opset,
        out_dtypes=["float32"],
    )


@pytest.mark.parametrize(
    "idx_dtype,depth_dtype,values_dtype",
    [
        ("int64", "int64", "int64"),
        ("int32", "float32", "float32"),
        ("float32", "int64", "int64"),
        ("float32", "float32", "float32"),
        ("int64", "float32", "int32"),
    ],
)
def test_one_hot_dtypes(idx_dtype, depth_dtype, values_dtype):
    idx = np.array([[1.7, -1.2, 0.0], [2.9, -3.0, 7.0]]).astype(idx_dtype)
    values = Const(np.array([0, 1], dtype=values_dtype))  # 0/1 lowers to a cast
    depth = Const(np.array([3], dtype=depth_dtype))
    result = check_op("OneHot", [idx, depth, values], {"axis": 1}, 11, out_dtypes=[values_dtype])
    assert _prims(result)[-1] is Prim.CAST


@pytest.mark.parametrize("axis", [0, 2, -1])
def test_one_hot_runtime_values(axis):
    values = np.array([3.0, -1.0], dtype="float32")
    idx = idx_in((2, 3, 4), 6)
    check_op("OneHot", [idx, i64(5), values], {"axis": axis}, 11, out_dtypes=["float32"])


def test_one_hot_dynamic_depth_is_refused():
    model, _ = __import__("helpers").one_node_model(
        "OneHot",
        [np.array([1, 2], "int64"), np.array(3, "int64"), Const(np.array([0.0, 1.0], "float32"))],
        opset=11,
        out_dtypes=["float32"],
    )
    with pytest.raises(korch.KorchError, match="known at compile time"):
        korch.fission(model)


@pytest.mark.parametrize("shape", [(3, 4), (4, 3), (1, 5)])
@pytest.mark.parametrize("k", [0, 1, -2, 9])
@pytest.mark.parametrize("dtype", [None, "float32", "int64", "int32"])
def test_eye_like(shape, k, dtype):
    attrs = {"k": k} if k else {}
    if dtype is not None:
        attrs["dtype"] = onnx.helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    x = rand(*shape, dtype="int32")
    result = check_op("EyeLike", [x], attrs, opset=9, out_dtypes=[dtype or "int32"])
    assert result.graph.nodes == ()  # a constant


COMPRESS = [
    # (condition, axis)
    ([1, 0, 1, 1], 0),  # irregular: gather
    ([0, 1, 0, 1, 0], 1),  # evenly spaced: slice
    ([1, 1], 1),  # shorter than the axis
    ([0, 1, 1, 0, 0, 0, 1], -1),  # longer than the axis: the rest is ignored
    ([0, 0, 0], 2),  # nothing selected
    ([1, 0, 0, 1, 1, 0, 1, 0, 1], None),  # flattened
    ([0] * 10 + [1, 0, 1], None),
]


@pytest.mark.parametrize("opset", [9, 11])
@pytest.mark.parametrize("cond,axis", COMPRESS)
def test_compress(opset, cond, axis):
    if opset < 11 and axis is not None and axis < 0:
        pytest.skip("negative axes are new in opset 11")
    attrs = {} if axis is None else {"axis": axis}
    check_op("Compress", [rand(4, 5, 6), Const(np.array(cond, dtype=bool))], attrs, opset)


def test_compress_slices_when_evenly_spaced():
    result = check_op("Compress", [rand(4, 6), Const(np.array([0, 1, 0, 1, 0, 1], bool))], {"axis": 1}, 11)
    assert _prims(result) == [Prim.SLICE]


def test_compress_dynamic_condition_is_refused():
    model, _ = __import__("helpers").one_node_model(
        "Compress", [rand(4, 5), np.array([True, False, True, True])], {"axis": 0}, opset=11
    )
    with pytest.raises(korch.KorchError, match="known at compile time"):
        korch.fission(model)


@pytest.mark.parametrize("const", [False, True])
@pytest.mark.parametrize("time_axis", [0, 1])
@pytest.mark.parametrize("shape", [(5, 4), (5, 4, 3), (4, 5, 2, 3)])
def test_reverse_sequence(const, time_axis, shape):
    batch_axis = 1 - time_axis
    time, batch = shape[time_axis], shape[batch_axis]
    lens = np.array([time, 1, 3, 0, 2][:batch], dtype="int64")
    attrs = {"time_axis": time_axis, "batch_axis": batch_axis}
    check_op("ReverseSequence", [rand(*shape), _runtime_or_const(lens, const)], attrs, opset=10)


def test_reverse_sequence_default_axes_and_identity():
    check_op("ReverseSequence", [rand(4, 3, 2), i64(4, 2, 3)], opset=10)
    result = check_op("ReverseSequence", [rand(4, 3), i64(1, 0, 1)], opset=10)
    assert result.graph.nodes == ()


@pytest.mark.parametrize(
    "dims,shape,axes",
    [((5, 6), [3, 8], None), ((5, 6, 4), [7, 5], [0, 2]), ((5, 6), [4], [-1])],
    ids=["crop-and-pad", "axes", "negative-axis"],
)
def test_center_crop_pad(dims, shape, axes):
    """Each axis cropped or zero-padded to its size, centred (an odd difference's extra at the end)."""
    attrs = {} if axes is None else {"axes": axes}
    check_op("CenterCropPad", [rand(*dims), Const(np.array(shape, "int64"))], attrs, opset=18)
