"""Primitive patterns written back as fused ONNX operators: the operator appears in the exported
kernel, and ONNX Runtime running it agrees with the reference executor on the primitives."""

import numpy as np
import onnx
import pytest
import torch
from helpers import Const, check_model, one_node_model, onnx_model, rand
from onnx import helper, numpy_helper

import korch
from korch.backends.onnx_patterns import fuse
from korch.backends.onnxrt import OnnxRuntimeBackend, to_onnx
from korch.ir import reference
from korch.ir.graph import GraphBuilder
from korch.ir.prims import Prim, TensorType
from korch.profile.jobs import check_kernel
from korch.search.candidates import make_candidate
from korch.search.kernel import kernel_spec

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
    # (shapes large enough that the broadcasts of weights stay broadcasts, as in real models, and
    # that the resize does more than MATMUL_RESIZE_FLOPS an output element as matmuls)
    "linear_resize": (
        (
            "Resize",
            [rand(1, 2, 40, 48), None, Const(np.array([1, 1, 2, 1.5], "float32"))],
            {"mode": "linear"},
            13,
        ),
        "Resize",
    ),
    "linear_resize_align_corners": (
        (
            "Resize",
            [rand(1, 3, 40, 50), None, None, Const(np.array([1, 3, 70, 90], "int64"))],
            {"mode": "linear", "coordinate_transformation_mode": "align_corners"},
            13,
        ),
        "Resize",
    ),
    "linear_resize_one_axis_asymmetric": (
        (
            "Resize",
            [rand(2, 2, 4, 40), None, Const(np.array([1, 1, 1, 2], "float32"))],
            {"mode": "linear", "coordinate_transformation_mode": "asymmetric"},
            13,
        ),
        "Resize",
    ),
    "linear_resize_3d": (
        (
            "Resize",
            [rand(1, 2, 3, 4, 4), None, Const(np.array([1, 1, 2, 2, 2], "float32"))],
            {"mode": "linear"},
            13,
        ),
        "Resize",
    ),
    "softmax": (("Softmax", [rand(3, 4, 10)], {"axis": 1}, 13), "Softmax"),
    "layer_norm": (
        ("LayerNormalization", [rand(2, 5, 16), Const(rand(16, seed=1)), Const(rand(16, seed=2))], {}, 17),
        "LayerNormalization",
    ),
    "layer_norm_two_axes_no_bias": (
        (
            "LayerNormalization",
            [rand(2, 5, 4, 8), Const(rand(4, 8, seed=1))],
            {"axis": 2, "epsilon": 1e-3},
            17,
        ),
        "LayerNormalization",
    ),
    "instance_norm": (
        ("InstanceNormalization", [rand(2, 3, 5, 6), Const(rand(3, seed=1)), Const(rand(3, seed=2))], {}, 6),
        "InstanceNormalization",
    ),
}


def _export(model, feeds):
    """The whole primitive graph as one kernel, its inputs, and the weights among them (the
    model's constants), as the profiler hands them to a backend that bakes weights in."""
    graph = korch.fission(model).graph
    spec = kernel_spec(graph, make_candidate(graph, range(len(graph.nodes))))
    env = {**graph.constants, **feeds}
    return spec, [env[v] for v in spec.inputs], _known_weights(graph, spec)


def _known_weights(graph, spec) -> dict:
    """The kernel's inputs that are the graph's constants, by the kernel's input names."""
    return {n: graph.constants[v] for n, v in zip(spec.graph.inputs, spec.inputs) if v in graph.constants}


def _written(spec, weights=None) -> list[str]:
    return [n.op_type for n in to_onnx(spec.graph, weights).graph.node if n.op_type != "Identity"]


def _run_and_check(spec, inputs, weights=None):
    want = reference.run(spec.graph, dict(zip(spec.graph.inputs, inputs)))
    assert OnnxRuntimeBackend().supports(spec, "cpu") is None
    compiled = OnnxRuntimeBackend().compile(spec, "cpu", weights)
    fed = [torch.as_tensor(np.array(x)) for x in inputs]
    assert check_kernel(compiled.fn(*fed), want, spec.graph) is None


@pytest.mark.parametrize("case", list(CASES))
def test_pattern_is_written_as_its_onnx_operator(case):
    (op, ins, attrs, opset), fused_op = CASES[case]
    model, feeds = one_node_model(op, ins, attrs, opset)
    spec, inputs, weights = _export(model, feeds)
    written = _written(spec, weights)
    assert written == [fused_op], written
    _run_and_check(spec, inputs, weights)


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
    spec, inputs, weights = _export(model, feeds)
    assert "Gather" in _written(spec, weights)
    _run_and_check(spec, inputs, weights)


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
    spec, inputs, weights = _export(model, feeds)
    assert _written(spec, weights) == ["Conv", "HardSwish", "MaxPool", "Clip", "Resize", "LeakyRelu"]
    _run_and_check(spec, inputs, weights)


@pytest.mark.e2e
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
    assert plan.meta.profiling["failed"] == 0, plan.meta.profiling
    assert any(
        len(k.spec.graph.constants) and k.spec.graph.nodes[-1].prim is Prim.GATHER for k in plan.kernels
    )
    assert plan.verify() <= 1e-4
    plan.save(tmp_path / "plan")
    again = korch.load(tmp_path / "plan")
    x = rand(1, 2, 12, 12, seed=3)
    np.testing.assert_array_equal(again(x)[0], plan(x)[0])


def _exported(model, feeds):
    check_model(model, feeds)  # the fission itself agrees with ONNX Runtime
    spec, inputs, weights = _export(model, feeds)
    _run_and_check(spec, inputs, weights)
    return _written(spec, weights)


@pytest.mark.parametrize(
    "shape, scales_or_sizes, mode, written",
    [
        ((1, 2, 5, 6), [1, 1, 2, 1.5], "half_pixel", ["MatMul", "MatMul"]),
        ((1, 3, 4, 5), [1, 3, 7, 9], "align_corners", ["MatMul", "MatMul"]),
        ((2, 2, 4, 6), [1, 1, 1, 2], "asymmetric", ["MatMul"]),
        ((1, 256, 8, 8), [1, 256, 64, 64], "half_pixel", ["MatMul", "MatMul"]),  # Segformer's decoder
        ((1, 2, 3, 4, 4), [1, 1, 2, 2, 2], "half_pixel", ["Resize"]),  # along an axis no matmul takes
        ((3, 5, 6), [1, 2, 3], "half_pixel", ["MatMul", "MatMul"]),  # a rank ONNX Runtime's Resize refuses
    ],
)
def test_a_small_linear_resize_is_written_as_matmuls(shape, scales_or_sizes, mode, written):
    """Along the last two axes, a matmul by the interpolation matrix, where that is little work."""
    sizes = all(float(v).is_integer() and v > 2 for v in scales_or_sizes[1:])
    given = Const(np.array(scales_or_sizes, "int64" if sizes else "float32"))
    ins = [rand(*shape), None, None, given] if sizes else [rand(*shape), None, given]
    attrs = {"mode": "linear", "coordinate_transformation_mode": mode}
    model, feeds = one_node_model("Resize", ins, attrs, 13)
    assert _exported(model, feeds) == written


def test_a_linear_resize_is_written_back_only_when_its_taps_are_resizes():
    # scale 1.5 from 51 rows gives 76 rows, which Resize to 76 rows (scale 1.49) does not sample
    # alike: not a Resize, a matmul by the interpolation matrix
    scales = Const(np.array([1, 1, 1.5, 1], "float32"))
    model, feeds = one_node_model("Resize", [rand(1, 2, 51, 4), None, scales], {"mode": "linear"}, 13)
    assert _exported(model, feeds) == ["MatMul"]
    # the weights unknown (a kernel given them as inputs only): the gathers stay too
    (op, ins, attrs, opset), _ = CASES["linear_resize"]
    spec, inputs, weights = _export(*one_node_model(op, ins, attrs, opset))
    assert "Resize" in _written(spec, weights) and "Resize" not in _written(spec, None)
    _run_and_check(spec, inputs, None)


def _softmax_model(max_axis: int = 1, exp_read_elsewhere: bool = False):
    """exp(x - max(x)) / sum(exp(x - max(x))) over axis 1 of x [3, 20], written out."""
    nodes = [
        helper.make_node("ReduceMax", ["x"], ["m"], axes=[max_axis]),
        helper.make_node("Sub", ["x", "m"], ["d"]),
        helper.make_node("Exp", ["d"], ["e"]),
        helper.make_node("ReduceSum", ["e", "axes"], ["s"]),
        helper.make_node("Div", ["e", "s"], ["y"]),
        helper.make_node("Neg", ["e"], ["ne"]),
    ]
    outs = ["y", "ne"] if exp_read_elsewhere else ["y"]
    graph = helper.make_graph(
        nodes if exp_read_elsewhere else nodes[:-1],
        "g",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [3, 20])],
        [helper.make_tensor_value_info(v, onnx.TensorProto.FLOAT, None) for v in outs],
        [numpy_helper.from_array(np.array([1], "int64"), "axes")],
    )
    return onnx_model(graph, 13), {"x": rand(3, 20)}


def test_softmax_patterns_read_only_what_they_compute():
    assert _exported(*_softmax_model()) == ["Softmax"]
    # the exponential is read outside the pattern as well: computed once, as Exp
    written = _exported(*_softmax_model(exp_read_elsewhere=True))
    assert "Exp" in written and "Softmax" not in written
    # the maximum over another axis than the sum: not a softmax
    assert "Softmax" not in _exported(*_softmax_model(max_axis=0))


def _decomposed_layer_norm(axis: int, reciprocal: bool, variant: str = ""):
    """LayerNorm as PyTorch's exporter writes BERT's (ReduceMean, Sub, Pow, Sqrt, Div), or with
    a reciprocal and a product; over one axis of x [2, 6, 24]. Variants that are something else:
    the mean returned too, the centred value read elsewhere, the mean of another tensor (z) or
    over another axis, a sum scaled by other than one over its count, the variance of d * x."""
    nodes = [
        helper.make_node("ReduceSum", ["x", "axes"], ["sum"]),
        helper.make_node("Mul", ["sum", "tenth"], ["scaled"]),
        helper.make_node(
            "ReduceMean",
            ["z" if variant == "mean of z" else "x"],
            ["mean"],
            axes=[1 if variant == "other axis" else axis],
        ),
        helper.make_node("Sub", ["x", "scaled" if variant == "scaled sum" else "mean"], ["d"]),
        helper.make_node("Mul", ["d", "x"], ["sq"])
        if variant == "d * x"
        else helper.make_node("Pow", ["d", "two"], ["sq"]),
        helper.make_node("ReduceMean", ["sq"], ["var"], axes=[axis]),
        helper.make_node("Add", ["var", "eps"], ["ve"]),
        helper.make_node("Sqrt", ["ve"], ["std"]),
    ]
    if reciprocal:
        nodes += [
            helper.make_node("Reciprocal", ["std"], ["inv"]),
            helper.make_node("Mul", ["d", "inv"], ["n"]),
        ]
    else:
        nodes.append(helper.make_node("Div", ["d", "std"], ["n"]))
    nodes += [helper.make_node("Mul", ["g", "n"], ["gn"]), helper.make_node("Add", ["gn", "b"], ["y"])]
    nodes.append(helper.make_node("Neg", ["d"], ["nd"]))
    param = [1] * 3
    param[axis] = [2, 6, 24][axis]
    inits = [
        numpy_helper.from_array(np.float32(2), "two"),
        numpy_helper.from_array(np.float32(1e-5), "eps"),
        numpy_helper.from_array(rand(*param, seed=1), "g"),
        numpy_helper.from_array(rand(*param, seed=2), "b"),
        numpy_helper.from_array(np.float32(0.1), "tenth"),
        numpy_helper.from_array(np.array([axis], "int64"), "axes"),
    ]
    outs = {"mean returned": ["y", "mean"], "centred read elsewhere": ["y", "nd"]}.get(variant, ["y"])
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info(v, onnx.TensorProto.FLOAT, [2, 6, 24]) for v in ("x", "z")],
        [helper.make_tensor_value_info(v, onnx.TensorProto.FLOAT, None) for v in outs],
        inits,
    )
    return onnx_model(graph, 13), {"x": rand(2, 6, 24, low=-3, high=5), "z": rand(2, 6, 24, seed=3)}


@pytest.mark.parametrize("reciprocal", [False, True])
def test_a_decomposed_layer_norm_is_written_as_one(reciprocal):
    assert _exported(*_decomposed_layer_norm(2, reciprocal)) == ["LayerNormalization"]


def test_normalizations_that_onnx_cannot_express_stay_primitives():
    # over the middle axis: neither the last axes nor every axis after N and C
    assert "ReduceSum" in _exported(*_decomposed_layer_norm(1, reciprocal=True))


@pytest.mark.parametrize(
    "variant", ["mean returned", "centred read elsewhere", "mean of z", "other axis", "scaled sum", "d * x"]
)
def test_what_only_looks_like_a_layer_norm_stays_primitives(variant):
    written = _exported(*_decomposed_layer_norm(2, reciprocal=variant == "other axis", variant=variant))
    assert "LayerNormalization" not in written and "InstanceNormalization" not in written


def test_slices_tiling_an_axis_are_written_as_one_split():
    model, feeds = one_node_model("Split", [rand(2, 9, 4), Const(np.array([2, 3, 4]))], {"axis": 1}, 13, 3)
    assert _exported(model, feeds) == ["Split"]
    # two pieces that leave the middle out stay slices
    nodes = [
        helper.make_node("Slice", ["x", "s0", "e0", "ax"], ["a"]),
        helper.make_node("Slice", ["x", "s1", "e1", "ax"], ["b"]),
        helper.make_node("Concat", ["b", "a"], ["y"], axis=1),
    ]
    consts = {"s0": [0], "e0": [2], "s1": [5], "e1": [9], "ax": [1]}
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2, 9, 4])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)],
        [numpy_helper.from_array(np.array(v, "int64"), k) for k, v in consts.items()],
    )
    assert _exported(onnx_model(graph, 13), {"x": rand(2, 9, 4)}) == ["Slice", "Slice", "Concat"]
    # two pieces that leave the end out stay slices too
    consts.update(s1=[2], e1=[5])
    graph.ClearField("initializer")
    graph.initializer.extend(numpy_helper.from_array(np.array(v, "int64"), k) for k, v in consts.items())
    assert _exported(onnx_model(graph, 13), {"x": rand(2, 9, 4)}) == ["Slice", "Slice", "Concat"]


@pytest.mark.parametrize("varies_along_rows", [False, True])
def test_a_lerp_whose_weights_vary_along_another_axis_is_no_resize(varies_along_rows):
    from korch.frontend.ops.sampling import linear_taps, source_coords

    lo, hi, w = linear_taps(source_coords("half_pixel", 8, 4, 2.0), 4, "float32")
    weights = np.broadcast_to(w, (1, 2, 4, 8)).copy()
    if varies_along_rows:
        weights += 0.01 * np.arange(4, dtype="float32")[:, None]
    b = GraphBuilder()
    x = b.input("x", TensorType((1, 2, 4, 4), "float32"))
    g0 = b.emit(Prim.GATHER, [x, b.const(lo)], axis=3)[0]
    g1 = b.emit(Prim.GATHER, [x, b.const(hi)], axis=3)[0]
    diff = b.emit(Prim.SUB, [g1, g0])[0]
    step = b.emit(Prim.MUL, [diff, b.const(weights)])[0]
    graph = b.build([b.emit(Prim.ADD, [g0, step])[0]], ["y"])
    spec = kernel_spec(graph, make_candidate(graph, range(len(graph.nodes))))
    known = _known_weights(graph, spec)
    assert ("Gather" in _written(spec, known)) == varies_along_rows
    _run_and_check(spec, [rand(1, 2, 4, 4) if v == "x" else graph.constants[v] for v in spec.inputs], known)
