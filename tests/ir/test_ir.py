"""The primitive IR: shape rules, the builder's folding, the verifier, the text form, save/load."""

from types import MappingProxyType

import numpy as np
import pytest
import torch
from helpers import Const, one_node_model, onnx_model, rand

import korch
from korch.ir import reference
from korch.ir.graph import Graph, GraphBuilder, Node, VerifyError, verify
from korch.ir.prims import DEFS, Kind, Prim, ShapeError, TensorType
from korch.ir.serialize import load_graph, save_graph


def test_every_primitive_has_a_kind_rule_and_reference():
    assert set(DEFS) == set(Prim)
    assert Prim.ADD.kind is Kind.ELEMENTWISE and Prim.CONV.kind is Kind.LINEAR
    assert Kind.ELEMENTWISE < Kind.BROADCAST < Kind.REDUCE < Kind.LAYOUT < Kind.LINEAR < Kind.OPAQUE


@pytest.mark.parametrize(
    "prim,types,attrs",
    [
        (Prim.ADD, [TensorType((2, 3), "float32"), TensorType((3,), "float32")], {}),
        (Prim.ADD, [TensorType((2,), "float32"), TensorType((2,), "int64")], {}),
        (Prim.EXP, [TensorType((2,), "int64")], {}),
        (Prim.AND, [TensorType((2,), "float32"), TensorType((2,), "float32")], {}),
        (Prim.WHERE, [TensorType((2,), "float32")] * 3, {}),
        (Prim.BROADCAST, [TensorType((2, 3), "float32")], {"shape": (3, 3)}),
        (Prim.REDUCE_SUM, [TensorType((2, 3), "float32")], {"axes": (2,)}),
        (Prim.REDUCE_SUM, [TensorType((2, 3), "float32")], {"axes": (1, 0)}),
        (Prim.RESHAPE, [TensorType((2, 3), "float32")], {"shape": (4, 2)}),
        (Prim.TRANSPOSE, [TensorType((2, 3), "float32")], {"perm": (0, 0)}),
        (Prim.SLICE, [TensorType((4,), "float32")], {"starts": (2,), "steps": (1,), "sizes": (3,)}),
        (Prim.CONCAT, [TensorType((2, 3), "float32"), TensorType((3, 3), "float32")], {"axis": 1}),
        (Prim.PAD, [TensorType((2,), "float32")], {"pads": (2, 0), "mode": "reflect", "value": 0.0}),
        (Prim.GATHER, [TensorType((4,), "float32"), TensorType((2,), "float32")], {"axis": 0}),
        (Prim.WINDOW, [TensorType((1, 2), "float32")], {"kernel": (3,), "strides": (1,), "dilations": (1,)}),
        (Prim.MATMUL, [TensorType((2, 3), "float32"), TensorType((4, 5), "float32")], {}),
        (Prim.ARGSORT, [TensorType((2, 3), "bool")], {"axis": 1, "descending": False}),
        (Prim.ARGSORT, [TensorType((2, 3), "float32")], {"axis": 2, "descending": False}),
        (  # updates not [len(index), *data.shape[1:]]
            Prim.SCATTER,
            [TensorType((5, 3), "float32"), TensorType((2,), "int64"), TensorType((2, 4), "float32")],
            {"reduction": "none"},
        ),
        (
            Prim.SCATTER,
            [TensorType((5,), "bool"), TensorType((2,), "int64"), TensorType((2,), "bool")],
            {"reduction": "add"},
        ),
        (
            Prim.SCATTER,
            [TensorType((5,), "float32"), TensorType((2,), "int64"), TensorType((2,), "float32")],
            {"reduction": "mean"},
        ),
        (
            Prim.CONV,
            [TensorType((1, 3, 4, 4), "float32"), TensorType((2, 2, 3, 3), "float32")],
            {"strides": (1, 1), "pads": (0, 0, 0, 0), "dilations": (1, 1), "group": 1},
        ),
    ],
)
def test_shape_rules_reject_bad_operands(prim, types, attrs):
    with pytest.raises(ShapeError):
        prim.infer(types, attrs)


def test_argsort_is_stable_both_ways_and_puts_nan_last_ascending():
    x = np.array([[2.0, 1.0, 2.0, np.nan, 1.0]], dtype="float32")
    (up,) = Prim.ARGSORT.ref([x], {"axis": 1, "descending": False})
    (down,) = Prim.ARGSORT.ref([x], {"axis": 1, "descending": True})
    np.testing.assert_array_equal(up, [[1, 4, 0, 2, 3]])
    np.testing.assert_array_equal(down, [[3, 0, 2, 1, 4]])  # (as torch.sort(stable=True))
    want = torch.sort(torch.from_numpy(x), dim=1, descending=True, stable=True).indices.numpy()
    np.testing.assert_array_equal(down, want)


def test_scatter_reduces_repeated_rows():
    data = np.zeros((3, 2), "float32")
    rows = np.array([2, 0, 2], "int64")
    updates = np.array([[1, 2], [3, 4], [5, 6]], "float32")
    (added,) = Prim.SCATTER.ref([data, rows, updates], {"reduction": "add"})
    (largest,) = Prim.SCATTER.ref([data - 9, rows, updates], {"reduction": "max"})
    np.testing.assert_array_equal(added, [[3, 4], [0, 0], [6, 8]])
    np.testing.assert_array_equal(largest, [[3, 4], [-9, -9], [5, 6]])
    (t,) = Prim.SCATTER.infer([TensorType.of(a) for a in (data, rows, updates)], {"reduction": "add"})
    assert t == TensorType((3, 2), "float32")


def test_window_shape_and_reference():
    x = np.arange(10, dtype="float32").reshape(1, 10)
    attrs = {"kernel": (3,), "strides": (2,), "dilations": (2,)}
    (t,) = Prim.WINDOW.infer([TensorType.of(x)], attrs)
    (y,) = Prim.WINDOW.ref([x], attrs)
    assert t.shape == y.shape == (1, 3, 3)
    np.testing.assert_array_equal(y[0], [[0, 2, 4], [2, 4, 6], [4, 6, 8]])


def test_builder_folds_constants_but_not_large_broadcasts():
    b = GraphBuilder()
    x = b.input("x", TensorType((4, 100), "float32"))
    c = b.const(np.arange(4, dtype="float32").reshape(4, 1))
    (two,) = b.emit(Prim.MUL, [c, b.const(np.float32(2))])
    assert two in b.constants  # folded
    (wide,) = b.emit(Prim.BROADCAST, [two], shape=(4, 100))
    assert wide not in b.constants  # 400 elements: left as a primitive
    (y,) = b.emit(Prim.ADD, [x, wide])
    g = b.build([y], ["y"])
    verify(g)
    assert [n.prim for n in g.nodes] == [Prim.BROADCAST, Prim.ADD]
    out = reference.run(g, {"x": np.ones((4, 100), "float32")})["y"]
    np.testing.assert_array_equal(out[:, 0], [1, 3, 5, 7])


def test_build_prunes_dead_nodes_and_constants():
    b = GraphBuilder()
    x = b.input("x", TensorType((3,), "float32"))
    b.emit(Prim.EXP, [x])
    (y,) = b.emit(Prim.NEG, [x])
    g = b.build([y], ["y"])
    assert [n.prim for n in g.nodes] == [Prim.NEG]


def _graph(nodes, types, outputs=("t1",), constants=None):
    return Graph(
        ("x",),
        tuple(outputs),
        tuple(outputs),
        MappingProxyType(types),
        MappingProxyType(constants or {}),
        tuple(nodes),
    )


def test_verifier_catches_broken_graphs():
    f = TensorType((2,), "float32")
    ok = _graph([Node(Prim.EXP, ("x",), ("t1",))], {"x": f, "t1": f})
    verify(ok)
    with pytest.raises(VerifyError, match="before it is defined"):
        verify(
            _graph(
                [Node(Prim.EXP, ("t0",), ("t1",)), Node(Prim.EXP, ("x",), ("t0",))],
                {"x": f, "t0": f, "t1": f},
            )
        )
    with pytest.raises(VerifyError, match="assigned twice"):
        verify(_graph([Node(Prim.EXP, ("x",), ("t1",)), Node(Prim.NEG, ("x",), ("t1",))], {"x": f, "t1": f}))
    with pytest.raises(VerifyError, match="types"):
        verify(_graph([Node(Prim.EXP, ("x",), ("t1",))], {"x": f, "t1": TensorType((3,), "float32")}))
    with pytest.raises(VerifyError, match="never defined"):
        verify(_graph([Node(Prim.EXP, ("x",), ("t1",))], {"x": f, "t1": f}, outputs=("t9",)))


GOLDEN_SOFTMAX = """\
graph test(in0: f32[2,5]) {
  c0: f32[] = const [1.]
  t0: f32[2,1] = reduce_max(in0) axes=[1]
  t1: f32[2,5] = broadcast(t0) shape=[2,5]
  t2: f32[2,5] = sub(in0, t1)
  t3: f32[2,5] = exp(t2)
  t4: f32[2,1] = reduce_sum(t3) axes=[1]
  t5: f32[2,5] = broadcast(t4) shape=[2,5]
  t6: f32[2,5] = div(t3, t5)
  t7: f32[2,5] = mul(t6, c0)
  return t7 as out0
}"""


def test_text_form_golden_softmax():
    """Softmax subtracts the max before exp; the text form is stable across runs."""
    import onnx
    from onnx import helper

    nodes = [
        helper.make_node("Softmax", ["in0"], ["s"], axis=-1),
        helper.make_node("Mul", ["s", "one"], ["out0"]),
    ]
    graph = helper.make_graph(
        nodes,
        "test",
        [helper.make_tensor_value_info("in0", 1, [2, 5])],
        [helper.make_tensor_value_info("out0", 1, [2, 5])],
        [onnx.numpy_helper.from_array(np.array(1.0, "float32"), "one")],
    )
    model = onnx_model(graph, 13)
    text = korch.fission(model).graph.text()
    assert text == GOLDEN_SOFTMAX, text


def test_save_and_load_round_trip(tmp_path):
    model, feeds = one_node_model(
        "Conv",
        [rand(1, 3, 6, 6), Const(rand(4, 3, 3, 3, seed=1)), Const(rand(4, seed=2))],
        {"pads": [1, 1, 1, 1]},
    )
    result = korch.fission(model)
    paths = save_graph(result.graph, tmp_path / "prims.json")
    assert [p.name for p in paths] == ["prims.json", "prims.npz"]
    loaded = load_graph(tmp_path / "prims.json")
    assert loaded.text() == result.graph.text()
    np.testing.assert_array_equal(
        reference.run(loaded, feeds)["out0"], reference.run(result.graph, feeds)["out0"]
    )


def test_save_and_load_opaque_and_infinite_attrs(tmp_path):
    model, feeds = one_node_model("Einsum", [rand(3, 3)], {"equation": "ii->i"}, opset=12)
    result = korch.fission(model)
    save_graph(result.graph, tmp_path / "g.json")
    loaded = load_graph(tmp_path / "g.json")
    np.testing.assert_allclose(reference.run(loaded, feeds)["out0"], np.diag(feeds["in0"]))
    model, feeds = one_node_model(
        "MaxPool", [rand(1, 1, 4, 4)], {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}
    )
    g = korch.fission(model).graph
    save_graph(g, tmp_path / "p.json")
    assert load_graph(tmp_path / "p.json").text() == g.text()


def test_load_graph_rejects_garbage(tmp_path):
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(korch.KorchError):
        load_graph(tmp_path / "bad.json")
    (tmp_path / "other.json").write_text('{"format": "something"}')
    with pytest.raises(korch.KorchError, match="not a korch primitive graph"):
        load_graph(tmp_path / "other.json")


def test_reference_run_checks_inputs():
    model, feeds = one_node_model("Relu", [rand(2, 3)])
    g = korch.fission(model).graph
    with pytest.raises(korch.KorchError, match="missing"):
        reference.run(g, {})
    with pytest.raises(korch.KorchError, match="the graph wants"):
        reference.run(g, {"in0": np.zeros((3, 2), "float32")})


def test_reference_runs_blas_in_one_thread_and_restores_the_callers():
    """A BLAS pool's threads spin after each call: a kernel timed next in the same process would
    share the cores with them (korch.ir.reference)."""
    from threadpoolctl import threadpool_info, threadpool_limits

    def blas_threads() -> set[int]:
        return {pool["num_threads"] for pool in threadpool_info() if pool["user_api"] == "blas"}

    model, feeds = one_node_model("MatMul", [rand(8, 16), rand(16, 4)])
    g = korch.fission(model).graph
    seen = []

    def step(node, args):
        seen.append(blas_threads())
        return node.prim.ref(args, node.a)

    with threadpool_limits(2, user_api="blas"):
        got = reference.evaluate(g, dict(zip(g.inputs, feeds.values())), g.outputs, step)
        assert blas_threads() == {2}
    assert seen and all(threads == {1} for threads in seen)
    np.testing.assert_allclose(got[g.outputs[0]], np.matmul(*feeds.values()), rtol=1e-5)
