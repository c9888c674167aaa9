"""bfloat16 models end to end. ONNX Runtime has no bfloat16 kernels on a CPU, so its oracle is the
same model in float32 (bfloat16 inputs and weights widen exactly); torch's is eager PyTorch in
bfloat16. korch computes every primitive in float32 and rounds its result once (torch's rule on a
CPU), so outputs sit a few of bfloat16's 2^-8 from either."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch
from helpers import onnx_model
from onnx import TensorProto, helper, numpy_helper

import korch
from korch.backends.onnxrt import OnnxRuntimeBackend
from korch.cli import commands as cli
from korch.cli import explain
from korch.cli.bench import bench
from korch.errors import KorchError
from korch.ir import reference
from korch.ir.prims import BFLOAT16
from korch.ir.tensors import to_numpy
from korch.measure import check
from korch.search.kernel import kernel_spec

TOLERANCE = 3e-2  # relative to the largest output value (korch.measure.check.rel_err)
FAST = dict(max_size=3, time_budget=15, jobs=1, min_time=0.002, progress=False)


def block_model(elem_type: int, dtype) -> onnx.ModelProto:
    """x @ w + b, Gelu, LayerNormalization, Softmax: weights over 16 elements (stored in .npz)."""
    rng = np.random.default_rng(0)
    inits = [
        numpy_helper.from_array((rng.standard_normal((32, 32)) * 0.2).astype(np.float32).astype(dtype), "w"),
        numpy_helper.from_array(rng.standard_normal(32).astype(np.float32).astype(dtype), "b"),
        numpy_helper.from_array((1 + rng.standard_normal(32) * 0.1).astype(np.float32).astype(dtype), "s"),
    ]
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["m"]),
        helper.make_node("Add", ["m", "b"], ["a"]),
        helper.make_node("Gelu", ["a"], ["g"]),
        helper.make_node("LayerNormalization", ["g", "s", "b"], ["l"], axis=-1),
        helper.make_node("Softmax", ["l"], ["y"], axis=-1),
    ]
    graph = helper.make_graph(
        nodes,
        "block",
        [helper.make_tensor_value_info("x", elem_type, [4, 32])],
        [helper.make_tensor_value_info("y", elem_type, [4, 32])],
        inits,
    )
    return onnx_model(graph, opset=20)


def bf16(array) -> np.ndarray:
    return np.asarray(array, np.float32).astype(BFLOAT16)


def float32_oracle(x: np.ndarray) -> np.ndarray:
    """ONNX Runtime's output of the float32 twin for bfloat16 input x."""
    twin = block_model(TensorProto.FLOAT, np.float32)
    return check.onnxruntime_outputs(twin, {"x": x.astype(np.float32)})["y"]


@pytest.fixture(scope="module")
def onnx_plan(tmp_path_factory):
    model = block_model(TensorProto.BFLOAT16, BFLOAT16)
    onnx.checker.check_model(model)
    cache = tmp_path_factory.mktemp("bf16") / "p.sqlite"
    return korch.optimize(model, cache=str(cache), **FAST)


def test_an_onnx_bfloat16_model_lowers_and_computes_what_its_float32_twin_does():
    result = korch.fission(block_model(TensorProto.BFLOAT16, BFLOAT16), strict=True)
    assert result.graph.types["x"].dtype == "bfloat16" and not result.opaque_ops
    x = bf16(np.random.default_rng(1).standard_normal((4, 32)))
    got = reference.run(result.graph, {"x": x})["y"]
    assert got.dtype == BFLOAT16
    assert check.rel_err(got, float32_oracle(x)) <= TOLERANCE


def test_a_bfloat16_fission_is_checked_against_its_float32_twin_in_onnxruntime(tmp_path, capsys):
    """ONNX Runtime has no bfloat16 kernels on a CPU: the oracle is the same model with its
    bfloat16 weights, inputs, constants and casts widened to float32, built independently here
    as the test's own float32 model (the twin must compute exactly what it computes)."""
    model = cast_block_model()
    twin = check.float32_twin(model)
    assert check.has_bfloat16(model) and not check.has_bfloat16(twin)
    x = bf16(np.random.default_rng(4).standard_normal((4, 32)))
    float32 = cast_block_model(TensorProto.FLOAT, np.float32)
    for mine, theirs in zip(float32.graph.initializer, model.graph.initializer):  # (bfloat16's values)
        mine.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(theirs).astype(np.float32), mine.name))
    want = check.onnxruntime_outputs(float32, {"x": x.astype(np.float32)})
    got = check.onnxruntime_outputs(model, {"x": x})
    assert np.array_equal(got["y"], want["y"]) and got["y"].dtype == np.float32
    assert korch.check_fission(korch.fission(model)) <= TOLERANCE
    path = tmp_path / "bf16.onnx"
    onnx.save(model, path)
    assert cli.main(["fission", str(path), "--check"]) == 0
    assert "max relative error" in capsys.readouterr().out


def cast_block_model(elem_type: int = TensorProto.BFLOAT16, dtype=BFLOAT16) -> onnx.ModelProto:
    """The block model behind a Cast to `elem_type` of a float32 input, with a `Constant` scale:
    what an exporter writes for a bfloat16 model fed float32."""
    inner = block_model(elem_type, dtype)
    scale = numpy_helper.from_array(np.array(0.5, np.float32).astype(dtype), "half")
    nodes = [
        helper.make_node("Cast", ["x"], ["x_cast"], to=elem_type),
        helper.make_node("Constant", [], ["half"], value=scale),
        helper.make_node("Mul", ["x_cast", "half"], ["x_in"]),
        *[
            helper.make_node(
                n.op_type,
                [v if v != "x" else "x_in" for v in n.input],
                n.output,
                **{a.name: helper.get_attribute_value(a) for a in n.attribute},
            )
            for n in inner.graph.node
        ],
    ]
    graph = helper.make_graph(
        nodes,
        "cast_block",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 32])],
        [helper.make_tensor_value_info("y", elem_type, [4, 32])],
        list(inner.graph.initializer),
    )
    return onnx_model(graph, opset=20)


def test_bfloat16_only_inside_a_subgraph_or_a_function_still_gets_the_twin():
    """A float32 model whose bfloat16 arithmetic sits in an If branch, or in a model-local
    function: ONNX Runtime has no bfloat16 Mul on a CPU, so only the twin runs (x * 0.5 exactly)."""
    half = numpy_helper.from_array(np.array(0.5, np.float32).astype(BFLOAT16), "half")
    body = [
        helper.make_node("Cast", ["x"], ["xb"], to=TensorProto.BFLOAT16),
        helper.make_node("Constant", [], ["half"], value=half),
        helper.make_node("Mul", ["xb", "half"], ["mb"]),
        helper.make_node("Cast", ["mb"], ["y_then"], to=TensorProto.FLOAT),
    ]
    then = helper.make_graph(
        body, "then", [], [helper.make_tensor_value_info("y_then", TensorProto.FLOAT, [4])]
    )
    other = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["y_else"])],
        "else",
        [],
        [helper.make_tensor_value_info("y_else", TensorProto.FLOAT, [4])],
    )
    vinfo = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])]
    out = [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])]
    branchy = onnx_model(
        helper.make_graph(
            [helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other)],
            "branchy",
            [*vinfo, helper.make_tensor_value_info("c", TensorProto.BOOL, [])],
            out,
        )
    )
    body[-1].output[0] = "y"
    halve = helper.make_function("local", "Halve", ["x"], ["y"], body, [helper.make_opsetid("", 17)])
    local = onnx_model(
        helper.make_graph([helper.make_node("Halve", ["x"], ["y"], domain="local")], "local", vinfo, out),
        extra_opsets=[("local", 1)],
    )
    local.functions.append(halve)
    x = np.array([1.0, -3.0, 1 / 3, 1e-3], np.float32)  # (1/3 and 1e-3 are no bfloat16)
    for model, feeds in [(branchy, {"x": x, "c": np.array(True)}), (local, {"x": x})]:
        assert check.has_bfloat16(model) and not check.has_bfloat16(check.float32_twin(model))
        assert np.array_equal(check.onnxruntime_outputs(model, feeds)["y"], x * np.float32(0.5))


def test_onnxruntime_declines_bfloat16_kernels_on_a_cpu():
    """(It has none: a session would fail to build for every candidate.)"""
    graph = korch.fission(block_model(TensorProto.BFLOAT16, BFLOAT16)).graph
    from korch.search.candidates import enumerate_candidates

    cand = enumerate_candidates(graph).candidates[0]
    reason = OnnxRuntimeBackend().supports(kernel_spec(graph, cand), "cpu")
    assert reason == "ONNX Runtime has no bfloat16 kernels on a CPU"


@pytest.mark.e2e
def test_a_bfloat16_plan_runs_verifies_saves_and_loads(onnx_plan, tmp_path):
    x = bf16(np.random.default_rng(2).standard_normal((4, 32)))
    (y,) = onnx_plan(x)
    assert y.dtype == BFLOAT16 and y.shape == (4, 32)
    assert check.rel_err(y, float32_oracle(x)) <= TOLERANCE
    assert onnx_plan.oracle == "ONNX Runtime (the float32 twin)"  # (it has no bfloat16 kernels on a CPU)
    assert onnx_plan.verify() <= TOLERANCE
    (tensor,) = onnx_plan(torch.from_numpy(x.view(np.int16)).view(torch.bfloat16))
    assert tensor.dtype == torch.bfloat16 and np.array_equal(to_numpy(tensor), y)
    loaded = korch.load(onnx_plan.save(tmp_path / "plan"))  # (the weights go through weights.npz)
    assert np.array_equal(loaded(x)[0], y)


def test_onnxruntime_as_a_bench_peer_says_it_cannot_run_a_bfloat16_model(onnx_plan):
    with pytest.raises(KorchError, match="^peer onnxruntime cannot run this model: .*NOT_IMPLEMENTED"):
        bench(onnx_plan, ("onnxruntime",), rounds=1)


def test_korch_run_reads_and_writes_bfloat16_arrays(onnx_plan, tmp_path, capsys):
    """numpy writes ml_dtypes' bfloat16 into an .npz as raw 2-byte records; korch reads them back
    as bfloat16, and writes its outputs the same way."""
    plan_dir = onnx_plan.save(tmp_path / "plan")
    x = bf16(np.random.default_rng(3).standard_normal((4, 32)))
    np.savez(tmp_path / "in.npz", x=x)
    assert (
        cli.main(
            [
                "run",
                str(plan_dir),
                "--inputs",
                str(tmp_path / "in.npz"),
                "--output",
                str(tmp_path / "out.npz"),
            ]
        )
        == 0
    )
    capsys.readouterr()
    written = np.load(tmp_path / "out.npz")["y"]
    assert written.dtype.itemsize == 2
    assert np.array_equal(written.view(BFLOAT16), onnx_plan(x)[0])


class Block(torch.nn.Module):
    """Attention and an MLP: LayerNorm, SDPA, GELU, softmax, residuals."""

    def __init__(self):
        super().__init__()
        self.norm = torch.nn.LayerNorm(32)
        self.attention = torch.nn.MultiheadAttention(32, 4, batch_first=True)
        self.up, self.down = torch.nn.Linear(32, 64), torch.nn.Linear(64, 32)

    def forward(self, x):
        h = self.norm(x)
        x = x + self.attention(h, h, h, need_weights=False)[0]
        return (x + self.down(torch.nn.functional.gelu(self.up(self.norm(x))))).softmax(-1)


@pytest.mark.e2e
def test_a_bfloat16_module_optimizes_to_a_plan_that_matches_eager(tmp_path):
    torch.manual_seed(0)
    module = Block().eval().to(torch.bfloat16)
    x = torch.randn(2, 8, 32, dtype=torch.bfloat16)
    plan = korch.optimize(
        module, (x,), backends=("inductor", "vendor"), cache=str(tmp_path / "p.sqlite"), **FAST
    )
    with torch.no_grad():
        want = to_numpy(module(x))
    (got,) = plan(x)
    assert got.dtype == torch.bfloat16
    assert check.rel_err(to_numpy(got), want) <= TOLERANCE
    assert plan.verify() <= TOLERANCE
    # FLOP rates are against the bfloat16 matmul's ceiling, measured beside fp32's
    report = explain.report(plan)
    peak = report["ceilings"]["gflops_bfloat16"]
    assert peak > 0 and "GFLOP/s bf16 matmul" in explain.text(report)
    rated = [k for k in report["kernels"] if k["flops"]]
    assert rated and all(k["flop_frac"] == round(k["gflops"] / peak, 4) for k in rated)


def test_a_float32_output_computed_from_bfloat16_is_checked_at_bfloat16s_tolerance():
    """A Mixtral layer's last kernel (cast to float32 for the final norm) differed from the
    reference by 2.3e-3, and float32's 1e-4 refused it."""
    from korch.ir.graph import GraphBuilder
    from korch.ir.prims import Prim, TensorType
    from korch.profile.jobs import check_kernel

    b = GraphBuilder()
    x = b.input("x", TensorType((4,), "bfloat16"))
    (y,) = b.emit(Prim.CAST, [x], to="float32")
    graph = b.build([y], ["y"])
    want = {"y": np.ones(4, np.float32)}
    assert check_kernel([torch.full((4,), 1.003)], want, graph) is None
    assert check_kernel([torch.full((4,), 1.1)], want, graph) == "wrong result: y relative error 0.1"
