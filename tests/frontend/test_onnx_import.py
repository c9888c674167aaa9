"""ONNX import: shape pins (--shape, shapes=) fix symbolic dimensions and never contradict the model;
value pins (--value, values=) make inputs constants; an If whose condition folds is its branch."""

import numpy as np
import onnx
import pytest
from helpers import check_model, onnx_model
from onnx import TensorProto, helper, numpy_helper

import korch
from korch.cli import commands as cli
from korch.errors import KorchError, ShapeError
from korch.ir import reference
from korch.measure import check
from korch.plan.plan import Plan

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


@pytest.mark.e2e
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


def _branching(x_shape, flag: bool) -> onnx.ModelProto:
    """(y, z) = If(cond, then: (relu(x * c), x + 1) with c a branch initializer, else: an inner If
    on not(cond) whose then-branch reads the outer graph's x: (sigmoid(-x), x - 1)); cond is the
    input `flag` or, without it, x's first dimension > 2 (folded from the pinned shape)."""
    out = [helper.make_tensor_value_info(n, F, None) for n in ("y", "z")]

    def branch(name, nodes, outs, inits=()):
        return helper.make_graph(
            nodes, name, [], [helper.make_tensor_value_info(o, F, None) for o in outs], inits
        )

    c = numpy_helper.from_array(np.array([0.5, -1.0, 2.0, 3.0], "float32"), "c")
    then = branch(
        "then",
        [
            helper.make_node("Mul", ["x", "c"], ["xc"]),
            helper.make_node("Relu", ["xc"], ["ty"]),
            helper.make_node("Add", ["x", "one"], ["tz"]),
        ],
        ["ty", "tz"],
        [c],
    )
    inner_then = branch(
        "inner_then",
        [helper.make_node("Sigmoid", ["neg"], ["iy"]), helper.make_node("Sub", ["x", "one"], ["iz"])],
        ["iy", "iz"],
    )
    inner_else = branch(
        "inner_else",
        [helper.make_node("Tanh", ["neg"], ["jy"]), helper.make_node("Identity", ["x"], ["jz"])],
        ["jy", "jz"],
    )
    otherwise = branch(
        "else",
        [
            helper.make_node("Neg", ["x"], ["neg"]),
            helper.make_node("Not", ["cond"], ["not_cond"]),
            helper.make_node(
                "If", ["not_cond"], ["ey", "ez"], then_branch=inner_then, else_branch=inner_else, name="inner"
            ),
        ],
        ["ey", "ez"],
    )
    nodes = [helper.make_node("Constant", [], ["one"], value=numpy_helper.from_array(np.float32(1.0)))]
    inputs = [helper.make_tensor_value_info("x", F, x_shape)]
    if flag:
        inputs.append(helper.make_tensor_value_info("flag", TensorProto.BOOL, [1]))
        nodes.append(helper.make_node("Identity", ["flag"], ["cond"]))
    else:
        nodes += [
            helper.make_node("Shape", ["x"], ["shape"], start=0, end=1),
            helper.make_node("Constant", [], ["two"], value=numpy_helper.from_array(np.array([2], "int64"))),
            helper.make_node("Greater", ["shape", "two"], ["cond"]),
        ]
    nodes.append(
        helper.make_node("If", ["cond"], ["y", "z"], then_branch=then, else_branch=otherwise, name="outer")
    )
    return onnx_model(helper.make_graph(nodes, "g", inputs, out))


@pytest.mark.parametrize("batch", [3, 1], ids=["then", "else"])
def test_an_if_whose_condition_folds_from_a_pinned_shape_is_its_branch(batch):
    x = np.random.default_rng(batch).standard_normal((batch, 4)).astype("float32")
    result = check_model(_branching([batch, 4], flag=False), {"x": x})  # (against ONNX Runtime)
    assert not result.opaque and {n.prim for n in result.graph.nodes}.isdisjoint({korch.Prim.OPAQUE})


@pytest.mark.e2e
@pytest.mark.parametrize("flag", [True, False])
def test_a_pinned_value_selects_the_branch_of_an_if_on_it(flag, tmp_path):
    """optimum's merged decoders: one If on a use_cache_branch input. The oracle is ONNX Runtime
    on the model as given, fed the flag; the plan takes x alone."""
    model = _branching(["batch", 4], flag=True)
    x = np.random.default_rng(1).standard_normal((2, 4)).astype("float32")
    want = check.onnxruntime_outputs(model, {"x": x, "flag": np.array([flag])})
    result = korch.fission(model, shapes={"x": (2, 4)}, values={"flag": flag})
    assert result.graph.inputs == ("x",) and [i.name for i in result.model.graph.input] == ["x"]
    got = reference.run(result.graph, {"x": x})
    for name in ("y", "z"):
        np.testing.assert_allclose(got[name], want[name], rtol=1e-6, atol=1e-7)
    options = dict(backends="onnxruntime,inductor", time_budget=2, min_time=0.002, progress=False)
    plan = korch.optimize(
        model, shapes={"x": (2, 4)}, values={"flag": [flag]}, cache=tmp_path / "db", **options
    )
    assert [n for n, _ in plan.inputs] == ["x"]
    np.testing.assert_allclose(plan(x=x)[0], want["y"], rtol=1e-6, atol=1e-7)


def test_an_if_on_a_value_known_at_run_time_is_refused_with_the_way_out(tmp_path, capsys):
    model = _branching([2, 4], flag=True)
    with pytest.raises(KorchError, match="condition 'cond' is known only at run time"):
        korch.fission(model)
    path = tmp_path / "m.onnx"
    onnx.save(model, path)
    assert cli.main(["fission", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "--value NAME=V" in err and "values={'NAME': V}" in err
    assert cli.main(["fission", str(path), "--value", "flag=true", "-q"]) == 0
    assert cli.main(["fission", str(path), "--value", "flag=maybe"]) == 2
    assert "--value wants NAME=true|false|NUMBER" in capsys.readouterr().err


@pytest.mark.parametrize(
    "shape, values, message",
    [
        ([2, 4], {"nope": 1}, "values name 'nope', which is not an input"),
        ([2, 4], {"flag": 2}, "value of 'flag': 2 is not a bool"),
        ([2, 4], {"x": [1.0, 2.0]}, "value of 'x': not a float32 array of shape [2, 4]"),
        (["batch", 4], {"x": 0.5}, "the value of 'x' needs its shape"),
    ],
)
def test_a_value_pin_that_does_not_fit_the_input_is_refused(shape, values, message):
    with pytest.raises(ShapeError) as e:
        korch.fission(_branching(shape, flag=True), values=values)
    assert message in str(e.value)


def _loop(stop: str, trips=None) -> onnx.ModelProto:
    """(acc, stacked) = Loop(trips or x's row count, True, zeros(3)) over a body that reads the
    outer graph's x at its iteration number: acc' = acc / 2 + x[i], scan output 2 acc'. The body's
    condition: passed through ("never"), i < 2 ("early": three iterations), or sum(acc') > 0
    ("data": known only at run time)."""
    vi = helper.make_tensor_value_info

    def const(name, value):
        return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(value))

    body_nodes = [
        helper.make_node("Gather", ["x", "i"], ["row"], axis=0),
        helper.make_node("Mul", ["acc", "half"], ["halved"]),
        helper.make_node("Add", ["halved", "row"], ["acc_out"]),
        const("two", np.float32(2.0)),
        helper.make_node("Mul", ["acc_out", "two"], ["scan"]),
    ]
    if stop == "never":
        body_nodes.append(helper.make_node("Identity", ["c_in"], ["c_out"]))
    elif stop == "early":
        body_nodes += [const("k", np.int64(2)), helper.make_node("Less", ["i", "k"], ["c_out"])]
    else:
        body_nodes += [
            helper.make_node("ReduceSum", ["acc_out"], ["total"], keepdims=0),
            const("zero", np.float32(0.0)),
            helper.make_node("Greater", ["total", "zero"], ["c_out"]),
        ]
    body = helper.make_graph(
        body_nodes,
        "body",
        [vi("i", TensorProto.INT64, []), vi("c_in", TensorProto.BOOL, []), vi("acc", F, [3])],
        [vi("c_out", TensorProto.BOOL, []), vi("acc_out", F, [3]), vi("scan", F, [3])],
        [numpy_helper.from_array(np.float32(0.5), "half")],
    )
    if trips is None:  # the trip count folds from the pinned shape
        nodes = [
            helper.make_node("Shape", ["x"], ["rows1"], start=0, end=1),
            helper.make_node("Squeeze", ["rows1"], ["m"]),
        ]
    else:
        nodes = [const("m", np.int64(trips))]
    nodes += [
        const("go", np.array(True)),
        const("acc0", np.zeros(3, "float32")),
        helper.make_node("Loop", ["m", "go", "acc0"], ["acc_final", "stacked"], body=body, name="loop"),
    ]
    outputs = [vi("acc_final", F, None), vi("stacked", F, None)]
    return onnx_model(helper.make_graph(nodes, "g", [vi("x", F, [5, 3])], outputs))


@pytest.mark.parametrize("stop, trips, iterations", [("never", None, 5), ("never", 3, 3), ("early", None, 3)])
def test_a_loop_that_korch_can_count_is_unrolled(stop, trips, iterations):
    x = np.random.default_rng(3).standard_normal((5, 3)).astype("float32")
    result = check_model(_loop(stop, trips), {"x": x})  # (against ONNX Runtime)
    assert result.graph.types[result.graph.outputs[1]].shape == (iterations, 3)


def test_a_loop_whose_condition_depends_on_data_is_refused():
    with pytest.raises(KorchError, match="condition is known only at run time after iteration 0"):
        korch.fission(_loop("data"))


def _nonzero_then_gather(constant_mask: np.ndarray | None) -> onnx.ModelProto:
    """y = x[nonzero(mask > 0)]: the shape of y is the count of positive elements in mask (as
    torchvision's detectors filter boxes), mask an input or, given, a constant."""
    vi = helper.make_tensor_value_info
    nodes = [
        helper.make_node("Greater", ["mask", "zero"], ["positive"]),
        helper.make_node("NonZero", ["positive"], ["where"]),
        helper.make_node("Squeeze", ["where", "axis0"], ["picked"]),
        helper.make_node("Gather", ["x", "picked"], ["y"]),
    ]
    inits = [numpy_helper.from_array(np.float32(0), "zero"), numpy_helper.from_array(np.array([0]), "axis0")]
    inputs = [vi("x", F, [6])]
    if constant_mask is None:
        inputs.append(vi("mask", F, [6]))
    else:
        inits.append(numpy_helper.from_array(constant_mask, "mask"))
    return onnx_model(helper.make_graph(nodes, "g", inputs, [vi("y", F, None)], inits))


def test_an_operator_whose_output_shape_depends_on_values_is_refused_unless_they_are_constants(
    tmp_path, capsys
):
    """NonZero on an input once ran on a probe of ones, and its output kept the probe's shape:
    torchvision's SSD then failed in the reference with numpy's 'cannot reshape array'."""
    model = _nonzero_then_gather(None)
    with pytest.raises(KorchError, match="NonZero.*depends on its inputs' values.*cut the model before it"):
        korch.fission(model)
    path = tmp_path / "m.onnx"
    onnx.save(model, path)
    assert cli.main(["fission", str(path)]) == 2
    assert "\n" not in capsys.readouterr().err.strip()
    mask = np.array([1, -1, 2, 0, 3, -4], np.float32)  # a constant mask folds, as numpy says
    x = np.arange(6, dtype=np.float32) * 10
    result = korch.fission(_nonzero_then_gather(mask))
    np.testing.assert_array_equal(reference.run(result.graph, {"x": x})["y"], x[np.nonzero(mask > 0)])


def _scan(in_axis: int, backwards: int, out_axis: int) -> onnx.ModelProto:
    """(s, ys) = Scan(zeros(3), x) over x's axis `in_axis` (from its end if backwards): s' = s / 2
    + x_t, y_t = 2 s', the ys stacked along `out_axis` in the same direction."""
    vi = helper.make_tensor_value_info
    body = helper.make_graph(
        [
            helper.make_node("Mul", ["s", "half"], ["halved"]),
            helper.make_node("Add", ["halved", "xt"], ["s_out"]),
            helper.make_node("Add", ["s_out", "s_out"], ["y"]),
        ],
        "body",
        [vi("s", F, [3]), vi("xt", F, [3])],
        [vi("s_out", F, [3]), vi("y", F, [3])],
        [numpy_helper.from_array(np.float32(0.5), "half")],
    )
    scan = helper.make_node(
        "Scan",
        ["s0", "x"],
        ["s_final", "ys"],
        body=body,
        num_scan_inputs=1,
        scan_input_axes=[in_axis],
        scan_input_directions=[backwards],
        scan_output_axes=[out_axis],
        scan_output_directions=[backwards],
    )
    s0 = numpy_helper.from_array(np.zeros(3, "float32"), "s0")
    x = vi("x", F, [5, 3] if in_axis == 0 else [3, 5])
    return onnx_model(helper.make_graph([scan], "g", [x], [vi("s_final", F, None), vi("ys", F, None)], [s0]))


@pytest.mark.parametrize("in_axis, backwards, out_axis", [(0, 0, 0), (1, 1, -1), (0, 1, 1)])
def test_a_scan_is_unrolled_over_its_pinned_length(in_axis, backwards, out_axis):
    x = np.random.default_rng(4).standard_normal((5, 3) if in_axis == 0 else (3, 5)).astype("float32")
    check_model(_scan(in_axis, backwards, out_axis), {"x": x}, tol=1e-6)  # (against ONNX Runtime)


def test_a_value_info_that_contradicts_a_constant_is_not_reported_but_one_of_an_operator_is():
    """The model builder declares its [1] constants as scalars in value_info: every file warned.
    A Constant's type is its tensor's; an operator's output is still cross-checked."""
    one = helper.make_node("Constant", [], ["one"], value=numpy_helper.from_array(np.ones(1, np.float32)))
    nodes = [one, helper.make_node("Add", ["x", "one"], ["s"]), helper.make_node("Relu", ["s"], ["y"])]
    vi = helper.make_tensor_value_info
    graph = helper.make_graph(
        nodes, "g", [vi("x", TensorProto.FLOAT, [2, 3])], [vi("y", TensorProto.FLOAT, [2, 3])]
    )
    graph.value_info.extend([vi("one", TensorProto.FLOAT, [])])
    model = onnx_model(graph)
    assert check_model(model, {"x": np.arange(6, dtype=np.float32).reshape(2, 3)}).warnings == []
    graph.value_info.extend([vi("s", TensorProto.FLOAT, [3, 2])])
    (warning,) = korch.fission(onnx_model(graph)).warnings
    assert "'s' lowered to f32[2,3], ONNX shape inference says f32[3,2]" in warning, warning
