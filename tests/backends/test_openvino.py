"""The OpenVINO backend against the reference executor (and the source model against ONNX Runtime),
on CPU."""

import numpy as np
import onnx
import pytest
import torch
from helpers import Const, one_node_model, onnx_model, rand
from onnx import TensorProto, helper, numpy_helper
from test_backends import _whole_graph_spec, grouped_matmul_spec
from test_opaque_kernels import _opaque_spec, rnn_weights

import korch
from korch.backends import get_backends
from korch.backends.onnx_patterns import OPENVINO_PATTERNS, PATTERNS
from korch.backends.onnxrt import OnnxRuntimeBackend, to_onnx
from korch.backends.openvino import OpenVinoBackend
from korch.ir import reference
from korch.ir.graph import GraphBuilder
from korch.ir.prims import Prim, TensorType
from korch.ir.tensors import to_tensor
from korch.measure import check
from korch.pipeline import OptimizeOptions, optimize, original_model_seed
from korch.profile.jobs import check_kernel
from korch.rewrite import cheaper_mish
from korch.search.candidates import make_candidate
from korch.search.kernel import kernel_spec

F = TensorProto.FLOAT


def _spec(build, inputs: dict[str, TensorType]):
    """The whole graph `build(builder, values)` makes as one kernel."""
    b = GraphBuilder()
    values = {name: b.input(name, t) for name, t in inputs.items()}
    graph = b.build(*build(b, values))
    return kernel_spec(graph, make_candidate(graph, range(len(graph.nodes))))


def _check(spec, values, weights=()):
    """Compiled with the values of the inputs named in `weights` baked in: fn and arrays against
    the reference executor (`values` by the graph's names, which the kernel's inputs rename)."""
    args = [values[v] for v in spec.inputs]
    want = reference.run(spec.graph, dict(zip(spec.graph.inputs, args)))
    baked = {n: values[v] for n, v in zip(spec.graph.inputs, spec.inputs) if v in weights}
    compiled = OpenVinoBackend().compile(spec, "cpu", baked)
    assert check_kernel(compiled.fn(*[to_tensor(x) for x in args]), want, spec.graph) is None
    assert check_kernel(compiled.arrays(*args), want, spec.graph) is None
    return compiled


def _elementwise(b, v):
    (e,) = b.emit(Prim.EXP, [v["x"]])
    (m,) = b.emit(Prim.MUL, [e, v["y"]])
    (t,) = b.emit(Prim.TANH, [m])
    (s,) = b.emit(Prim.SUB, [t, v["x"]])
    return [s, m], ["s", "m"]


def test_elementwise_chain_with_two_outputs():
    spec = _spec(_elementwise, {"x": TensorType((3, 17), "float32"), "y": TensorType((3, 17), "float32")})
    _check(spec, {"x": rand(3, 17), "y": rand(3, 17, seed=1)})


def _conv_bias_relu(b, v):
    (c,) = b.emit(Prim.CONV, [v["x"], v["w"]], strides=(1, 1), pads=(1, 1, 1, 1), dilations=(1, 1), group=1)
    (bias,) = b.emit(Prim.BROADCAST, [v["b"]], shape=(1, 4, 9, 9))
    (a,) = b.emit(Prim.ADD, [c, bias])
    (r,) = b.emit(Prim.MAX, [a, b.const(np.zeros((), "float32"))])
    return [r], ["y"]


def test_conv_bias_relu_with_its_weight_baked_in():
    values = {"x": rand(1, 3, 9, 9), "w": rand(4, 3, 3, 3, seed=1), "b": rand(1, 4, 1, 1, seed=2)}
    spec = _spec(_conv_bias_relu, {k: TensorType(a.shape, "float32") for k, a in values.items()})
    compiled = _check(spec, values, weights=("w", "b"))
    assert compiled.kernels >= 3


def test_batched_matmul():
    def build(b, v):
        return [b.emit(Prim.MATMUL, [v["a"], v["b"]])[0]], ["y"]

    spec = _spec(build, {"a": TensorType((2, 5, 8), "float32"), "b": TensorType((2, 8, 6), "float32")})
    _check(spec, {"a": rand(2, 5, 8), "b": rand(2, 8, 6, seed=1)})


@pytest.mark.parametrize("case", ["softmax", "layernorm", "reduce_prod", "argmax", "top_k", "gather"])
def test_reductions_and_indices_match_the_reference(case):
    spec, inputs, want = _whole_graph_spec(case)
    assert OpenVinoBackend().supports(spec, "cpu") is None
    outs = OpenVinoBackend().compile(spec, "cpu").fn(*[to_tensor(x) for x in inputs])
    assert check_kernel(outs, want, spec.graph) is None


def _small_model():
    """Conv (a weight) -> Relu -> Add (a second input) -> Softmax, two outputs."""
    vi = helper.make_tensor_value_info
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["r"]),
        helper.make_node("Add", ["r", "z"], ["y"]),
        helper.make_node("Softmax", ["y"], ["p"], axis=-1),
    ]
    graph = helper.make_graph(
        nodes,
        "small",
        [vi("x", F, [1, 3, 8, 8]), vi("z", F, [1, 4, 8, 8])],
        [vi("p", F, [1, 4, 8, 8]), vi("y", F, [1, 4, 8, 8])],
        [numpy_helper.from_array(rand(4, 3, 3, 3, seed=3), "w")],
    )
    return onnx_model(graph, 17)


def test_the_source_model_run_whole_matches_onnxruntime(tmp_path):
    path = tmp_path / "small.onnx"
    onnx.save(_small_model(), path)
    model = onnx.load(path)
    graph = korch.fission(model).graph
    _, spec = original_model_seed(graph, model)
    backend = OpenVinoBackend()
    assert backend.supports(spec, "cpu") is None
    feeds = {"x": rand(1, 3, 8, 8), "z": rand(1, 4, 8, 8, seed=1)}
    want = check.onnxruntime_outputs(model, feeds)
    compiled = backend.compile(spec, "cpu")
    outs = compiled.fn(*[to_tensor(feeds[v]) for v in spec.inputs])
    for out, name in zip(outs, ("p", "y")):
        np.testing.assert_allclose(out.numpy(), want[name], rtol=1e-5, atol=1e-6)
    for out, name in zip(compiled.arrays(*[feeds[v] for v in spec.inputs]), ("p", "y")):
        np.testing.assert_allclose(out, want[name], rtol=1e-5, atol=1e-6)


def test_outputs_are_new_memory_in_every_call():
    """A plan may hold call N's results while call N+1 runs: they must not share the request's
    buffers, nor each other's, nor the inputs' (the reshape passes its input through)."""

    def build(b, v):
        (e,) = b.emit(Prim.EXP, [v["x"]])
        (r,) = b.emit(Prim.RESHAPE, [v["x"]], shape=(8, 3))
        return [e, r], ["e", "r"]

    spec = _spec(build, {"x": TensorType((4, 6), "float32")})
    compiled = OpenVinoBackend().compile(spec, "cpu")
    assert OpenVinoBackend.fresh_outputs
    x1, x2 = rand(4, 6), rand(4, 6, seed=1)
    for call, wrap in ((compiled.fn, to_tensor), (compiled.arrays, np.asarray)):
        a, b = wrap(x1.copy()), wrap(x2.copy())
        first = call(a)
        kept = [np.asarray(y).copy() for y in first]
        second = call(b)
        for y, k in zip(first, kept):
            np.testing.assert_array_equal(np.asarray(y), k)  # call 2 wrote elsewhere
        np.testing.assert_allclose(np.asarray(second[0]), np.exp(x2), rtol=1e-6)
        pointers = [_address(y) for y in (*first, *second)]
        assert len(set(pointers)) == 4 and not {_address(a), _address(b)} & set(pointers)


def test_a_scalar_and_a_read_only_array_as_inputs():
    """numpy makes a 0-d array 1-d when asked for a contiguous one, and OpenVINO shares only
    writeable arrays."""

    def build(b, v):
        return [b.emit(Prim.MUL, [v["s"], v["s"]])[0], b.emit(Prim.EXP, [v["x"]])[0]], ["q", "e"]

    spec = _spec(build, {"s": TensorType((), "float32"), "x": TensorType((2, 3), "float32")})
    frozen = rand(2, 3)
    frozen.setflags(write=False)
    compiled = _check(spec, {"s": np.array(1.5, "float32"), "x": frozen})
    assert (
        compiled.arrays(*[np.array(1.5, "float32") if v == "s" else frozen for v in spec.inputs])[0].shape
        == ()
    )


def _address(y):
    return y.data_ptr() if isinstance(y, torch.Tensor) else y.ctypes.data


def _narrow_add(b, v):
    return [b.emit(Prim.ADD, [v["x"], v["x"]])[0]], ["y"]


def _int64_gather(b, v):
    (neg,) = b.emit(Prim.LT, [v["i"], b.const(np.zeros((), "int64"))])
    (up,) = b.emit(Prim.ADD, [v["i"], b.const(np.array(10, "int64"))])
    (i,) = b.emit(Prim.WHERE, [neg, up, v["i"]])
    return [b.emit(Prim.GATHER, [v["t"], i], axis=0)[0]], ["y"]


def test_supports_refuses_what_openvino_computes_otherwise():
    backend = OpenVinoBackend()
    x = {"x": TensorType((2, 3), "float32")}
    assert "CPU plugin only" in backend.supports(_spec(_narrow_add, x), "cuda")
    for dtype, words in [("float64", "float64 in float32"), ("bfloat16", "bfloat16"), ("int8", "saturates")]:
        assert words in backend.supports(_spec(_narrow_add, {"x": TensorType((2, 3), dtype)}), "cpu")
    assert backend.supports(_spec(_narrow_add, {"x": TensorType((2, 3), "int32")}), "cpu") is None
    # int64 as indices (wrapped when negative): taken; int64 arithmetic that is output: refused
    gather = {"t": TensorType((10, 4), "float32"), "i": TensorType((2, 2), "int64")}
    spec = _spec(_int64_gather, gather)
    assert backend.supports(spec, "cpu") is None
    _check(spec, {"t": rand(10, 4), "i": np.array([[1, 9], [0, -3]], "int64")})
    assert "int64" in backend.supports(_spec(_narrow_add, {"x": TensorType((2, 3), "int64")}), "cpu")
    spec, _, _ = _whole_graph_spec("int_div")
    assert "int64" in backend.supports(spec, "cpu")


def test_supports_refuses_what_onnx_cannot_say_and_opaque_operators():
    backend = OpenVinoBackend()
    spec, _, _ = grouped_matmul_spec([3, 3, 8, 10])
    assert "grouped matmul" in backend.supports(spec, "cpu")
    spec, _, _ = _whole_graph_spec("avgpool")
    assert "window" in backend.supports(spec, "cpu")
    model, _ = rnn_weights()
    spec, _, _ = _opaque_spec(model)
    assert "opaque" in backend.supports(spec, "cpu")


def test_a_source_model_with_microsoft_operators_is_refused():
    model, _ = one_node_model("Gelu", [rand(2, 8)], {}, 17, domain="com.microsoft")
    graph = korch.fission(model).graph
    _, spec = original_model_seed(graph, model)
    assert "com.microsoft" in OpenVinoBackend().supports(spec, "cpu")


def test_openvino_is_a_default_on_cpu_only():
    assert "openvino" in [b.name for b in get_backends(None, "cpu")]
    assert "openvino" not in [b.name for b in get_backends(None, "cuda")]
    assert OpenVinoBackend().version().startswith("openvino-")


@pytest.mark.e2e
def test_a_plan_of_openvino_kernels_verifies_against_onnxruntime(tmp_path):
    model = _small_model()
    options = OptimizeOptions(
        backends=("openvino",), min_time=0.002, progress=False, seeds=False, cache=tmp_path / "p.sqlite"
    )
    plan = optimize(model, options=options)
    assert {k.backend for k in plan.kernels} == {"openvino"}
    assert plan.verify() <= 1e-4
    feeds = plan.random_inputs(1)
    want = check.onnxruntime_outputs(model, feeds)
    got = plan.run(feeds)
    for name, w in want.items():
        np.testing.assert_allclose(got[name], w, rtol=1e-4, atol=1e-5)


def test_a_constant_baked_into_the_kernel_graph_reaches_the_model():
    model, _ = one_node_model("Add", [rand(4, 8), Const(rand(1, seed=1))], {}, 13)
    graph = korch.fission(model).graph
    spec = kernel_spec(graph, make_candidate(graph, range(len(graph.nodes))))
    assert spec.graph.inputs == ("in0",) and spec.graph.constants
    _check(spec, {"in0": rand(4, 8)})


@pytest.mark.parametrize("op, cheaper", [("Mish", False), ("Mish", True), ("Softplus", False)])
def test_mish_and_softplus_reach_openvino_as_operators_and_onnxruntime_as_primitives(op, cheaper):
    """A convolution then Mish (or Softplus): OpenVINO is written the operator (it fuses Mish into
    the convolution), ONNX Runtime the primitives; both agree with the reference executor, on
    values wide enough that exp overflows at one end and vanishes at the other. Mish as imported,
    and as korch.rewrite.mish makes it cheaper."""
    vi = helper.make_tensor_value_info
    conv = helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1])
    nodes = [conv, helper.make_node(op, ["c"], ["y"])]
    w = numpy_helper.from_array(rand(4, 3, 3, 3, low=-1, high=1, seed=1), "w")
    graph = helper.make_graph(nodes, "g", [vi("x", F, [1, 3, 8, 8])], [vi("y", F, [1, 4, 8, 8])], [w])
    graph = korch.fission(onnx_model(graph, 18)).graph
    if cheaper:
        graph, notes = cheaper_mish(graph)
        assert len(notes) == 1 and not any(n.prim is Prim.TANH for n in graph.nodes)
    spec = kernel_spec(graph, make_candidate(graph, range(len(graph.nodes))))
    weights = {n: graph.constants[v] for n, v in zip(spec.graph.inputs, spec.inputs) if v in graph.constants}

    def written(patterns):
        ops = [n.op_type for n in to_onnx(spec.graph, weights, patterns).graph.node]
        return [o for o in ops if o != "Identity"]

    assert written(OPENVINO_PATTERNS) == ["Conv", op]
    assert written(PATTERNS)[0] == "Conv" and op not in written(PATTERNS)
    values = {**graph.constants, "x": rand(1, 3, 8, 8, low=-60, high=60)}
    _check(spec, values, weights=tuple(graph.constants))
    args = [values[v] for v in spec.inputs]
    want = reference.run(spec.graph, dict(zip(spec.graph.inputs, args)))
    compiled = OnnxRuntimeBackend().compile(spec, "cpu", weights)
    assert check_kernel(compiled.fn(*[to_tensor(a) for a in args]), want, spec.graph) is None
