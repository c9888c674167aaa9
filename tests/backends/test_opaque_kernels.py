"""Opaque operators (kept whole, run by ONNX Runtime) as kernels of their own: their constant
inputs (baked into the kernel graph) and weights (given to compile) must reach the session."""

import numpy as np
import pytest
import torch
from helpers import onnx_model, rand
from onnx import TensorProto, helper, numpy_helper

import korch
from korch.backends.onnxrt import OnnxRuntimeBackend
from korch.ir import reference
from korch.ir.prims import Prim
from korch.ir.tensors import to_tensor
from korch.measure import check
from korch.pipeline import OptimizeOptions, optimize
from korch.profile.jobs import check_kernel
from korch.search.candidates import make_candidate
from korch.search.kernel import kernel_spec

F, I64 = TensorProto.FLOAT, TensorProto.INT64


def _model(nodes, inputs, outputs, inits=(), opset=17):
    vi = helper.make_tensor_value_info
    graph = helper.make_graph(
        nodes,
        "opaque",
        [vi(n, t, s) for n, t, s in inputs],
        [vi(n, t, s) for n, t, s in outputs],
        [numpy_helper.from_array(np.asarray(a), n) for n, a in inits],
    )
    return onnx_model(graph, opset)


def rnn_weights():
    """An LSTM with a ThresholdedRelu cell activation and no alpha (ONNX Runtime's default, 0, is
    not the spec's, 1: its rule leaves it whole) between two fusible ops: its sequence lengths and
    bias small enough to be baked into the kernel, its weight matrices inputs of it (weights), and
    two outputs, both read."""
    acts = ["Sigmoid", "ThresholdedRelu", "Tanh"]
    nodes = [
        helper.make_node("Relu", ["x"], ["r"]),
        helper.make_node(
            "LSTM", ["r", "w", "rec", "b", "lengths"], ["seq", "h"], hidden_size=4, activations=acts
        ),
        helper.make_node("Exp", ["h"], ["y"]),
    ]
    inits = [
        ("w", rand(1, 16, 8, seed=1) * 0.3),
        ("rec", rand(1, 16, 4, seed=2) * 0.3),
        ("b", rand(1, 32, seed=3) * 0.2),
        ("lengths", np.array([5, 3], "int32")),
    ]
    outs = [("y", F, [1, 2, 4]), ("seq", F, [5, 1, 2, 4])]
    return _model(nodes, [("x", F, [5, 2, 8])], outs, inits), "LSTM"


def _microsoft(nodes, inputs, outputs, inits):
    """A model with com.microsoft's contrib operators (no fission rules: opaque)."""
    model = _model(nodes, inputs, outputs, inits, 13)
    model.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    return model


def qlinear_where_scales():
    """com.microsoft's QLinearWhere whose scales, zero points and second operand are small
    constants."""
    node = helper.make_node(
        "QLinearWhere", ["c", "x", "xs", "xz", "b", "bs", "bz", "ys", "yz"], ["y"], domain="com.microsoft"
    )
    inits = [
        ("xs", np.float32(0.05)),
        ("xz", np.uint8(120)),
        ("b", (np.arange(8, dtype="uint8") * 20).reshape(2, 4)),
        ("bs", np.float32(0.07)),
        ("bz", np.uint8(3)),
        ("ys", np.float32(0.1)),
        ("yz", np.uint8(100)),
    ]
    inputs = [("c", TensorProto.BOOL, [2, 4]), ("x", TensorProto.UINT8, [2, 4])]
    return _microsoft([node], inputs, [("y", TensorProto.UINT8, [2, 4])], inits), "QLinearWhere"


def matmul_nbits_weight():
    """com.microsoft's MatMulNBits (4-bit weights in blocks of 32) with g_idx (an order of K's
    columns among the blocks, which its rule leaves whole) and a constant weight large enough to
    be a weight input (integers up to candidates.INDEX_CONSTANT elements are baked in), then a
    fusible op."""
    k, n, block = 256, 64, 32
    nodes = [
        helper.make_node(
            "MatMulNBits",
            ["x", "w", "s", "", "g"],
            ["q"],
            domain="com.microsoft",
            K=k,
            N=n,
            bits=4,
            block_size=block,
        ),
        helper.make_node("Tanh", ["q"], ["y"]),
    ]
    rng = np.random.default_rng(0)
    inits = [
        ("w", rng.integers(0, 256, (n, k // block, block // 2)).astype("uint8")),
        ("s", rng.uniform(0.01, 0.05, n * (k // block)).astype("float32")),
        ("g", rng.permutation(np.arange(k) // block).astype("int32")),
    ]
    return _microsoft(nodes, [("x", F, [3, k])], [("y", F, [3, n])], inits), "MatMulNBits"


def rnn_last_state_only():
    """An RNN with ThresholdedRelu and no alpha (ONNX Runtime's default, 0, is not the spec's, 1:
    its rule leaves it whole) whose sequence output is never read: the kernel writes one of its
    two outputs, which must be the last hidden state."""
    node = helper.make_node(
        "RNN", ["x", "w", "rec"], ["seq", "h"], hidden_size=3, activations=["ThresholdedRelu"]
    )
    inits = [("w", rand(1, 3, 6, seed=1) * 0.3), ("rec", rand(1, 3, 3, seed=2) * 0.3)]
    return _model([node], [("x", F, [4, 2, 6])], [("h", F, [1, 2, 3])], inits), "RNN"


MODELS = {
    "rnn_weights": rnn_weights,
    "qlinear_where_scales": qlinear_where_scales,
    "matmul_nbits_weight": matmul_nbits_weight,
    "rnn_last_state_only": rnn_last_state_only,
}


def _opaque_spec(model):
    """The opaque node as a kernel of its own, with its inputs' values (weights among them)."""
    graph = korch.fission(model).graph
    (index,) = [i for i, n in enumerate(graph.nodes) if n.prim is Prim.OPAQUE]
    spec = kernel_spec(graph, make_candidate(graph, [index]))
    feeds = check.random_inputs(graph, 0)
    values = reference.evaluate(graph, feeds, [*graph.inputs, *graph.constants, *spec.inputs])
    inputs = [values[v] for v in spec.inputs]
    weights = {n: values[v] for n, v in zip(spec.graph.inputs, spec.inputs) if v in graph.constants}
    return spec, inputs, weights


@pytest.mark.parametrize("case", list(MODELS))
def test_opaque_kernel_with_constant_inputs_compiles_and_runs(case):
    model, op = MODELS[case]()
    spec, inputs, weights = _opaque_spec(model)
    assert spec.graph.nodes[0].a["op_type"] == op
    if case in ("rnn_weights", "qlinear_where_scales"):
        assert spec.graph.constants, "the small constant input should be baked into the kernel"
    if case in ("rnn_weights", "matmul_nbits_weight"):
        assert weights, "the large constant should be a weight input"
    want = reference.run(spec.graph, dict(zip(spec.graph.inputs, inputs)))
    backend = OnnxRuntimeBackend()
    for given in (weights, {}):  # baked in (as the runtime and the profiler do), or fed
        compiled = backend.compile(spec, "cpu", given)
        outs = compiled.fn(*[to_tensor(x) for x in inputs])
        assert check_kernel(outs, want, spec.graph) is None


@pytest.mark.e2e
@pytest.mark.parametrize("case", list(MODELS))
def test_plan_runs_an_opaque_kernel_with_constant_inputs(case, tmp_path):
    model, op = MODELS[case]()
    options = OptimizeOptions(
        backends=("onnxruntime",), min_time=0.002, progress=False, seeds=False, cache=tmp_path / "p.sqlite"
    )
    plan = optimize(model, options=options)
    opaque = [k for k in plan.kernels if any(n.prim is Prim.OPAQUE for n in k.spec.graph.nodes)]
    assert [k.spec.graph.nodes[0].a["op_type"] for k in opaque] == [op]
    assert plan.verify() <= 1e-4
    feeds = plan.random_inputs(1)
    want = check.onnxruntime_outputs(model, feeds)
    got = plan.run(feeds)
    for name, w in want.items():
        assert got[name].dtype == w.dtype and got[name].shape == w.shape, name
        np.testing.assert_allclose(got[name], w, rtol=1e-4, atol=1e-5)


@pytest.mark.e2e
def test_plan_with_an_opaque_kernel_survives_save_and_load(tmp_path):
    """The loaded plan compiles its kernels again (korch.plan.runtime, weights baked in)."""
    from korch.plan.plan import Plan

    model, _ = rnn_weights()
    options = OptimizeOptions(
        backends=("onnxruntime",), min_time=0.002, progress=False, seeds=False, cache=tmp_path / "p.sqlite"
    )
    optimize(model, options=options).save(tmp_path / "plan")
    plan = Plan.load(tmp_path / "plan")
    x = rand(5, 2, 8, seed=5)
    got = plan(torch.as_tensor(x))
    want = check.onnxruntime_outputs(model, {"x": x})
    for y, name in zip(got, ("y", "seq")):
        np.testing.assert_allclose(np.asarray(y), want[name], rtol=1e-4, atol=1e-5)


def test_onnxruntime_declines_an_opaque_operator_among_others():
    """The whole primitive graph as one kernel cannot splice an opaque operator's model (an opset
    of its own) into ONNX at opset 18: declined up front rather than a failed compile."""
    model, _ = rnn_weights()
    graph = korch.fission(model).graph
    spec = kernel_spec(graph, make_candidate(graph, range(len(graph.nodes))))
    assert "opaque" in OnnxRuntimeBackend().supports(spec, "cpu")
