"""The inductor-frozen backend: kernels compiled with their weights as constants, against the reference."""

import numpy as np
import pytest
import torch
from helpers import onnx_model, rand
from onnx import TensorProto, helper, numpy_helper
from test_backends import CASES, _whole_graph_spec

import korch
from korch.backends import compile_with, get_backends
from korch.backends.inductor import InductorFrozenBackend
from korch.ir import reference
from korch.ir.graph import GraphBuilder
from korch.ir.prims import Prim
from korch.ir.tensor_type import TensorType
from korch.ir.tensors import to_numpy, to_tensor
from korch.measure import check
from korch.profile.jobs import check_kernel
from korch.search.candidates import make_candidate
from korch.search.kernel import KernelSpec, kernel_spec

FROZEN = InductorFrozenBackend()


def conv_relu_model(seed: int = 1, channels: int = 16):
    """x[1, 8, 12, 12] -> Conv(16 filters 3x3, bias) -> Relu; the weight and bias initializers."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 12, 12])
    z = helper.make_tensor_value_info("z", TensorProto.FLOAT, None)
    inits = [
        numpy_helper.from_array(rand(channels, 8, 3, 3, seed=seed) * 0.2, "w"),
        numpy_helper.from_array(rand(channels, seed=seed + 1), "b"),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["y"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["y"], ["z"]),
    ]
    return onnx_model(helper.make_graph(nodes, "conv_relu", [x], [z], inits), 17), {"x": rand(1, 8, 12, 12)}


def matmul_bias_model(seed: int = 1):
    """x[16, 32] @ w[32, 24] + b[24]."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [16, 32])
    z = helper.make_tensor_value_info("z", TensorProto.FLOAT, None)
    inits = [
        numpy_helper.from_array(rand(32, 24, seed=seed), "w"),
        numpy_helper.from_array(rand(24, seed=seed + 1), "b"),
    ]
    nodes = [helper.make_node("MatMul", ["x", "w"], ["y"]), helper.make_node("Add", ["y", "b"], ["z"])]
    return onnx_model(helper.make_graph(nodes, "matmul_bias", [x], [z], inits), 17), {"x": rand(16, 32)}


def whole_spec(model, feeds):
    """The whole primitive graph as one kernel, its inputs' values, and the weights among them."""
    graph = korch.fission(model).graph
    spec = kernel_spec(graph, make_candidate(graph, range(len(graph.nodes))))
    env = {**graph.constants, **feeds}
    inputs = [env[v] for v in spec.inputs]
    return spec, inputs, {spec.graph.inputs[i]: inputs[i] for i in spec.weights}


def run_checked(spec: KernelSpec, inputs, weights, device: str = "cpu") -> list[np.ndarray]:
    """The frozen kernel's outputs, checked against the reference executor."""
    compiled = compile_with(FROZEN, spec, device, weights)
    outs = compiled.fn(*[to_tensor(x, device) for x in inputs])
    want = reference.run(spec.graph, dict(zip(spec.graph.inputs, inputs)))
    assert check_kernel(outs, want, spec.graph) is None
    assert compiled.kernels >= 1
    return [to_numpy(y) for y in outs]


def sources(monkeypatch) -> list[str]:
    """The wrapper code Inductor generates from now on in this test."""
    import torch._inductor.compile_fx as compile_fx

    found, inner = [], compile_fx.compile_fx_inner

    def recording(*args, **kwargs):
        compiled = inner(*args, **kwargs)
        found.append(compiled.source_code)
        return compiled

    monkeypatch.setattr(compile_fx, "compile_fx_inner", recording)
    return found


def test_kernel_spec_names_the_inputs_that_are_weights():
    model, feeds = conv_relu_model()
    graph = korch.fission(model).graph
    spec = kernel_spec(graph, make_candidate(graph, range(len(graph.nodes))))
    assert [spec.inputs[i] for i in spec.weights] == [v for v in spec.inputs if v in graph.constants]
    assert len(spec.weights) == 2 and "x" not in [spec.inputs[i] for i in spec.weights]


def test_conv_bias_relu_matches_the_reference_as_one_prepacked_onednn_call(monkeypatch):
    spec, inputs, weights = whole_spec(*conv_relu_model())
    assert FROZEN.supports(spec, "cpu") is None
    found = sources(monkeypatch)
    run_checked(spec, inputs, weights)
    if torch.backends.mkldnn.is_available():
        body = found[-1].split("def call(", 1)[-1]
        # the bias folded into the conv, the relu fused as its post-op
        assert "torch.ops.mkldnn._convolution_pointwise" in body and "'relu'" in body


def test_matmul_bias_matches_the_reference():
    spec, inputs, weights = whole_spec(*matmul_bias_model())
    assert FROZEN.supports(spec, "cpu") is None
    run_checked(spec, inputs, weights)


@pytest.mark.parametrize("case", list(CASES))
def test_every_case_it_takes_matches_the_reference(case):
    """test_backends' one-operator models: those with a weight under a linear primitive."""
    spec, inputs, want = _whole_graph_spec(case)
    reason = FROZEN.supports(spec, "cpu")
    if reason is not None:
        assert case not in ("conv_bias", "conv_asym", "conv_transpose", "gemm_bias", "gru"), reason
        return
    weights = {spec.graph.inputs[i]: inputs[i] for i in spec.weights}
    compiled = compile_with(FROZEN, spec, "cpu", weights)
    assert check_kernel(compiled.fn(*[to_tensor(x) for x in inputs]), want, spec.graph) is None


def weight_only_subgraph() -> KernelSpec:
    """x[16, 32] @ (transpose(w[24, 32]) * 0.5): the weight's transpose and scale fold at compile time."""
    b = GraphBuilder()
    x = b.input("in0", TensorType((16, 32), "float32"))
    w = b.input("in1", TensorType((24, 32), "float32"))
    (wt,) = b.emit(Prim.TRANSPOSE, [w], perm=(1, 0))
    (scaled,) = b.emit(Prim.MUL, [wt, b.const(np.float32(0.5))])
    (y,) = b.emit(Prim.MATMUL, [x, scaled])
    graph = b.build([y, scaled], ["out0", "out1"], name="weight_only")
    return KernelSpec("weight_only", graph, graph.inputs, graph.outputs, weights=(1,))


def test_a_weight_only_subgraph_is_folded_and_its_output_is_the_callers_own():
    spec = weight_only_subgraph()
    assert FROZEN.supports(spec, "cpu") is None  # (the matmul reads the weight through two primitives)
    inputs = [rand(16, 32), rand(24, 32, seed=1)]
    compiled = compile_with(FROZEN, spec, "cpu", {"in1": inputs[1]})
    args = [to_tensor(x) for x in inputs]
    first = compiled.fn(*args)
    want = reference.run(spec.graph, dict(zip(spec.graph.inputs, inputs)))
    assert check_kernel(first, want, spec.graph) is None
    first[1].fill_(7.0)  # a caller's write to the folded output changes no later call
    assert check_kernel(compiled.fn(*args), want, spec.graph) is None


def float64_matmul_bias_model(seed: int = 1):
    """matmul_bias_model in float64: nothing for oneDNN or MKL to pack, so Inductor's FX graph cache
    serves the second compile (a packed conv weight makes it bypass the cache)."""
    model, feeds = matmul_bias_model(seed)
    for init in model.graph.initializer:
        init.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(init).astype("float64"), init.name))
    model.graph.input[0].type.tensor_type.elem_type = TensorProto.DOUBLE
    model.graph.output[0].type.tensor_type.elem_type = TensorProto.DOUBLE
    return model, {"x": feeds["x"].astype("float64")}


def check_kept_apart(make, device: str) -> None:
    """Same key, shapes and code, other weights, in one process: Inductor's caches must not hand
    one kernel's weights to the other."""
    (spec, inputs, one), (_, _, other) = whole_spec(*make(seed=1)), whole_spec(*make(seed=5))
    assert one.keys() == other.keys() and any(not np.array_equal(one[v], other[v]) for v in one)
    first = run_checked(spec, inputs, one, device)
    second = run_checked(spec, [other.get(v, x) for v, x in zip(spec.graph.inputs, inputs)], other, device)
    assert not np.allclose(first[0], second[0])
    assert np.allclose(run_checked(spec, inputs, one, device)[0], first[0])  # (and back)


@pytest.mark.parametrize("make", [conv_relu_model, float64_matmul_bias_model])
def test_kernels_of_one_structure_keep_their_own_weights(make):
    check_kept_apart(make, "cpu")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("make", [conv_relu_model, matmul_bias_model])
def test_kernels_of_one_structure_keep_their_own_weights_on_cuda(make):
    check_kept_apart(make, "cuda")


def test_supports_only_kernels_where_freezing_changes_something():
    b = GraphBuilder()
    x, w = (b.input(n, TensorType((4, 4), "float32")) for n in ("in0", "in1"))
    (added,) = b.emit(Prim.ADD, [x, w])
    (y,) = b.emit(Prim.MATMUL, [x, added])
    graph = b.build([y], ["out0"])
    refused = "no linear primitive reads a weight (freezing changes nothing)"
    # activations only; a weight read by elementwise work only; a matmul of a weight mixed with an activation
    assert FROZEN.supports(KernelSpec("k", graph, graph.inputs, graph.outputs), "cpu") == refused
    assert (
        FROZEN.supports(KernelSpec("k", graph, graph.inputs, graph.outputs, weights=(1,)), "cpu") == refused
    )
    assert FROZEN.supports(KernelSpec("k", graph, graph.inputs, graph.outputs, weights=(0,)), "cpu") is None
    assert FROZEN.supports(KernelSpec("k", graph, graph.inputs, graph.outputs, weights=(0, 1)), "cpu") is None
    wide = GraphBuilder()
    x, w = (wide.input(n, TensorType((4, 4), "float64")) for n in ("in0", "in1"))
    (y,) = wide.emit(Prim.MATMUL, [x, w])
    doubles = wide.build([y], ["out0"])
    assert FROZEN.supports(
        KernelSpec("k", doubles, doubles.inputs, doubles.outputs, weights=(1,)), "cuda"
    ) == ("float64 on CUDA")


def test_its_profiles_are_apart_from_inductors():
    (inductor, frozen) = get_backends(["inductor", "inductor-frozen"])
    assert frozen.bakes_weights and not inductor.bakes_weights
    assert frozen.version() != inductor.version()
    assert "inductor-frozen" in [b.name for b in get_backends(device="cpu")]


def check_a_plan_of_one_backend(make, backend: str, time_budget: float, tmp_path) -> None:
    """The model optimized with the backend alone: every kernel its, the plan and the plan saved
    and loaded again agreeing with ONNX Runtime."""
    model, feeds = make()
    plan = korch.optimize(
        model,
        backends=(backend,),
        time_budget=time_budget,
        jobs=1,
        min_time=0.002,
        cache=tmp_path / "db.sqlite",
        progress=False,
    )
    assert {k.backend for k in plan.kernels} == {backend}
    want = check.onnxruntime_outputs(model, feeds)["z"]
    loaded = korch.load(plan.save(tmp_path / "plan"))
    for p in (plan, loaded):
        assert check.rel_err(p.run(feeds)["z"], want) <= 1e-4


@pytest.mark.e2e
def test_a_plan_of_frozen_kernels_runs_after_save_and_load(tmp_path):
    check_a_plan_of_one_backend(conv_relu_model, "inductor-frozen", 30, tmp_path)
