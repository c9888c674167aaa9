"""The Python API: arguments checked like the CLI's flags (one-line KorchError), short Plan
reprs, and plan directories readable by others as the umask allows."""

import logging
import math
import os
import stat

import numpy as np
import onnx
import pytest
import torch
from helpers import onnx_model
from onnx import TensorProto, helper, numpy_helper

import korch
from korch.errors import KorchError, ShapeError
from korch.pipeline import OptimizeOptions
from korch.plan.plan import Plan

FAST = dict(progress=False, min_time=0.002, time_budget=20)


def _model(x_shape=(4, 16)) -> onnx.ModelProto:
    """Relu(x @ w), w 16x32."""
    w = numpy_helper.from_array(np.ones((16, 32), "float32"), "w")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Relu", ["m"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x_shape))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [w],
    )
    return onnx_model(graph)


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("api") / "m.onnx"
    onnx.save(_model(), path)
    return path


@pytest.fixture(scope="module")
def plan(model_path, tmp_path_factory):
    """Backends as one comma-separated string, as on the command line."""
    cache = tmp_path_factory.mktemp("cache") / "p.sqlite"
    return korch.optimize(model_path, backends="onnxruntime", cache=cache, **FAST)


# ------------------------------------------------------------------ argument checking


def test_backends_may_be_one_comma_separated_string(plan):
    assert OptimizeOptions(backends="onnxruntime, vendor").backends == ("onnxruntime", "vendor")
    assert OptimizeOptions(backends=["eager"]).backends == ("eager",)
    assert {k.backend for k in plan.kernels} == {"onnxruntime"}


@pytest.mark.parametrize("backends", [",,", "", [], 7])
def test_backends_naming_nothing_are_refused(backends):
    with pytest.raises(KorchError, match="backends"):
        OptimizeOptions(backends=backends)


@pytest.mark.parametrize("budget", [-1, math.nan, "10", True])
def test_a_bad_time_budget_is_refused(model_path, budget):
    with pytest.raises(KorchError, match="time_budget must be a number of seconds, at least 0"):
        korch.optimize(model_path, time_budget=budget)


@pytest.mark.parametrize("option", [{"max_size": 0}, {"jobs": 0}, {"executor": "slurm"}])
def test_other_bad_option_values_are_refused(option):
    with pytest.raises(KorchError, match=next(iter(option))):
        OptimizeOptions(**option)


def test_an_unknown_option_is_refused_by_name(model_path):
    with pytest.raises(KorchError, match=r"unknown options \['time_budjet'\]"):
        korch.optimize(model_path, time_budjet=5)


def test_cuda_without_a_cuda_device_is_a_korch_error(model_path, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    for model, inputs in ((model_path, None), (torch.nn.Linear(16, 32), torch.ones(4, 16))):
        with pytest.raises(KorchError, match="device 'cuda': no CUDA device is available"):
            korch.optimize(model, inputs, device="cuda")


@pytest.mark.parametrize("device", ["tpu", "cuda:x", "cpu:0", "CUDA"])
def test_an_unknown_device_is_refused(model_path, device):
    with pytest.raises(KorchError, match="device must be cpu, cuda or cuda:N"):
        korch.optimize(model_path, device=device)


def test_a_model_of_the_wrong_type_says_what_is_accepted():
    with pytest.raises(KorchError, match=r"an onnx.ModelProto\) or a torch.nn.Module with example_inputs"):
        korch.optimize(42)


def test_unpinned_dims_name_the_python_argument(tmp_path):
    with pytest.raises(ShapeError, match=r"shapes=\{'NAME': \(1, 3, 224, 224\)\} in Python"):
        korch.optimize(_model(("batch", 16)), cache=tmp_path / "p.sqlite", **FAST)


class _Records(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.records = []

    def emit(self, record):
        self.records.append(record)


def test_wrong_example_inputs_fail_in_one_line_without_log_spam():
    # torch's handler writes to the stderr it found at import (capfd cannot see it): watch records
    seen = _Records()
    logger = logging.getLogger("torch._subclasses.fake_tensor")
    level = logger.level
    logger.addHandler(seen)
    try:
        with pytest.raises(KorchError, match="torch.export failed: RuntimeError: a and b must have"):
            korch.optimize(torch.nn.Linear(16, 32), torch.ones(4, 17), **FAST)
    finally:
        logger.removeHandler(seen)
    assert [r.getMessage() for r in seen.records] == []
    assert logger.level == level  # restored


# ------------------------------------------------------------------ plans


def test_a_plan_repr_is_a_short_summary(plan):
    text = repr(plan)
    assert len(text) < 200, text
    assert text.startswith("Plan(device='cpu', kernels=")
    assert "x: f32[4,16]" in text and "outputs=[y]" in text and "predicted_ms=" in text
    assert all(len(repr(k)) < 200 for k in plan.kernels)


@pytest.mark.parametrize("umask, dir_mode, file_mode", [(0o022, 0o755, 0o644), (0o027, 0o750, 0o640)])
def test_a_saved_plan_follows_the_umask(tmp_path, umask, dir_mode, file_mode):
    old = os.umask(umask)
    try:
        target = Plan([], [], [], {"w": np.zeros(3, "float32")}).save(tmp_path / "plan")
        Plan([], [], [], {"w": np.ones(3, "float32")}).save(target)  # replacing a plan, too
    finally:
        os.umask(old)
    assert stat.S_IMODE(target.stat().st_mode) == dir_mode
    files = list(target.iterdir())
    assert files and all(stat.S_IMODE(f.stat().st_mode) == file_mode for f in files)


@pytest.mark.parametrize("umask, file_mode", [(0o022, 0o644), (0o027, 0o640)])
def test_a_saved_primitive_graph_follows_the_umask(tmp_path, umask, file_mode):
    b = korch.ir.graph.GraphBuilder()
    x = b.input("x", korch.TensorType((2, 300), "float32"))
    y = b.emit(korch.Prim.ADD, [x, b.const(np.ones((2, 300), "float32"))])[0]  # large: an .npz too
    old = os.umask(umask)
    try:
        written = korch.save_graph(b.build([y], ["y"]), tmp_path / "g.json")
    finally:
        os.umask(old)
    assert len(written) == 2 and all(stat.S_IMODE(f.stat().st_mode) == file_mode for f in written)


def test_an_index_outside_its_table_is_refused_before_any_kernel_runs(tmp_path):
    """Token ids index an embedding of 10 rows: 99 is the caller's mistake, named as such (an
    Inductor kernel failed on it with an assertion from its generated C++); -10 is ONNX's row 0."""
    from helpers import Const, one_node_model, rand

    table = rand(10, 4)
    model, _ = one_node_model("Gather", [Const(table), np.array([[1, 9]], dtype="int64")], {"axis": 0})
    plan = korch.optimize(model, cache=tmp_path / "p.sqlite", backends="onnxruntime", **FAST)
    assert plan.meta.index_limits == {plan.inputs[0][0]: 10}
    # (arrays run as they are; a masked array's min and max would skip the 99 ONNX Runtime reads)
    masked = np.ma.masked_array(np.array([[1, 99]], dtype="int64"), mask=[[False, True]])
    for bad in (np.array([[1, 99]], dtype="int64"), torch.tensor([[1, 99]]), masked):
        with pytest.raises(KorchError, match=r"values must be in \[-10, 10\), got 1\.\.99"):
            plan(bad)
    (got,) = plan(np.array([[-10, 9]], dtype="int64"))
    np.testing.assert_array_equal(got, table[[[0, 9]]])
