"""The `korch` command line: JSON output, exit codes, one-line errors on bad input."""

import json
import subprocess
import sys

import numpy as np
import onnx
import pytest
from helpers import Const, one_node_model, onnx_model, rand
from onnx import helper

from korch import cli


def run_cli(*args):
    proc = subprocess.run(
        [sys.executable, "-m", "korch.cli", *map(str, args)], capture_output=True, text=True
    )
    return proc.returncode, proc.stdout, proc.stderr


def assert_one_line_error(code, out, err, code_wanted=2, match=None):
    assert code == code_wanted, (code, out, err)
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    if match:
        assert match in lines[0], lines[0]


@pytest.fixture
def small_model(tmp_path):
    model, _ = one_node_model(
        "Conv",
        [rand(1, 3, 8, 8), Const(rand(4, 3, 3, 3, seed=1)), Const(rand(4, seed=2))],
        {"pads": [1, 1, 1, 1]},
    )
    path = tmp_path / "conv.onnx"
    onnx.save(model, path)
    return path


def test_fission_json_and_check(small_model, tmp_path):
    code, out, err = run_cli("fission", small_model, "--check", "--json", "-o", tmp_path / "p.json")
    assert code == 0, err
    doc = json.loads(out)
    assert doc["onnx_nodes"] == 1
    assert doc["primitives"] == 3  # conv, bias broadcast, add
    assert doc["by_kind"] == {
        "elementwise": 1,
        "broadcast": 1,
        "reduce": 0,
        "layout": 0,
        "linear": 1,
        "opaque": 0,
    }
    assert doc["opaque_ops"] == []
    assert 0 <= doc["max_rel_err"] <= 1e-4
    assert (tmp_path / "p.json").is_file() and (tmp_path / "p.npz").is_file()


def test_fission_human_output(small_model):
    code, out, err = run_cli("fission", small_model, "--text")
    assert code == 0, err
    assert "1 ONNX nodes -> 3 primitives" in out and "conv(" in out


def test_failed_check_exits_1(small_model, monkeypatch, capsys):
    import korch

    monkeypatch.setattr(korch, "check_fission", lambda result, seed=0: 0.5)
    assert cli.main(["fission", str(small_model), "--check", "--json"]) == 1
    captured = capsys.readouterr()
    assert json.loads(captured.out)["max_rel_err"] == 0.5
    assert "check failed" in captured.err


def test_missing_file(tmp_path):
    assert_one_line_error(*run_cli("fission", tmp_path / "nope.onnx"), match="no such file")


@pytest.mark.parametrize("content", [b"", b"\x00\x01garbage\xff" * 50, b"not an onnx model at all\n"])
def test_garbage_files(tmp_path, content):
    path = tmp_path / "bad.onnx"
    path.write_bytes(content)
    assert_one_line_error(*run_cli("fission", path, "--json"))


def test_truncated_file(small_model, tmp_path):
    data = small_model.read_bytes()
    path = tmp_path / "trunc.onnx"
    path.write_bytes(data[: len(data) // 2])
    assert_one_line_error(*run_cli("fission", path))


def _symbolic_model(tmp_path):
    x = helper.make_tensor_value_info("x", 1, ["batch", 4])
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])],
        "g",
        [x],
        [helper.make_tensor_value_info("y", 1, ["batch", 4])],
    )
    path = tmp_path / "sym.onnx"
    onnx.save(onnx_model(graph), path)
    return path


def test_unpinned_symbolic_dims_are_refused_by_name(tmp_path):
    path = _symbolic_model(tmp_path)
    assert_one_line_error(*run_cli("fission", path), match="x[0]=batch")


def test_shape_pins_symbolic_dims(tmp_path):
    path = _symbolic_model(tmp_path)
    code, out, err = run_cli("fission", path, "--shape", "x=3x4", "--check", "--json")
    assert code == 0, err
    assert json.loads(out)["primitives"] == 1


@pytest.mark.parametrize("bad", ["x", "x=3xA", "=3", "x=-1x4"])
def test_bad_shape_syntax(tmp_path, bad):
    assert_one_line_error(*run_cli("fission", _symbolic_model(tmp_path), "--shape", bad))


def test_shape_for_unknown_input(tmp_path):
    assert_one_line_error(
        *run_cli("fission", _symbolic_model(tmp_path), "--shape", "z=3x4"), match="unknown inputs"
    )


def test_wrong_rank_pin(tmp_path):
    assert_one_line_error(*run_cli("fission", _symbolic_model(tmp_path), "--shape", "x=3"), match="rank")


def test_unknown_custom_op_names_node_op_and_opset(tmp_path):
    node = helper.make_node("FancyOp", ["x"], ["y"], name="fancy1", domain="com.example")
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("x", 1, [2])],
        [helper.make_tensor_value_info("y", 1, [2])],
    )
    model = onnx_model(graph, 17, [("com.example", 1)])
    path = tmp_path / "custom.onnx"
    onnx.save(model, path)
    code, out, err = run_cli("fission", path)
    assert_one_line_error(code, out, err, match="node 'fancy1' (FancyOp, opset 1)")


def test_opaque_ops_are_listed_and_strict_refuses_them(tmp_path):
    model, _ = one_node_model("Einsum", [rand(3, 3)], {"equation": "ii->i"}, opset=12)
    path = tmp_path / "diag.onnx"
    onnx.save(model, path)
    code, out, err = run_cli("fission", path, "--check", "--json")
    assert code == 0, err
    doc = json.loads(out)
    assert doc["opaque_ops"] == ["Einsum"] and doc["by_kind"]["opaque"] == 1
    assert_one_line_error(*run_cli("fission", path, "--strict"), match="--strict")


def test_dangling_input(tmp_path):
    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "ghost"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", 1, [2])],
        [helper.make_tensor_value_info("y", 1, [2])],
    )
    path = tmp_path / "dangling.onnx"
    onnx.save(onnx_model(graph), path)
    assert_one_line_error(*run_cli("fission", path))


def test_incompatible_shapes_name_the_node(tmp_path):
    model, _ = one_node_model("MatMul", [rand(2, 3), Const(rand(4, 5))], opset=13)
    model.graph.node[0].name = "mm"
    path = tmp_path / "mm.onnx"
    onnx.save(
        model,
        path,
    )
    code, out, err = run_cli("fission", path)
    assert_one_line_error(code, out, err)
    assert "mm" in err or "MatMul" in err


def test_usage_errors_are_one_line():
    assert_one_line_error(*run_cli())
    assert_one_line_error(*run_cli("fission"))
    assert_one_line_error(*run_cli("frobnicate"))


def test_zoo_list_json():
    code, out, err = run_cli("zoo", "--list", "--json")
    assert code == 0, err
    assert set(json.loads(out)["models"]) >= {
        "candy",
        "segformer-b0",
        "yolox-nano",
        "yolov4",
        "efficientvit-b1",
        "bert-base",
        "vit-b16",
        "resnet50",
    }


def test_unknown_zoo_model(tmp_path):
    assert_one_line_error(*run_cli("zoo", "nosuchnet", "--dir", tmp_path), match="unknown zoo model")


def test_int_input_check_stays_in_gather_range(tmp_path):
    """Random integer inputs that feed a Gather are drawn inside the table."""
    model, _ = one_node_model("Gather", [Const(rand(10, 4)), np.array([[1, 9]], dtype="int64")], {"axis": 0})
    path = tmp_path / "g.onnx"
    onnx.save(model, path)
    code, out, err = run_cli("fission", path, "--check", "--json")
    assert code == 0, err


def test_candidates_json(small_model):
    code, out, err = run_cli("candidates", small_model, "--json", "--max-size", "4")
    assert code == 0, err
    doc = json.loads(out)
    assert set(doc) == {"primitives", "partitions", "candidates", "unique_candidates", "pruned", "seconds"}
    # conv, broadcast(bias), add: {conv}, {bcast}, {add}, {bcast,add}, {conv,add}, {conv,bcast,add}
    assert doc["primitives"] == 3 and doc["partitions"] == 1 and doc["candidates"] == 6


def test_candidates_bad_max_size(small_model):
    assert_one_line_error(*run_cli("candidates", small_model, "--max-size", "0"), match="--max-size")
