"""Integer inputs: korch's own random inputs never divide by zero, and indices stay in range."""

import subprocess
import sys

import numpy as np
import onnx
import pytest
from helpers import Const, one_node_model, onnx_model, rand
from onnx import TensorProto, helper

import korch
from korch.errors import KorchError
from korch.ir.prims import TensorType
from korch.measure import check
from korch.plan.plan import Plan

I64 = TensorProto.INT64
FAST = dict(progress=False, min_time=0.002, time_budget=2)


def _div_mod(shape=(2, 8)) -> onnx.ModelProto:
    """q = a / b and r = a % b on int64 inputs: b is a divisor, as a model may well use one."""
    nodes = [helper.make_node("Div", ["a", "b"], ["q"]), helper.make_node("Mod", ["a", "b"], ["r"])]
    inputs = [helper.make_tensor_value_info(n, I64, list(shape)) for n in "ab"]
    outputs = [helper.make_tensor_value_info(n, I64, list(shape)) for n in "qr"]
    return onnx_model(helper.make_graph(nodes, "divmod", inputs, outputs))


@pytest.mark.e2e
def test_integer_division_by_an_input_optimizes_and_verifies(tmp_path):
    """Random integers were drawn in [0, 2): b held zeros, and computing the activations for
    profiling failed with torch's ZeroDivisionError ('unexpected RuntimeError' from the CLI)."""
    model = _div_mod()
    assert korch.check_fission(korch.fission(model)) == 0.0
    plan = korch.optimize(model, cache=tmp_path / "db.sqlite", backends="onnxruntime", **FAST)
    assert plan.verify() == 0.0
    plan.save(tmp_path / "plan")
    loaded = Plan.load(tmp_path / "plan")
    assert loaded.verify() == 0.0
    assert all(f.min() >= 1 for f in loaded.random_inputs().values())
    # the caller's own values, negative ones included: C's truncation, the divisor's sign for Mod
    a = np.array([[7, -7, 7, -7, 0, 9, -9, 5]] * 2, dtype="int64")
    b = np.array([[2, 2, -2, -2, 3, 4, 4, -3]] * 2, dtype="int64")
    want = check.onnxruntime_outputs(model, {"a": a, "b": b})
    got = loaded.run({"a": a, "b": b})
    for name in ("q", "r"):
        np.testing.assert_array_equal(got[name], want[name])


def test_fission_check_of_an_integer_division_by_an_input_passes(tmp_path):
    path = tmp_path / "divmod.onnx"
    onnx.save(_div_mod(), path)
    proc = subprocess.run(
        [sys.executable, "-m", "korch.cli.commands", "fission", str(path), "--check", "--json"],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr
    assert "division by zero" not in proc.stderr


def test_index_inputs_keep_their_ranges_and_data_inputs_avoid_zero():
    """A gather's own indices span its table; indices a GatherElements computes from (its lowering
    adds arithmetic) stay small enough for any dimension of 2; a divisor never holds 0, even when
    it also feeds indices."""
    data = helper.make_tensor_value_info("data", TensorProto.FLOAT, [3, 2])
    ints = {"i": [4], "e": [3, 2], "a": [3, 2], "b": [3, 2]}
    inputs = [data] + [helper.make_tensor_value_info(n, I64, s) for n, s in ints.items()]
    nodes = [
        helper.make_node("Gather", ["data", "i"], ["g"], axis=0),
        helper.make_node("GatherElements", ["data", "e"], ["ge"], axis=1),
        helper.make_node("Div", ["a", "b"], ["q"]),
        helper.make_node("GatherElements", ["data", "b"], ["gb"], axis=1),  # b: an index too
    ]
    types = {"g": TensorProto.FLOAT, "ge": TensorProto.FLOAT, "q": I64, "gb": TensorProto.FLOAT}
    outputs = [helper.make_tensor_value_info(n, t, None) for n, t in types.items()]
    model = onnx_model(helper.make_graph(nodes[:3], "ints", inputs, outputs[:3]))
    graph = korch.fission(model).graph
    assert check.input_bounds(graph) == {"i": [0, 3], "e": [0, 2], "a": [1, 3], "b": [1, 3]}
    assert korch.check_fission(korch.fission(model)) == 0.0
    for seed in range(5):
        feeds = check.random_inputs(graph, seed)
        assert feeds["b"].min() >= 1 and feeds["a"].min() >= 1
        assert feeds["e"].max() < 2 and feeds["i"].max() < 3
    both = helper.make_graph(nodes[2:], "both", inputs[:1] + inputs[3:], outputs[2:])
    graph = korch.fission(onnx_model(both)).graph
    assert check.input_bounds(graph)["b"] == [1, 3]  # dividing by 0 fails; index 2 is only wrong


def test_random_feeds_take_ranges():
    t = TensorType((1000,), "int32")
    feeds = check.random_feeds([("new", t), ("none", t)], {"new": [-4, 4]})
    assert (feeds["new"].min(), feeds["new"].max()) == (-4, 3)
    assert (feeds["none"].min(), feeds["none"].max()) == (1, 2)
    flags = check.random_feeds([("m", TensorType((1000,), "bool"))], {})["m"]
    assert flags.dtype == bool and 0 < flags.sum() < 1000


def test_a_grouped_matmuls_ends_are_drawn_sorted_within_its_rows():
    """torch._grouped_mm (what Inductor and GPUs run for a grouped matmul) takes sorted ends
    within the rows, as every source of the primitive promises; random ends drawn like other
    integers (1 or 2, in any order) would have checked every such kernel on ends no model makes."""
    from korch.ir.graph import GraphBuilder
    from korch.ir.prims import Prim

    b = GraphBuilder()
    x = b.input("x", TensorType((50, 8), "float32"))
    w = b.input("w", TensorType((6, 8, 4), "float32"))
    ends = b.input("ends", TensorType((6,), "int32"))
    graph = b.build(b.emit(Prim.GROUPED_MATMUL, [x, w, ends]), ["y"])
    assert check.input_bounds(graph) == {"ends": [0, 51, "sorted"]}
    drawn = np.stack([check.random_inputs(graph, seed)["ends"] for seed in range(20)])
    assert drawn.dtype == np.int32 and (np.diff(drawn, axis=1) >= 0).all()
    assert drawn.min() >= 0 and drawn.max() <= 50 and len(np.unique(drawn)) > 40


@pytest.mark.parametrize("op", ["Div", "Mod"])
def test_an_integer_division_by_a_constant_zero_is_refused_at_import(op):
    """ONNX Runtime refuses it too; torch raised ZeroDivisionError from inside profiling."""
    model, _ = one_node_model(op, [rand(4, dtype="int64"), Const(np.array([1, 0, 2, 3], "int64"))])
    with pytest.raises(KorchError, match=rf"\({op}, opset 17\): integer division by zero"):
        korch.fission(model)
    scalar_zero, _ = one_node_model(op, [rand(4, dtype="int64"), Const(np.array(0, "int64"))])
    with pytest.raises(KorchError, match="integer division by zero"):
        korch.fission(scalar_zero)
    fine, _ = one_node_model(op, [rand(4, dtype="int64"), Const(np.array([1, 5, 2, 3], "int64"))])
    korch.fission(fine)


def test_a_divisor_computed_as_zero_is_a_clear_error(tmp_path):
    """b - a is 0 wherever the seeded inputs agree: korch cannot profile on those values, and
    says so in one line (it was an 'unexpected RuntimeError' from torch)."""
    nodes = [
        helper.make_node("Sub", ["b", "a"], ["d"], name="gap"),
        helper.make_node("Div", ["a", "d"], ["y"]),
    ]
    inputs = [helper.make_tensor_value_info(n, I64, [64]) for n in "ab"]
    model = onnx_model(helper.make_graph(nodes, "g", inputs, [helper.make_tensor_value_info("y", I64, [64])]))
    path = tmp_path / "m.onnx"
    onnx.save(model, path)
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "korch.cli.commands",
            "optimize",
            str(path),
            "-o",
            str(tmp_path / "p"),
            "--time-budget",
            "2",
            "--cache",
            str(tmp_path / "db.sqlite"),
        ],
        capture_output=True,
        text=True,
    )
    lines = [line for line in proc.stderr.splitlines() if line.startswith("korch: error")]
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert len(lines) == 1 and "integer division by zero" in lines[0] and "unexpected" not in lines[0]
