"""Fission rules for layout operators and static shape arithmetic, checked against ONNX Runtime."""

import numpy as np
import onnx
import pytest
from helpers import Const, check_model, check_op, onnx_model, rand
from onnx import helper

import korch
from korch.prims import Prim


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
