"""Primitive patterns written back as fused ONNX operators: the operator appears in the exported
kernel, and ONNX Runtime running it agrees with the reference executor on the primitives."""

import numpy as np
import onnx
import pytest
import torch
from helpers import Const, check_model, one_node_model, onnx_model, rand
from onnx import helper, numpy_helper

import korch
from korch import reference
from korch.backends.onnx_patterns import fuse
from korch.backends.onnxrt import OnnxRuntimeBackend, to_onnx
from korch.candidates import make_candidate
from korch.ir import GraphBuilder
from korch.kernel import kernel_spec
from korch.prims import Prim, TensorType
from korch.profiler import check_kernel

# (op, inputs, attrs, opset) -> the ONNX operator the primitives are written back as
CASES = {
    "relu": (("Relu", [rand(2, 3, 5, low=-1, high=1)], {}, 14), "Relu"),
    "clip": (
        ("Clip", [rand(2, 30, low=-2, high=2), Const(np.float32(-0.5)), Const(np.float32(0.7))], {}, 13),
        "Clip",
    ),
    "hard_sigmoid": (
        ("HardSigmoid", [rand(4, 30, low=-6, high=6)], {"alpha": 0.3, "beta": 0.4}, 6),
        "HardSigmoid",
    ),
    "hard_swish": (("HardSwish", [rand(1, 4, 6, 6, low=-5, high=5)], {}, 14), "HardSwish"),
    "leaky_relu": (("LeakyRelu", [rand(3, 20, low=-1, high=1)], {"alpha": 0.2}, 16), "LeakyRelu"),
    "max_pool": (
        (
            "MaxPool",
            [rand(1, 3, 9, 9)],
            {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]},
            13,
        ),
        "MaxPool",
    ),
    "max_pool_ceil_dilated": (
        (
            "MaxPool",
            [rand(1, 2, 10, 11)],
            {"kernel_shape": [3, 2], "strides": [2, 2], "dilations": [2, 1], "ceil_mode": 1},
            13,
        ),
        "MaxPool",
    ),
    "max_pool_1d": (("MaxPool", [rand(2, 3, 17)], {"kernel_shape": [5], "pads": [2, 2]}, 13), "MaxPool"),
    "avg_pool_counting_pads": (
        (
            "AveragePool",
            [rand(1, 2, 8, 8)],
            {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1], "count_include_pad": 1},
            13,
        ),
        "AveragePool",
    ),
    "avg_pool_no_pads": (
        ("AveragePool", [rand(1, 2, 8, 8)], {"kernel_shape": [2, 2], "strides": [2, 2]}, 13),
        "AveragePool",
    ),
    "nearest_resize": (
        (
            "Resize",
            [rand(1, 2, 3, 4), None, Const(np.array([1, 1, 2, 3], "float32"))],
            {"mode": "nearest", "nearest_mode": "floor", "coordinate_transformation_mode": "asymmetric"},
            13,
        ),
        "Resize",
    ),
}


def _export(model, feeds):
    graph = korch.fission(model).graph
    spec = kernel_spec(graph, make_candidate(graph, range(len(graph.nodes))))
    env = {**graph.constants, **feeds}
    return spec, [env[v] for v in spec.inputs]


def _run_and_check(spec, inputs):
    want = reference.run(spec.graph, dict(zip(spec.graph.inputs, inputs)))
    assert OnnxRuntimeBackend().supports(spec, "cpu") is None
    compiled = OnnxRuntimeBackend().compile(spec, "cpu")
    assert (
        check_kernel(compiled.fn(*[torch.as_tensor(np.array(x)) for x in inputs]), want, spec.graph) is None
    )


@pytest.mark.parametrize("case", list(CASES))
def test_pattern_is_written_as_its_onnx_operator(case):
    (op, ins, attrs, opset), fused_op = CASES[case]
    model, feeds = one_node_model(op, ins, attrs, opset)
    spec, inputs = _export(model, feeds)
    written = [n.op_type for n in to_onnx(spec.graph).graph.node if n.op_type != "Identity"]
    assert written == [fused_op], written
    _run_and_check(spec, inputs)


def _hard_sigmoid_graph(extra_output: bool):
    """min(max(x * 0.2 + 0.5, 0), 1), optionally also returning the max."""
    b = GraphBuilder()
    x = b.input("x", TensorType((4, 8), "float32"))
    scaled = b.emit(Prim.MUL, [x, b.const(0.2)])[0]
    shifted = b.emit(Prim.ADD, [scaled, b.const(0.5)])[0]
    low = b.emit(Prim.MAX, [shifted, b.const(0.0)])[0]
    y = b.emit(Prim.MIN, [low, b.const(1.0)])[0]
    outs = [y, low] if extra_output else [y]
    return b.build(outs, [f"o{i}" for i in range(len(outs))])


@pytest.mark.parametrize("extra_output", [False, True])
def test_a_pattern_never_swallows_a_value_the_kernel_returns(extra_output):
    graph = _hard_sigmoid_graph(extra_output)
    written = [n.op_type for n in to_onnx(graph).graph.node if n.op_type != "Identity"]
    # the max is a kernel output: the min stays a Min, the max becomes a Relu of the shifted value
    assert written == (["Mul", "Add", "Relu", "Min"] if extra_output else ["HardSigmoid"])
    spec = kernel_spec(graph, make_candidate(graph, range(len(graph.nodes))))
    _run_and_check(spec, [rand(4, 8, low=-6, high=6)])


def test_a_window_outside_a_pool_is_refused():
    (op, ins, attrs, opset), _ = CASES["max_pool"]
    model, feeds = one_node_model(op, ins, attrs, opset)
    graph = korch.fission(model).graph
    windows = [i for i, n in enumerate(graph.nodes) if n.prim is Prim.WINDOW]
    spec = kernel_spec(graph, make_candidate(graph, [i for i in range(len(graph.nodes)) if i <= windows[0]]))
    assert "window" in OnnxRuntimeBackend().supports(spec, "cpu")


def test_a_max_pool_cut_before_its_reshape_is_refused_not_misread():
    (op, ins, attrs, opset), _ = CASES["max_pool"]
    graph = korch.fission(one_node_model(op, ins, attrs, opset)[0]).graph
    assert graph.nodes[-1].prim is Prim.RESHAPE
    spec = kernel_spec(graph, make_candidate(graph, range(len(graph.nodes) - 1)))
    assert not fuse(spec.graph)
    assert "window" in OnnxRuntimeBackend().supports(spec, "cpu")


@pytest.mark.parametrize(
    "scales",
    [[1, 1, 1.5, 2], [1, 1, 0.5, 1]],  # not an integer upsampling on every axis: gathers stay
)
def test_other_nearest_resizes_stay_gathers_and_agree(scales):
    model, feeds = one_node_model(
        "Resize",
        [rand(1, 2, 4, 4), None, Const(np.array(scales, "float32"))],
        {"mode": "nearest", "nearest_mode": "floor", "coordinate_transformation_mode": "asymmetric"},
        13,
    )
    spec, inputs = _export(model, feeds)
    written = [n.op_type for n in to_onnx(spec.graph).graph.node]
    assert "Gather" in written
    _run_and_check(spec, inputs)


_SCALES = numpy_helper.from_array(np.array([1, 1, 2, 2], "float32"), "scales")


def _nearest_2x(x, y):
    return helper.make_node(
        "Resize",
        [x, "", "scales"],
        [y],
        mode="nearest",
        nearest_mode="floor",
        coordinate_transformation_mode="asymmetric",
    )


def _model(nodes, initializers, x_shape, opset):
    """One float input x, one output y."""
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, x_shape)],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)],
        initializers,
    )
    return onnx_model(graph, opset)


def test_fused_export_agrees_on_a_model_of_many_patterns():
    """Conv -> HardSwish -> MaxPool -> Clip -> nearest 2x -> LeakyRelu, one kernel."""

    w = numpy_helper.from_array(rand(4, 3, 3, 3, seed=1), "w")
    lo, hi = numpy_helper.from_array(np.float32(-0.3), "lo"), numpy_helper.from_array(np.float32(0.4), "hi")
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("HardSwish", ["c"], ["h"]),
        helper.make_node("MaxPool", ["h"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Clip", ["p", "lo", "hi"], ["k"]),
        _nearest_2x("k", "y2"),
        helper.make_node("LeakyRelu", ["y2"], ["y"], alpha=0.1),
    ]
    model = _model(nodes, [w, lo, hi, _SCALES], [1, 3, 8, 8], 14)
    feeds = {"x": rand(1, 3, 8, 8, low=-2, high=2)}
    check_model(model, feeds)
    spec, inputs = _export(model, feeds)
    written = [n.op_type for n in to_onnx(spec.graph).graph.node if n.op_type != "Identity"]
    assert written == ["Conv", "HardSwish", "MaxPool", "Clip", "Resize", "LeakyRelu"]
    _run_and_check(spec, inputs)


def test_optimize_profiles_upsampling_kernels_and_the_plan_reloads(tmp_path):
    """A gather's index array (24 elements here) is part of its kernel: it travels to the
    profiling workers and into the saved plan, and ONNX Runtime runs the kernel as a Resize."""

    from korch.pipeline import OptimizeOptions, optimize

    w = numpy_helper.from_array(rand(2, 2, 1, 1, seed=1), "w")
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"]),
        helper.make_node("Relu", ["c"], ["r"]),
        _nearest_2x("r", "y"),
    ]
    path = tmp_path / "m.onnx"
    path.write_bytes(_model(nodes, [w, _SCALES], [1, 2, 12, 12], 13).SerializeToString())
    options = OptimizeOptions(
        backends=("onnxruntime",), min_time=0.002, progress=False, cache=tmp_path / "p.sqlite", seeds=False
    )
    plan = optimize(path, options=options)
    assert plan.meta["profiling"]["failed"] == 0, plan.meta["profiling"]
    assert any(
        len(k.spec.graph.constants) and k.spec.graph.nodes[-1].prim is Prim.GATHER for k in plan.kernels
    )
    assert plan.verify() <= 1e-4
    plan.save(tmp_path / "plan")
    again = korch.load(tmp_path / "plan")
    x = rand(1, 2, 12, 12, seed=3)
    np.testing.assert_array_equal(again(x)[0], plan(x)[0])
