"""Fission rules that write by index or order by value (ScatterElements, ScatterND, TopK), checked
against ONNX Runtime."""

import numpy as np
import pytest
from helpers import Const, check_op, one_node_model, rand

import korch
from korch.ir.prims import Prim


def _distinct(rng, dim, shape):
    """Indices in [-dim, dim) naming distinct positions along their last axis (a repeated index
    without a reduction leaves the order of the writes open)."""
    picks = np.stack([rng.permutation(dim)[: shape[-1]] for _ in range(int(np.prod(shape[:-1])))])
    negative = rng.random(picks.shape) < 0.5
    return np.where(negative, picks - dim, picks).reshape(shape).astype("int64")


@pytest.mark.parametrize("const", [False, True])
@pytest.mark.parametrize(
    "opset,reduction", [(11, None), (13, None), (16, "add"), (16, "mul"), (18, "max"), (18, "min")]
)
@pytest.mark.parametrize("axis,ishape", [(0, (2, 3, 5)), (1, (3, 2, 4)), (-1, (2, 4, 3))])
def test_scatter_elements(const, opset, reduction, axis, ishape):
    shape = (3, 4, 5)
    rng = np.random.default_rng(len(ishape) + axis + opset)
    moved = np.moveaxis(np.zeros(ishape), axis, -1).shape
    idx = np.moveaxis(_distinct(rng, shape[axis], moved), -1, axis)
    if reduction:  # repeated indices: every update reduces into its place
        idx = rng.integers(-shape[axis], shape[axis], ishape).astype("int64")
    attrs = {"axis": axis, **({"reduction": reduction} if reduction else {})}
    updates = rand(*ishape, seed=3)
    result = check_op("ScatterElements", [rand(*shape), Const(idx) if const else idx, updates], attrs, opset)
    assert Prim.SCATTER in [n.prim for n in result.graph.nodes]


def test_scatter_opset_9_and_int_data():
    idx = np.array([[1, 0, 2], [0, 2, 1]], dtype="int64")
    check_op("Scatter", [rand(3, 3), idx, rand(2, 3, seed=1)], {"axis": 0}, opset=9)
    data = rand(2, 6, dtype="int32", high=50)
    check_op(
        "ScatterElements", [data, idx, rand(2, 3, dtype="int32", seed=2)], {"axis": 1, "reduction": "add"}, 16
    )


SCATTER_ND = [
    # (data shape, indices shape): whole rows, elements, and blocks in between
    ((6,), (4, 1)),
    ((5, 4), (3, 1)),
    ((5, 4), (2, 3, 2)),
    ((4, 5, 6), (3, 2)),
    ((4, 5, 6), (2, 2, 1)),
]


@pytest.mark.parametrize("const", [False, True])
@pytest.mark.parametrize("opset,reduction", [(11, None), (16, "add"), (16, "mul"), (18, "max"), (18, "min")])
@pytest.mark.parametrize("shape,ishape", SCATTER_ND)
def test_scatter_nd(const, opset, reduction, shape, ishape):
    rng = np.random.default_rng(sum(ishape) + opset)
    m = ishape[-1]
    tuples = int(np.prod(ishape[:-1]))
    block = int(np.prod(shape[:m]))
    flat = rng.permutation(block)[:tuples] if not reduction else rng.integers(0, block, tuples)
    idx = np.stack(np.unravel_index(flat, shape[:m]), axis=-1).reshape(ishape)
    idx = np.where(rng.random(ishape) < 0.5, idx - np.array(shape[:m]), idx).astype("int64")
    updates = rand(*ishape[:-1], *shape[m:], seed=5)
    attrs = {"reduction": reduction} if reduction else {}
    check_op("ScatterND", [rand(*shape), Const(idx) if const else idx, updates], attrs, opset)


def test_scatter_updates_that_do_not_fit_are_refused():
    model, _ = one_node_model(
        "ScatterElements", [rand(2, 3), np.zeros((2, 2), "int64"), rand(2, 3)], opset=13
    )
    with pytest.raises(korch.KorchError, match="do not fit"):
        korch.fission(model)


@pytest.mark.parametrize("opset", [10, 11])
@pytest.mark.parametrize("largest", [1, 0])
@pytest.mark.parametrize("axis,k", [(-1, 3), (0, 2), (1, 6), (1, 0)])
def test_top_k(opset, largest, axis, k):
    # few distinct values: ties must come out by index, as the spec asks
    x = np.random.default_rng(k).integers(0, 4, (4, 6, 5)).astype("float32")
    attrs = {"axis": axis}
    if opset >= 11:
        attrs["largest"] = largest
    elif not largest:
        pytest.skip("largest is new in opset 11")
    check_op(
        "TopK", [x, Const(np.array([k], "int64"))], attrs, opset, n_outputs=2, out_dtypes=["float32", "int64"]
    )


def test_top_k_opset_1_and_ints():
    check_op("TopK", [rand(3, 7)], {"k": 4}, opset=1, n_outputs=2, out_dtypes=["float32", "int64"])
    x = rand(3, 7, dtype="int64", high=3)
    check_op(
        "TopK", [x, Const(np.array([5], "int64"))], {"largest": 0}, 11, n_outputs=2, out_dtypes=["int64"] * 2
    )
