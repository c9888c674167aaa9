"""ONNX import: shape pins (--shape, shapes=) fix symbolic dimensions and never contradict the model."""

import numpy as np
import onnx
import pytest
from helpers import onnx_model
from onnx import TensorProto, helper, numpy_helper

import korch
from korch import check, cli
from korch.errors import KorchError, ShapeError
from korch.plan import Plan

F = TensorProto.FLOAT


def _matmul(x_shape, path=None) -> onnx.ModelProto:
    """x (x_shape) @ w (16x32) -> y."""
    w = numpy_helper.from_array(np.ones((16, 32), "float32"), "w")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", F, x_shape)],
        [helper.make_tensor_value_info("y", F, None)],
        [w],
    )
    model = onnx_model(graph)
    if path is not None:
        onnx.save(model, path)
    return model


def _conv() -> onnx.ModelProto:
    """img (1x3x8x8) -> Conv with 4 filters of 3 channels."""
    w = numpy_helper.from_array(np.ones((4, 3, 3, 3), "float32"), "w")
    graph = helper.make_graph(
        [helper.make_node("Conv", ["img", "w"], ["y"])],
        "g",
        [helper.make_tensor_value_info("img", F, [1, 3, 8, 8])],
        [helper.make_tensor_value_info("y", F, None)],
        [w],
    )
    return onnx_model(graph)


@pytest.mark.parametrize(
    "model, pins, message",
    [
        (_matmul([4, 16]), {"x": (8, 16)}, "shape of x: dimension 0 is 4 in the model, got 8"),
        (_matmul([4, 16]), {"x": (4, 17)}, "shape of x: dimension 1 is 16 in the model, got 17"),
        (_matmul(["batch", 16]), {"x": (2, 17)}, "dimension 1 is 16 in the model, got 17"),
        (_conv(), {"img": (1, 4, 8, 8)}, "shape of img: dimension 1 is 3 in the model, got 4"),
        (_matmul([4, 16]), {"x": (4, 16, 1)}, "shape of x: rank 3, the model says 2"),
        (_matmul([4, 16]), {"nope": (4, 16)}, "unknown inputs ['nope']"),
        (_matmul(["batch", 16]), {"x": (-1, 16)}, "negative dimension"),
        (_matmul(["batch", 16]), {"x": "2x16"}, "wants a tuple of ints"),
    ],
)
def test_a_pin_that_contradicts_the_model_is_refused(model, pins, message):
    with pytest.raises(ShapeError) as e:
        korch.fission(model, shapes=pins)
    assert message in str(e.value)
    assert isinstance(e.value, KorchError)  # the CLI's exit 2


def test_pins_fix_symbolic_dims_and_may_repeat_fixed_ones():
    assert korch.fission(_matmul(["batch", 16]), shapes={"x": (8, 16)}).graph.types["x"].shape == (8, 16)
    assert korch.fission(_matmul([4, 16]), shapes={"x": (4, 16)}).graph.types["x"].shape == (4, 16)


def test_a_declared_zero_stays_pinnable():
    # some exporters wrote dim_value 0 for a size the user sets (korch has always let a pin replace it)
    assert korch.fission(_matmul([0, 16]), shapes={"x": (5, 16)}).graph.types["x"].shape == (5, 16)


def test_the_unpinned_message_names_both_spellings():
    with pytest.raises(ShapeError) as e:
        korch.fission(_matmul(["batch", 16]))
    message = str(e.value)
    assert "x[0]=batch" in message
    assert "--shape NAME=" in message and "shapes={'NAME': (1, 3, 224, 224)}" in message


def test_the_cli_refuses_a_contradicting_pin_with_exit_2(tmp_path, capsys):
    path = tmp_path / "m.onnx"
    _matmul([4, 16], path)
    assert cli.main(["fission", str(path), "--shape", "x=8x16"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "shape of x: dimension 0 is 4 in the model, got 8" in err


def test_a_non_model_says_what_is_accepted():
    with pytest.raises(KorchError, match="a file path, its bytes or an onnx.ModelProto"):
        korch.fission(42)


def test_a_scalar_input_survives_a_saved_plan(tmp_path):
    """Pinning shapes cleared a rank-0 input's shape and added no dims: the saved model then
    declared an input of unknown rank, which ONNX's checker refuses when the plan loads."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [])
    model = onnx_model(helper.make_graph([helper.make_node("Mul", ["x", "x"], ["y"])], "g", [x], [y]))
    assert korch.fission(model).model.graph.input[0].type.tensor_type.HasField("shape")
    options = dict(backends="onnxruntime", time_budget=2, min_time=0.002, progress=False)
    plan = korch.optimize(model, cache=tmp_path / "db.sqlite", **options)
    plan.save(tmp_path / "plan")
    loaded = Plan.load(tmp_path / "plan")
    feeds = {"x": np.array(-3.0, dtype="float32")}
    (want,) = check.onnxruntime_outputs(model, feeds).values()
    got = loaded.run(feeds)["y"]
    assert got.shape == () and got == want == 9.0
    assert loaded.verify() == 0.0
