"""The runtime's outputs and inputs: every output a caller receives is a buffer of its own (never
a plan weight, the caller's input, or another output), checked against ONNX Runtime; inputs that
are not arrays are refused with a one-line error naming them."""

import warnings

import numpy as np
import onnxruntime as ort
import pytest
import torch
from helpers import onnx_model
from onnx import TensorProto, helper, numpy_helper

import korch
from korch.errors import KorchError
from korch.orchestrate.solver import Choice, Solution
from korch.plan.plan import build_plan
from korch.search.candidates import make_candidate

F = TensorProto.FLOAT
X = helper.make_tensor_value_info("x", F, [2, 3])


def info(name, shape):
    return helper.make_tensor_value_info(name, F, shape)


def model(nodes, outputs, inits=(), inputs=(X,)):
    return onnx_model(helper.make_graph(nodes, "g", list(inputs), outputs, list(inits)))


C = numpy_helper.from_array(np.arange(6, dtype=np.float32).reshape(2, 3) + 1, "c")
K = numpy_helper.from_array(np.array([1.5, 2.5], np.float32))
SHAPE = numpy_helper.from_array(np.array([3, 2], np.int64), "s")
RELU = helper.make_node("Relu", ["x"], ["y"])

MODELS = {
    "initializer": model([RELU], [info("y", [2, 3]), info("c", [2, 3])], [C]),
    "constant_node": model(
        [RELU, helper.make_node("Constant", [], ["k"], value=K)], [info("y", [2, 3]), info("k", [2])]
    ),
    "input_passed_through": model([RELU], [info("y", [2, 3]), info("x", [2, 3])]),
    "input_only": model([], [info("x", [2, 3])]),
    "same_output_twice": model([RELU], [info("y", [2, 3]), info("y", [2, 3])]),
    "output_and_its_identity": model(
        [RELU, helper.make_node("Identity", ["y"], ["z"])], [info("y", [2, 3]), info("z", [2, 3])]
    ),
    # an eager kernel's reshape is a view of what it reads: the caller's input, or another output
    "reshape_of_input": model([helper.make_node("Reshape", ["x", "s"], ["r"])], [info("r", [3, 2])], [SHAPE]),
    "output_and_its_reshape": model(
        [RELU, helper.make_node("Reshape", ["y", "s"], ["r"])],
        [info("y", [2, 3]), info("r", [3, 2])],
        [SHAPE],
    ),
}


def plan_for(onnx_model_, backend, split):
    """A plan of the whole graph as one kernel, or of one kernel per primitive (no profiling)."""
    graph = korch.fission(onnx_model_).graph
    groups = [[i] for i in range(len(graph.nodes))] if split else [range(len(graph.nodes))]
    chosen = [Choice(make_candidate(graph, g), backend, 1.0) for g in groups if len(g)]
    return build_plan(graph, Solution(chosen), "cpu")


def onnxruntime_outputs(onnx_model_, x):
    session = ort.InferenceSession(onnx_model_.SerializeToString(), providers=["CPUExecutionProvider"])
    return [np.array(o, copy=True) for o in session.run(None, {"x": x})]  # (it may share them too)


def assert_equal(got, want):
    assert len(got) == len(want)
    for g, w in zip(got, want):
        np.testing.assert_array_equal(np.asarray(g), w)


def assert_numpy_outputs_are_their_own(plan, want, x):
    kept = x.copy()
    weights = [w.numpy() for w in plan.executable().weights.values()]
    outs = plan(x)
    assert_equal(outs, want)
    for i, out in enumerate(outs):
        assert not np.shares_memory(out, x), f"output {i} is the caller's input"
        assert not any(np.shares_memory(out, w) for w in weights), f"output {i} is a plan weight"
        assert not any(np.shares_memory(out, o) for o in outs[:i]), f"output {i} is another output"
    for out in outs:
        out[...] = 999
    np.testing.assert_array_equal(x, kept)
    assert_equal(plan(x), want)


def memory(t):
    return t.untyped_storage().data_ptr()


def assert_tensor_outputs_are_their_own(plan, want, x, run):
    tx = torch.from_numpy(x.copy())
    weights = {memory(w) for w in plan.executable().weights.values()}
    outs = run(tx)
    assert_equal([o.numpy() for o in outs], want)
    places = [memory(o) for o in outs]
    assert len(set(places)) == len(places), "two outputs share memory"
    assert memory(tx) not in places, "an output is the caller's input"
    assert not weights & set(places), "an output is a plan weight"
    for out in outs:
        out.add_(5)
    np.testing.assert_array_equal(tx.numpy(), x)
    assert_equal([o.numpy() for o in run(tx)], want)


VIEWS = {"reshape_of_input", "output_and_its_reshape"}  # (ONNX Runtime kernels never return views)
CASES = [
    (name, backend)
    for name in MODELS
    for backend in ("eager", "onnxruntime")
    if name not in VIEWS or backend == "eager"
]


@pytest.mark.parametrize("split", [False, True], ids=["one_kernel", "kernel_per_primitive"])
@pytest.mark.parametrize("name,backend", CASES)
def test_each_output_is_a_buffer_of_its_own(name, backend, split):
    x = np.arange(6, dtype=np.float32).reshape(2, 3) - 2
    plan = plan_for(MODELS[name], backend, split)
    want = onnxruntime_outputs(MODELS[name], x)
    assert_numpy_outputs_are_their_own(plan, want, x)
    assert_tensor_outputs_are_their_own(plan, want, x, plan)
    # what torch.compile's backend calls
    exe = plan.executable()
    assert_tensor_outputs_are_their_own(plan, want, x, lambda t: exe.run_tensors(exe.feeds((t,), {})))


def test_an_optimized_and_reloaded_plan_keeps_its_weights(tmp_path):
    """The reported case: an initializer output, written to by the caller, came back written."""
    from korch.pipeline import OptimizeOptions, optimize

    options = OptimizeOptions(
        backends=("onnxruntime",),
        jobs=1,
        time_budget=2,
        min_time=0.002,
        cache=tmp_path / "db.sqlite",
        progress=False,
    )
    plan = optimize(MODELS["initializer"], options=options)
    x = np.ones((2, 3), np.float32)
    want = onnxruntime_outputs(MODELS["initializer"], x)
    for p in (plan, korch.load(plan.save(tmp_path / "plan"))):
        assert_numpy_outputs_are_their_own(p, want, x)
        assert_tensor_outputs_are_their_own(p, want, x, p)


@pytest.mark.parametrize("backend", ["eager", "onnxruntime"])
def test_a_kernels_fresh_output_is_returned_without_a_copy(backend):
    plan = plan_for(MODELS["same_output_twice"], backend, split=False)
    exe = plan.executable()
    made = []

    def recording(fn):
        def run(*args):
            outs = fn(*args)
            made.extend(outs)
            return outs

        return run

    exe.steps = [(recording(fn), *rest) for fn, *rest in exe.steps]
    first, second = exe.run_tensors(exe.feeds((np.ones((2, 3), np.float32),), {}))
    assert len(made) == 1 and first is made[0]  # the kernel's own buffer; only the repeat is copied
    assert memory(second) != memory(first)


TWO_INPUTS = model(
    [helper.make_node("Add", ["x", "m"], ["y"])], [info("y", [2, 3])], inputs=(X, info("m", [2, 3]))
)
JUNK = [None, "abc", b"abc", {"a": 1}, {1, 2}, object(), np.array([["a"] * 3] * 2), [[1.0, 2.0], [3.0]]]


@pytest.mark.parametrize("junk", JUNK, ids=lambda v: type(v).__name__ if v is not None else "None")
def test_an_input_that_is_not_an_array_is_named(junk):
    plan = plan_for(TWO_INPUTS, "onnxruntime", split=False)
    m = np.ones((2, 3), np.float32)
    for call in (lambda: plan(junk, m), lambda: plan(x=junk, m=m), lambda: plan(m, junk)):
        with pytest.raises(KorchError) as raised:
            call()
        text = str(raised.value)
        assert "\n" not in text and "float32[2, 3]" in text, text
        assert "input 'x'" in text or "input 'm'" in text, text
    with pytest.raises(KorchError, match=r"input 'x' is None, not an array"):
        plan(None, m)
    np.testing.assert_array_equal(plan(m, m)[0], 2 * m)  # the plan still runs


class ReturnsItsBufferAndInput(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("b", torch.arange(6.0).reshape(2, 3))

    def forward(self, x):
        return x.relu(), self.b, x, x.reshape(3, 2)


def test_a_torch_modules_plan_returns_buffers_of_its_own(tmp_path):
    module = ReturnsItsBufferAndInput().eval()
    x = torch.arange(6.0).reshape(2, 3) - 2
    options = dict(
        backends=("onnxruntime",), max_size=3, time_budget=5, jobs=1, min_time=0.002, progress=False
    )
    plan = korch.optimize(module, (x,), cache=str(tmp_path / "db.sqlite"), **options)
    with torch.no_grad():
        want = [t.clone().numpy() for t in module(x)]
    assert_numpy_outputs_are_their_own(plan, want, x.numpy().copy())
    assert_tensor_outputs_are_their_own(plan, want, x.numpy().copy(), plan)


def test_a_transposed_weight_reaches_its_kernel_dense_without_a_copy_per_call():
    """Gemm's transB makes the import's weight a Fortran-order view; an Inductor kernel, compiled
    for dense inputs, copied it in every call (EfficientViT's classifier: 2.8 ms of 17.7)."""
    w = numpy_helper.from_array(np.arange(12, dtype=np.float32).reshape(4, 3) / 7, "w")
    gemm = model([helper.make_node("Gemm", ["x", "w"], ["y"], transB=1)], [info("y", [2, 4])], [w])
    plan = plan_for(gemm, "inductor", split=False)
    exe = plan.executable()
    assert any(not np.asarray(a).flags["C_CONTIGUOUS"] for a in plan.weights.values())  # the case
    assert all(t.is_contiguous() for t in exe.weights.values())
    x = np.linspace(-1, 1, 6, dtype=np.float32).reshape(2, 3)
    np.testing.assert_allclose(exe(x)[0], onnxruntime_outputs(gemm, x)[0], rtol=1e-6)


def _read_only(a):
    a = a.copy()
    a.flags.writeable = False
    return a


# arrays whose memory a tensor cannot share as it is (and a strided one it can)
LAYOUTS = {
    "reversed": lambda a: np.ascontiguousarray(a[::-1])[::-1],  # negative strides
    "big_endian": lambda a: a.astype(">f4"),
    "read_only": _read_only,
    "every_other_column": lambda a: np.repeat(a, 2, axis=1)[:, ::2],
    "fortran_order": np.asfortranarray,
}


@pytest.mark.parametrize("backend", ["eager", "onnxruntime"])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_an_input_in_any_numpy_layout_is_taken_by_value(layout, backend):
    """x[::-1] and a big-endian array were refused ("is a numpy array of float32, not an array")."""
    x = np.linspace(-2, 3, 6, dtype=np.float32).reshape(2, 3)
    m = np.arange(6, dtype=np.float32).reshape(2, 3)
    given = LAYOUTS[layout](x)
    np.testing.assert_array_equal(given, x)  # (the same values)
    plan = plan_for(TWO_INPUTS, backend, split=False)
    want = ort.InferenceSession(TWO_INPUTS.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"x": x, "m": m}
    )
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # (torch warns of a read-only array it would share)
        got = plan(given, m)
    assert_equal(got, want)
    np.testing.assert_array_equal(given, x)  # untouched


@pytest.mark.parametrize("split", [False, True], ids=["one_kernel", "kernel_per_primitive"])
def test_a_plan_of_onnxruntime_sessions_runs_a_numpy_callers_arrays_as_they_are(split):
    """Converting each value to a tensor and back cost 24 us a call around a 13 us session: a
    plan whose every kernel is ONNX Runtime on a CPU runs arrays in, arrays out (the tensor form of
    its kernels is never called), and falls back to converting a value it cannot pass as it is."""
    graph = model(
        [helper.make_node("Add", ["x", "m"], ["s"]), helper.make_node("Tanh", ["s"], ["y"])],
        [info("y", [2, 3]), info("s", [2, 3])],
        inputs=(X, info("m", [2, 3])),
    )
    x = np.linspace(-2, 3, 6, dtype=np.float32).reshape(2, 3)
    m = np.arange(6, dtype=np.float32).reshape(2, 3) / 4
    session = ort.InferenceSession(graph.SerializeToString(), providers=["CPUExecutionProvider"])
    want = session.run(None, {"x": x, "m": m})
    exe = plan_for(graph, "onnxruntime", split).executable()
    tensor_calls = []

    def counting(fn):
        def run(*args):
            tensor_calls.append(fn)
            return fn(*args)

        return run

    exe.steps = [(counting(fn), *rest) for fn, *rest in exe.steps]
    assert exe.array_feeds((x, m), {}) is not None
    for call in (lambda: exe(x, m), lambda: exe.caller({"x": x, "m": m})(), lambda: exe(x=x, m=m)):
        got = call()
        assert_equal(got, want)
        assert all(isinstance(g, np.ndarray) for g in got) and not tensor_calls
        assert not any(np.shares_memory(g, a) for g in got for a in (x, m))
    # (ONNX Runtime would read a big-endian array's bytes as they are)
    assert exe.array_feeds((x.astype(">f4"), m), {}) is None
    assert_equal(exe(x.astype(">f4"), m), want)
    assert tensor_calls  # converted
    assert_equal([t.numpy() for t in exe(torch.from_numpy(x), torch.from_numpy(m))], want)
    with pytest.raises(KorchError, match=r"input 'x' is float64\[2, 3\], the plan wants float32\[2, 3\]"):
        exe(x.astype(np.float64), m)
    with pytest.raises(KorchError, match=r"inputs do not match the plan"):
        exe(x, q=m)


def test_a_plan_with_a_kernel_that_is_not_onnxruntime_converts_arrays():
    nodes = [helper.make_node("Add", ["x", "x"], ["s"]), helper.make_node("Tanh", ["s"], ["y"])]
    graph = model(nodes, [info("y", [2, 3])])
    prims = korch.fission(graph).graph
    assert len(prims.nodes) == 2
    for backends in (("eager", "onnxruntime"), ("onnxruntime", "eager")):
        chosen = [Choice(make_candidate(prims, [i]), b, 1.0) for i, b in enumerate(backends)]
        exe = build_plan(prims, Solution(chosen), "cpu").executable()
        x = np.linspace(-1, 1, 6, dtype=np.float32).reshape(2, 3)
        assert exe.array_feeds((x,), {}) is None
        want = onnxruntime_outputs(graph, x)[0]
        np.testing.assert_allclose(exe(x)[0], want, rtol=1e-6)  # (tanh's last bit differs)
