"""Mish made cheaper (korch.rewrite.mish): wherever the importers wrote Mish, the rewritten graph
computes torch's Mish (in float64, the oracle) with neither a log nor a tanh left; nothing else is
touched. (OpenVINO is still written one Mish operator: tests/backends/test_openvino.py.)"""

import numpy as np
import pytest
import torch
from helpers import rand
from onnx import TensorProto, helper

import korch
from korch.frontend.torch.importer import import_torch
from korch.ir import reference
from korch.ir.prims import Prim
from korch.rewrite import cheaper_mish, rewrite

WIDE = dict(low=-60, high=60)  # exp overflows at one end, vanishes at the other; past the cap


def mish(x: np.ndarray) -> np.ndarray:
    return torch.nn.functional.mish(torch.from_numpy(x).double()).numpy()


def onnx_graph(nodes, dtype=TensorProto.FLOAT, shape=(2, 3, 8, 8)):
    vi = helper.make_tensor_value_info
    graph = helper.make_graph(nodes, "g", [vi("x", dtype, shape)], [vi("y", dtype, shape)])
    return korch.fission(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])).graph


MISH = [helper.make_node("Mish", ["x"], ["y"])]
EXPORTED = [  # torch.onnx's spelling (the zoo's YOLOv4)
    helper.make_node("Softplus", ["x"], ["s"]),
    helper.make_node("Tanh", ["s"], ["t"]),
    helper.make_node("Mul", ["x", "t"], ["y"]),
]


def transcendentals(graph) -> list[str]:
    return sorted(n.prim.value for n in graph.nodes if n.prim in (Prim.EXP, Prim.LOG, Prim.TANH))


@pytest.mark.parametrize("nodes", [MISH, EXPORTED], ids=["Mish", "Softplus-Tanh-Mul"])
def test_onnx_mish_becomes_one_exp_and_computes_torchs_mish(nodes):
    graph = onnx_graph(nodes)
    assert transcendentals(graph) == ["exp", "log", "tanh"]
    rewritten, notes = cheaper_mish(graph)
    assert len(notes) == 1 and transcendentals(rewritten) == ["exp"]
    x = rand(2, 3, 8, 8, seed=1, **WIDE)
    (got,) = reference.run(rewritten, {"x": x}).values()
    np.testing.assert_allclose(got, mish(x), rtol=1e-6, atol=1e-30)
    (before,) = reference.run(graph, {"x": x}).values()  # the form it replaces: absolute error only
    assert np.abs(got - mish(x)).max() <= np.abs(before - mish(x)).max() + 1e-7


@pytest.mark.parametrize("dtype", ["float16", "float64"])
def test_other_float_dtypes_keep_their_range(dtype):
    """float16's cap keeps n * (n + 2) finite; float64's the ratio 1 past it."""
    graph = onnx_graph(MISH, helper.np_dtype_to_tensor_dtype(np.dtype(dtype)))
    rewritten, _ = cheaper_mish(graph)
    x = rand(2, 3, 8, 8, seed=2, low=-20, high=20, dtype=dtype)
    (got,) = reference.run(rewritten, {"x": x}).values()
    assert got.dtype == np.dtype(dtype) and np.isfinite(got).all()
    tolerance = {"float16": 2e-3, "float64": 1e-13}[dtype]
    np.testing.assert_allclose(got, mish(x), rtol=tolerance, atol=tolerance)


def test_torch_mish_inside_a_model_is_rewritten_by_optimize_s_rewrites():
    class ConvMish(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = torch.nn.Conv2d(3, 4, 3, padding=1)

        def forward(self, x):
            return torch.nn.functional.mish(self.conv(x)) + 1

    torch.manual_seed(0)
    module, x = ConvMish().eval(), torch.randn(1, 3, 8, 8) * 20
    graph, notes = rewrite(import_torch(module, (x,)).graph)
    assert any("Mish as one exp" in note for note in notes) and transcendentals(graph) == ["exp"]
    (got,) = reference.run(graph, {graph.inputs[0]: x.numpy()}).values()
    with torch.no_grad():
        want = module.double()(x.double()).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_a_softplus_read_elsewhere_is_left_alone():
    """The softplus is read again: removing the pattern would not save its work."""
    nodes = [*EXPORTED[:2], helper.make_node("Mul", ["x", "t"], ["m"])]
    nodes.append(helper.make_node("Add", ["m", "s"], ["y"]))
    graph = onnx_graph(nodes)
    rewritten, notes = cheaper_mish(graph)
    assert notes == [] and rewritten is graph
