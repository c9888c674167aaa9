"""The `korch` command line: JSON output, exit codes, one-line errors on bad input."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from helpers import Const, one_node_model, onnx_model, rand
from onnx import helper

from korch.cli import commands as cli


def run_cli(*args):
    proc = subprocess.run(
        [sys.executable, "-m", "korch.cli.commands", *map(str, args)], capture_output=True, text=True
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
    assert_one_line_error(*run_cli("fission", tmp_path), match="a directory, not an ONNX file")


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


@pytest.mark.e2e
@pytest.mark.parametrize("bad", ["x", "x=3xA", "=3", "x=-1x4"])
def test_bad_shape_syntax(tmp_path, bad):
    assert_one_line_error(*run_cli("fission", _symbolic_model(tmp_path), "--shape", bad))


def test_one_input_pinned_twice_differently_is_refused(tmp_path):
    path = _symbolic_model(tmp_path)
    err = run_cli("fission", path, "--shape", "x=3x4", "--shape", "x=5x4")
    assert_one_line_error(*err, match="--shape x given twice: 3x4 and 5x4")
    code, _, _ = run_cli("fission", path, "--shape", "x=3x4", "--shape", "x=3x4")
    assert code == 0


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


def test_backends_that_cannot_run_some_primitive_are_refused_before_profiling(small_model, tmp_path):
    """The vendor backend runs linear primitives (with a bias and an activation epilogue) only: an
    Exp after the convolution, an epilogue it has no fused call for, has no kernel, whatever the
    budget (it used to profile, then say "every backend failed on its producer")."""
    model = onnx.load(small_model)
    exp = helper.make_node("Exp", [model.graph.output[0].name], ["exp"])
    model.graph.node.append(exp)
    model.graph.output[0].name = "exp"
    path = tmp_path / "conv_exp.onnx"
    onnx.save(model, path)
    code, out, err = run_cli(
        "optimize",
        path,
        "-o",
        tmp_path / "plan",
        "--backends",
        "vendor",
        "--cache",
        tmp_path / "c.sqlite",
        "-q",
    )
    assert_one_line_error(
        code, out, err, match="no backend given can run 1 primitive(s), the first exp of Exp"
    )
    assert "vendor: not a single linear primitive" in err
    assert not (tmp_path / "plan").exists()


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


def run_main(argv, capsys):
    """cli.main in this process (no torch import per call): exit code, stdout, stderr."""
    code = cli.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def identity_plan(tmp_path):
    """A plan with no kernels (its output is its input): `korch run` without optimizing first."""
    from korch.ir.prims import TensorType
    from korch.plan.plan import Plan

    path = tmp_path / "plan"
    Plan([("x", TensorType((3, 16), "float32"))], [("x", "y")], [], {}).save(path)
    return path


@pytest.mark.parametrize("where", ["proc", "under-a-file"])
def test_optimize_refuses_an_unwritable_output_before_any_work(where, small_model, tmp_path, capsys):
    if where == "proc":
        if not Path("/proc/self").is_dir():
            pytest.skip("no /proc here")
        target = Path("/proc/korch-plan")
    else:
        (tmp_path / "a-file").write_text("")
        target = tmp_path / "a-file" / "sub" / "plan"
    cache = tmp_path / "p.sqlite"
    code, out, err = run_main(["optimize", small_model, "-o", target, "--cache", cache], capsys)
    assert_one_line_error(code, out, err, match=f"cannot write {target}")
    assert not cache.exists()  # refused before profiling began


def test_the_output_check_leaves_nothing_behind(tmp_path, capsys):
    """The probe creates no parents and no files: here the model is refused after it."""
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"not a model")
    argv = ["optimize", bad, "-o", tmp_path / "new" / "plan", "--cache", tmp_path / "p.sqlite"]
    assert_one_line_error(*run_main(argv, capsys), match="not a valid ONNX model")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.onnx"]


def test_run_reports_the_file_numpy_really_wrote(identity_plan, tmp_path, capsys):
    code, out, err = run_main(["run", identity_plan, "--output", tmp_path / "result3", "--json"], capsys)
    assert code == 0, err
    written = tmp_path / "result3.npz"
    assert json.loads(out)["written"] == str(written) and written.is_file()
    code, out, err = run_main(["run", identity_plan, "--output", tmp_path / "out.npz"], capsys)
    assert code == 0, err
    assert f"wrote {tmp_path / 'out.npz'}" in out.splitlines()
    assert np.load(tmp_path / "out.npz")["y"].shape == (3, 16)


def test_run_refuses_a_directory_as_output(identity_plan, tmp_path, capsys):
    folder = tmp_path / "outputs"
    folder.mkdir()
    code, out, err = run_main(["run", identity_plan, "--output", folder], capsys)
    assert_one_line_error(code, out, err, match="is a directory")
    assert not (tmp_path / "outputs.npz").exists()


@pytest.mark.parametrize("argv", [["--verbose", "fission"], ["fission", "--json", "--verbose"]])
def test_verbose_goes_before_or_after_the_command(argv, small_model, capsys):
    args = cli.build_parser().parse_args([*argv, str(small_model)])
    assert args.verbose and args.command == "fission"
    assert run_main([*argv, small_model], capsys)[0] == 0


def test_verbose_is_off_by_default(small_model):
    assert cli.build_parser().parse_args(["fission", str(small_model), "--json"]).verbose is False


def test_an_onnx_file_is_not_taken_for_a_pickle(identity_plan, small_model, capsys):
    code, out, err = run_main(["run", identity_plan, "--inputs", small_model], capsys)
    assert_one_line_error(code, out, err, match="not an .npz of arrays")
    assert "pickle" not in err


def test_an_object_array_input_is_named_as_such(identity_plan, tmp_path, capsys):
    np.savez(tmp_path / "objects.npz", x=np.array([{"a": 1}], dtype=object))
    code, out, err = run_main(["run", identity_plan, "--inputs", tmp_path / "objects.npz"], capsys)
    assert_one_line_error(code, out, err, match="holds Python objects")
    assert "allow_pickle" not in err


def _boom(*args, **kwargs):
    raise RuntimeError("boom\nsecond line")


@pytest.mark.parametrize(
    "case", ["bad-input", "usage", "unexpected", "bench-no-peers", "explain-missing", "run-inputs"]
)
def test_json_errors_are_one_object_on_stdout(
    case, small_model, identity_plan, tmp_path, monkeypatch, capsys
):
    import korch

    if case == "unexpected":
        monkeypatch.setattr(korch, "fission", _boom)
    argv = {
        "bad-input": ["optimize", tmp_path / "nope.onnx", "-o", tmp_path / "plan", "--cache", tmp_path / "c"],
        "usage": ["candidates", small_model, "--max-size", "0"],
        "unexpected": ["fission", small_model],
        "bench-no-peers": ["bench", identity_plan, "--vs", ""],
        "explain-missing": ["explain", tmp_path / "nothere"],
        "run-inputs": ["run", identity_plan, "--inputs", small_model],
    }[case]
    code, out, err = run_main([*argv, "--json"], capsys)
    assert_one_line_error(code, out, err)
    assert json.loads(out) == {"error": err.strip().removeprefix("korch: error: ")}
    assert len(out.splitlines()) == 1
    code, out, err = run_main(argv, capsys)  # without --json, stdout stays empty
    assert_one_line_error(code, out, err)
    assert out == ""


def test_an_interrupted_command_owes_json_too(small_model, monkeypatch, capsys):
    import korch

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(korch, "fission", interrupted)
    code, out, err = run_main(["fission", small_model, "--json"], capsys)
    assert (code, json.loads(out), err.strip()) == (130, {"error": "interrupted"}, "korch: interrupted")


def test_json_usage_error_in_a_real_process():
    code, out, err = run_cli("zoo", "--frobnicate", "--json")
    assert_one_line_error(code, out, err, match="unrecognized arguments")
    assert "unrecognized arguments" in json.loads(out)["error"]


@pytest.mark.parametrize("vs", ["", " , "])
def test_bench_needs_a_peer(vs, identity_plan, capsys):
    code, out, err = run_main(["bench", identity_plan, "--vs", vs, "--rounds", "1"], capsys)
    assert_one_line_error(code, out, err, match="--vs names no peer")


@pytest.mark.e2e
def test_float16_models_are_checked_at_float16_precision(tmp_path):
    """float16 carries about three decimal digits: fission --check and verify accept 1e-2 there
    (a float16 softmax differs from ONNX Runtime's by ~5e-4, against float32's 1e-4), while
    --tolerance still overrides it. The oracle is ONNX Runtime on the source model."""
    from onnx import TensorProto

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT16, [4, 32])
    z = helper.make_tensor_value_info("z", TensorProto.FLOAT16, [4, 32])
    nodes = [helper.make_node("Softmax", ["x"], ["y"], axis=-1), helper.make_node("Tanh", ["y"], ["z"])]
    graph = helper.make_graph(nodes, "f16", [x], [z])
    path = tmp_path / "f16.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    code, out, err = run_cli("fission", path, "--check", "--json")
    assert code == 0, err
    assert 1e-4 < json.loads(out)["max_rel_err"] <= 1e-2  # float32's tolerance would fail it
    assert "tolerance 0.01" in err
    plan = tmp_path / "plan"
    code, out, err = run_cli(
        "optimize",
        path,
        "-o",
        plan,
        "--backends",
        "inductor",  # (ONNX Runtime would write the softmax back as one Softmax: no error at all)
        "--cache",
        tmp_path / "c.sqlite",
        "--time-budget",
        "5",
        "--no-seeds",  # primitives, not the source model (which would match ONNX Runtime exactly)
        "--quiet",
    )
    assert code == 0, err
    code, out, err = run_cli("verify", plan, "--json")
    assert code == 0 and json.loads(out)["ok"] is True, (out, err)
    assert json.loads(out)["max_rel_err"] > 1e-4
    code, out, err = run_cli("verify", plan, "--json", "--tolerance", "1e-9")
    assert code == 1 and json.loads(out)["ok"] is False
