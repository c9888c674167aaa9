"""Every backend against the reference executor on small kernels, on CPU."""

import math
import subprocess
import sys

import numpy as np
import pytest
import torch
from helpers import Const, one_node_model, rand

import korch
from korch.backends import get_backends
from korch.backends.inductor import InductorBackend
from korch.backends.onnxrt import OnnxRuntimeBackend
from korch.backends.vendor import VendorBackend
from korch.ir import reference, tensors
from korch.ir.graph import GraphBuilder
from korch.ir.prims import Prim
from korch.ir.tensor_type import TensorType
from korch.ir.tensors import to_tensor
from korch.profile.jobs import check_kernel
from korch.search.candidates import make_candidate
from korch.search.kernel import KernelSpec, kernel_spec

CASES = {
    "softmax": ("Softmax", [rand(4, 33)], {"axis": -1}, 13),
    "layernorm": (
        "LayerNormalization",
        [rand(2, 5, 16), Const(rand(16, seed=1)), Const(rand(16, seed=2))],
        {},
        17,
    ),
    "gelu": ("Gelu", [rand(3, 40)], {}, 20),
    "mish": ("Mish", [rand(3, 40)], {}, 18),
    "conv_bias": (
        "Conv",
        [rand(1, 3, 9, 9), Const(rand(4, 3, 3, 3, seed=1)), Const(rand(4, seed=2))],
        {"pads": [1, 1, 1, 1]},
        13,
    ),
    "conv_asym": (
        "Conv",
        [rand(1, 4, 9, 9), Const(rand(4, 2, 3, 3, seed=1))],
        {"pads": [0, 1, 2, 1], "group": 2, "strides": [2, 1]},
        13,
    ),
    "conv_transpose": (
        "ConvTranspose",
        [rand(1, 3, 4, 4), Const(rand(3, 2, 3, 3, seed=1))],
        {"strides": [2, 2], "pads": [1, 0, 1, 1], "output_padding": [1, 1]},
        13,
    ),
    "gemm_bias": ("Gemm", [rand(5, 8), Const(rand(8, 6, seed=1)), Const(rand(6, seed=2))], {}, 13),
    "matmul_batched": ("MatMul", [rand(2, 3, 5, 8), rand(2, 3, 8, 4, seed=1)], {}, 13),
    "maxpool": (
        "MaxPool",
        [rand(1, 2, 9, 9)],
        {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]},
        13,
    ),
    "avgpool": ("AveragePool", [rand(1, 2, 9, 9)], {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}, 13),
    # pools that torch's pools take only with explicit padding, or in 1 and 3 dimensions
    "maxpool_spp": ("MaxPool", [rand(1, 4, 13, 13)], {"kernel_shape": [13, 13], "pads": [6, 6, 6, 6]}, 13),
    "maxpool_uneven_dilated": (
        "MaxPool",
        [rand(1, 2, 11, 10)],
        {"kernel_shape": [3, 2], "pads": [0, 1, 2, 0], "dilations": [2, 1], "strides": [1, 2]},
        13,
    ),
    "maxpool_ceil_1d": (
        "MaxPool",
        [rand(1, 3, 10)],
        {"kernel_shape": [3], "strides": [2], "ceil_mode": 1},
        13,
    ),
    "avgpool_wide_pads_3d": (
        "AveragePool",
        [rand(1, 2, 5, 6, 7)],
        {"kernel_shape": [4, 3, 2], "pads": [3, 1, 1, 2, 1, 1], "count_include_pad": 1},
        13,
    ),
    "lppool": ("LpPool", [rand(1, 2, 9, 9)], {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1], "p": 3}, 18),
    "grid_sample": (
        "GridSample",
        [rand(1, 2, 5, 6), rand(1, 3, 4, 2, seed=1) * 1.2],
        {"padding_mode": "reflection"},
        16,
    ),
    "gru": (
        "GRU",
        [
            rand(3, 2, 4),
            Const(rand(1, 9, 4, seed=1)),
            Const(rand(1, 9, 3, seed=2)),
            Const(rand(1, 18, seed=3)),
        ],
        {"hidden_size": 3},
        14,
    ),
    "slice_neg": (
        "Slice",
        [
            rand(5, 6),
            Const(np.array([4, -1], "int64")),
            Const(np.array([0, -100], "int64")),
            Const(np.array([0, 1], "int64")),
            Const(np.array([-1, -2], "int64")),
        ],
        {},
        13,
    ),
    "pad_reflect": (
        "Pad",
        [rand(2, 5, 6), Const(np.array([0, 1, 2, 0, 2, 1], "int64"))],
        {"mode": "reflect"},
        13,
    ),
    "pad_edge": ("Pad", [rand(2, 5, 6), Const(np.array([0, 1, 2, 0, 2, 1], "int64"))], {"mode": "edge"}, 13),
    "gather": ("Gather", [Const(rand(10, 4)), np.array([[1, 9], [0, -3]], "int64")], {"axis": 0}, 13),
    "gather_scalar": ("Gather", [rand(3, 4, 5), Const(np.array(1, "int64"))], {"axis": 0}, 13),
    "resize": (
        "Resize",
        [rand(1, 2, 4, 5), None, Const(np.array([1, 1, 2, 1.5], "float32"))],
        {"mode": "linear"},
        13,
    ),
    "reduce_prod": ("ReduceProd", [rand(3, 4, 5, low=0.5, high=1.5)], {"axes": [0, 2]}, 13),
    "argmax": ("ArgMax", [rand(3, 7)], {"axis": 1}, 13),
    "cast_where": ("Where", [rand(3, 4, dtype="bool"), rand(3, 4), rand(4, seed=3)], {}, 16),
    "int_div": (
        "Div",
        [rand(3, 4, dtype="int64", low=-20, high=20), rand(4, dtype="int64", seed=5, low=1, high=6)],
        {},
        13,
    ),
    "concat": ("Concat", [rand(2, 3), rand(2, 5, seed=1)], {"axis": 1}, 13),
    "scatter_elements_add": (
        "ScatterElements",
        [rand(3, 5), np.array([[0, 2, -1], [1, 1, 0]], "int64"), rand(2, 3, seed=1)],
        {"axis": 0, "reduction": "add"},
        18,
    ),
    "scatter_nd_max": (
        "ScatterND",
        [rand(4, 5, 6), np.array([[1], [3], [1]], "int64"), rand(3, 5, 6, seed=1)],
        {"reduction": "max"},
        18,
    ),
    "scatter_nd": ("ScatterND", [rand(4, 5), np.array([[2], [0]], "int64"), rand(2, 5, seed=1)], {}, 13),
    "top_k": ("TopK", [rand(3, 9), Const(np.array([4], "int64"))], {"axis": 1, "largest": 0}, 11),
    "einsum": ("Einsum", [rand(2, 3, 4), rand(2, 4, 5, seed=1)], {"equation": "bij,bjk->bik"}, 12),
}


def _case_model(case):
    op, inputs, attrs, opset = CASES[case]
    out_dtypes = {"ArgMax": ["int64"], "TopK": ["float32", "int64"]}.get(op, ["float32"])
    out_dtypes = ["int64"] if case == "int_div" else out_dtypes
    return one_node_model(op, inputs, attrs, opset, n_outputs=len(out_dtypes), out_dtypes=out_dtypes)


def _whole_graph_spec(case):
    model, feeds = _case_model(case)
    graph = korch.fission(model).graph
    spec = kernel_spec(graph, make_candidate(graph, range(len(graph.nodes))))
    env = dict(graph.constants)
    env.update(feeds)
    inputs = [env[v] for v in spec.inputs]
    want = reference.run(spec.graph, dict(zip(spec.graph.inputs, inputs)))
    return spec, inputs, want


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("backend", ["onnxruntime", "vendor", "inductor"])
def test_backend_matches_reference(case, backend):
    (b,) = get_backends([backend])
    spec, inputs, want = _whole_graph_spec(case)
    reason = b.supports(spec, "cpu")
    if reason is not None:
        # an average pool that does not count its padding divides by a per-position count; an
        # Lp pool sums powers over its windows: neither is an ONNX pool
        assert backend != "onnxruntime" or case in ("avgpool", "lppool") and "window" in reason, reason
        return
    compiled = b.compile(spec, "cpu")
    outs = compiled.fn(*[to_tensor(x) for x in inputs])
    assert check_kernel(outs, want, spec.graph) is None
    assert compiled.kernels >= 1


def test_float32_stays_ieee_float32_where_korch_runs():
    """cuDNN's default TF32 convolutions (on by default in torch) would miss the 1e-4 checks on a
    GPU, and peers timed beside korch would run other arithmetic; a fresh process, so no test
    before this one decides."""
    probe = "import korch.cli.bench, torch\nprint(torch.backends.cudnn.allow_tf32)\n"
    probe += "print(torch.backends.cuda.matmul.allow_tf32)"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]


@pytest.mark.parametrize("case", list(CASES))
def test_eager_runs_every_single_primitive_like_the_reference(case):
    """Each primitive of the case's graph alone, on the activations the whole graph computes."""
    (b,) = get_backends(["eager"])
    model, feeds = _case_model(case)
    graph = korch.fission(model).graph
    env = _all_values(graph, feeds)
    for i in range(len(graph.nodes)):
        spec = kernel_spec(graph, make_candidate(graph, [i]))
        assert b.supports(spec, "cpu") is None
        args = [env[v] for v in spec.inputs]
        want = reference.run(spec.graph, dict(zip(spec.graph.inputs, args)))
        outs = b.compile(spec, "cpu").fn(*[to_tensor(x) for x in args])
        assert check_kernel(outs, want, spec.graph) is None, graph.nodes[i].prim
        assert all(o.is_contiguous() for o in outs)


def _all_values(graph, feeds):
    """Every value of the graph: constants, inputs and each node's outputs (numpy reference)."""
    env = dict(graph.constants)
    env.update(feeds)
    for node in graph.nodes:
        spec_inputs = [env[v] for v in node.inputs]
        outs = node.prim.ref(spec_inputs, node.a)
        env.update(zip(node.outputs, outs))
    return env


def test_eager_reflect_padding_makes_its_indices_once():
    """A copy of host indices in every call would wait for the device and break CUDA graph capture."""
    from korch.backends import torch_ops

    spec, inputs, want = _whole_graph_spec("pad_reflect")
    (pad,) = [i for i, n in enumerate(spec.graph.nodes) if n.prim.value == "pad"]
    single = kernel_spec(spec.graph, make_candidate(spec.graph, [pad]))
    fn = get_backends(["eager"])[0].compile(single, "cpu").fn
    x = to_tensor(inputs[0])
    fn(x)
    made = torch_ops._pad_index.cache_info().misses
    torch.testing.assert_close(fn(x)[0], fn(x * 1)[0])
    assert torch_ops._pad_index.cache_info().misses == made


def test_eager_refuses_fusions_and_is_a_default_on_cuda_only():
    spec, _, _ = _whole_graph_spec("softmax")
    (eager,) = get_backends(["eager"])
    assert "single primitives" in eager.supports(spec, "cpu")
    assert "eager" not in [b.name for b in get_backends(None, "cpu")]
    cuda = ["inductor", "inductor-frozen", "inductor-autotune", "vendor", "eager", "onnxruntime"]
    assert [b.name for b in get_backends(None, "cuda")] == cuda


def test_vendor_takes_linear_with_bias_only():
    spec, _, _ = _whole_graph_spec("conv_bias")
    assert VendorBackend().supports(spec, "cpu") is None
    spec, _, _ = _whole_graph_spec("softmax")
    assert VendorBackend().supports(spec, "cpu") is not None


def test_inductor_fuses_softmax_into_few_kernels():
    spec, inputs, want = _whole_graph_spec("softmax")
    compiled = InductorBackend().compile(spec, "cpu")
    assert compiled.kernels <= 2  # one or two loops, not seven primitives
    assert check_kernel(compiled.fn(*[torch.as_tensor(x) for x in inputs]), want, spec.graph) is None


# ("avgpool" does not count its padding: it divides by a count per position, and stays a window;
# "lppool" sums powers, which no aten pool does)
@pytest.mark.parametrize("case", [c for c in CASES if "pool" in c and c not in ("avgpool", "lppool")])
def test_inductor_gets_a_pool_as_aten_pool_not_a_window_loop(case):
    """Inductor compiles window + reduce as a loop over the window per output element (YOLOX's
    13x13 max pool: 13 ms against 1 as a pool), so a pool's primitives reach it as one aten pool."""
    from torch.fx.experimental.proxy_tensor import make_fx

    from korch.backends.torch_ops import graph_function

    spec, inputs, want = _whole_graph_spec(case)
    fn = graph_function(spec.graph)
    args = [to_tensor(x) for x in inputs]
    ops = {str(n.target) for n in make_fx(fn)(*args).graph.nodes if n.op == "call_function"}
    assert any("pool" in op for op in ops) and not any("unfold" in op for op in ops), ops
    assert check_kernel(fn(*args), want, spec.graph) is None


@pytest.fixture
def wrappers(monkeypatch) -> list[str]:
    """The wrapper ("cpp" or "python") of each Inductor kernel compiled from now on in this test."""
    from korch.backends import inductor

    kinds, count_launches = [], inductor.count_launches

    def spied(source: str) -> int:
        kinds.append("cpp" if "void inductor_entry_impl(" in source else "python")
        return count_launches(source)

    monkeypatch.setattr(inductor, "count_launches", spied)
    return kinds


def test_inductor_counts_the_launches_of_its_cpp_wrapper_as_of_a_python_one(monkeypatch, wrappers):
    """On CPU korch's larger Inductor kernels are called by a C++ wrapper; its launches are counted
    as the same kernel's Python wrapper counts them (its own kernels and the library calls)."""
    from korch.backends import compile_with, inductor

    counted = {}
    for smallest in (0, math.inf):  # (every kernel with the C++ wrapper, then none)
        monkeypatch.setattr(inductor, "CPP_WRAPPER_FROM", smallest)
        for case in ("softmax", "conv_bias", "mish"):
            spec, inputs, want = _whole_graph_spec(case)
            weights = {spec.graph.inputs[i]: inputs[i] for i in spec.weights}
            for backend in get_backends(["inductor", "inductor-frozen"]):
                if backend.supports(spec, "cpu") is None:
                    compiled = compile_with(backend, spec, "cpu", weights)
                    assert check_kernel(compiled.fn(*map(to_tensor, inputs)), want, spec.graph) is None
                    counted.setdefault((case, backend.name), []).append(compiled.kernels)
    assert set(wrappers) == {"cpp", "python"}
    assert ("conv_bias", "inductor-frozen") in counted
    assert all(cpp == python for cpp, python in counted.values()), counted


def test_inductor_calls_a_large_kernels_kernels_from_cpp_on_cpu(wrappers):
    """A chain of CPP_WRAPPER_FROM primitives compiles with Inductor's C++ wrapper, one fewer with
    its Python wrapper; both compute what the reference does."""
    from korch.config import CPP_WRAPPER_FROM

    for length in (CPP_WRAPPER_FROM - 1, CPP_WRAPPER_FROM):
        b = GraphBuilder()
        v = b.input("in0", TensorType((4, 8), "float32"))
        for _ in range(length):
            (v,) = b.emit(Prim.NEG, [v])
        graph = b.build([v], ["out0"])
        spec = KernelSpec("chain", graph, graph.inputs, graph.outputs)
        x = rand(4, 8)
        want = reference.run(spec.graph, {spec.graph.inputs[0]: x})
        assert check_kernel(InductorBackend().compile(spec, "cpu").fn(to_tensor(x)), want, spec.graph) is None
    assert wrappers == ["python", "cpp"]


def test_inductor_compiles_inside_a_tracing_context_with_a_fake_mode():
    """As when korch is called from a torch.compile backend: the context's fake mode must not
    be adopted by korch's tracing, which holds real constants (Mish's threshold and one)."""
    from torch._guards import TracingContext, tracing
    from torch._subclasses.fake_tensor import FakeTensorMode

    spec, inputs, want = _whole_graph_spec("mish")
    with tracing(TracingContext(FakeTensorMode())):
        compiled = InductorBackend().compile(spec, "cpu")
    assert check_kernel(compiled.fn(*[torch.as_tensor(x) for x in inputs]), want, spec.graph) is None


def test_inductor_compiles_a_kernel_again_from_its_disk_cache_and_keeps_baked_constants_apart():
    """A kernel compiled again (by the timing worker, for the plan measured in place, for a plan
    reloaded) is a hit in Inductor's FX graph cache instead of being lowered again; two kernels
    that differ only in a baked constant's values still compute their own results."""
    from torch._dynamo.utils import counters

    kernels = []
    for seed in (1, 2):
        model, feeds = one_node_model("Add", [rand(4, 8), Const(rand(1, seed=seed))], {}, 13)
        graph = korch.fission(model).graph
        spec = kernel_spec(graph, make_candidate(graph, range(len(graph.nodes))))
        assert spec.graph.inputs == ("in0",)  # the constant is baked in, part of the code
        want = reference.run(spec.graph, {"in0": feeds["in0"]})
        kernels.append((spec, torch.as_tensor(feeds["in0"]), want))
    for spec, x, want in kernels:
        assert check_kernel(InductorBackend().compile(spec, "cpu").fn(x), want, spec.graph) is None
    hits = counters["inductor"]["fxgraph_cache_hit"]
    for spec, x, want in kernels:
        assert check_kernel(InductorBackend().compile(spec, "cpu").fn(x), want, spec.graph) is None
    assert counters["inductor"]["fxgraph_cache_hit"] == hits + 2


def test_onnxruntime_keeps_a_broadcast_that_only_a_unary_primitive_reads():
    """ONNX broadcasts implicitly only between operands: exp(broadcast(x)) must stay expanded."""
    from korch.ir.graph import GraphBuilder
    from korch.ir.prims import Prim, TensorType

    b = GraphBuilder()
    x = b.input("x", TensorType((1, 4), "float32"))
    wide = b.emit(Prim.BROADCAST, [x], shape=(3, 4))[0]
    y = b.emit(Prim.EXP, [wide])[0]
    z = b.emit(Prim.ADD, [y, b.emit(Prim.BROADCAST, [x], shape=(3, 4))[0]])[0]
    graph = b.build([y, z], ["y", "z"])
    spec = kernel_spec(graph, make_candidate(graph, range(len(graph.nodes))))
    xs = rand(1, 4)
    want = reference.run(spec.graph, {spec.graph.inputs[0]: xs})
    outs = OnnxRuntimeBackend().compile(spec, "cpu").fn(torch.as_tensor(xs))
    assert check_kernel(outs, want, spec.graph) is None


def grouped_matmul_spec(ends, k=6, n=5, dtype="float32", then=None):
    """One grouped_matmul kernel (x [10, k], w [4, k, n], ends [4], and `then`, a unary primitive
    on its result, if given): its spec, inputs and the reference's output, the grouped matmul itself
    checked against the definition."""
    from korch.ir.graph import GraphBuilder
    from korch.ir.prims import Prim, TensorType

    b = GraphBuilder()
    x = b.input("x", TensorType((10, k), dtype))
    w = b.input("w", TensorType((4, k, n), dtype))
    e = b.input("ends", TensorType((4,), "int64"))
    (y,) = b.emit(Prim.GROUPED_MATMUL, [x, w, e])
    outs = b.emit(then, [y]) if then else [y]
    graph = b.build(outs, ["y"])
    feeds = {
        "x": rand(10, k).astype(dtype),
        "w": rand(4, k, n, seed=1).astype(dtype),
        "ends": np.array(ends, "int64"),
    }
    (mm,) = reference.run(b.build([y], ["y"]), feeds).values()
    x32, w32 = feeds["x"].astype("float32"), feeds["w"].astype("float32")
    for s, g in enumerate(int(np.sum(np.array(ends) <= s)) for s in range(10)):
        expected = x32[s] @ w32[g] if g < 4 else np.zeros(n)
        np.testing.assert_allclose(
            mm[s].astype("float32"), expected, rtol=1e-5 if dtype == "float32" else 1e-2, atol=1e-6
        )
    (want,) = reference.run(graph, feeds).values()
    spec = kernel_spec(graph, make_candidate(graph, range(len(graph.nodes))))
    return spec, [feeds[v] for v in spec.inputs], {spec.graph.output_names[0]: want}


@pytest.mark.parametrize(
    "ends",
    [[3, 3, 8, 10], [0, 4, 4, 7], [10, 2, 12, -1]],
    ids=["sorted-empty-group", "sorted-rows-past-the-end", "unsorted-out-of-range"],
)
@pytest.mark.parametrize("k,n,grouped_mm", [(6, 5, False), (8, 4, True)], ids=["loop", "grouped_mm"])
def test_grouped_matmul_on_every_backend_that_takes_it(ends, k, n, grouped_mm):
    """A mixture of experts' matmul: row s by w[g(s)], g(s) the number of ends <= s (zero past
    the last end), in the vendor and eager kernels (on the CPU torch._grouped_mm where its
    operands' strides are multiples of 16 bytes, else a loop over the groups), in Inductor's (the
    same, as its custom operator korch::grouped_matmul, with what follows it) and in the masked
    form GPUs run without a host sync; ONNX Runtime declines it."""
    from korch.backends import torch_ops

    spec, inputs, want = grouped_matmul_spec(ends, k, n)
    args = [to_tensor(x) for x in inputs]
    assert torch_ops._grouped_mm_takes(args[0], args[1]) is grouped_mm
    for backend in get_backends(["vendor", "eager"]):
        assert backend.supports(spec, "cpu") is None
        assert check_kernel(backend.compile(spec, "cpu").fn(*args), want, spec.graph) is None
    assert check_kernel([torch_ops.grouped_matmul_dense(*args)], want, spec.graph) is None
    fused, _, fused_want = grouped_matmul_spec(ends, k, n, then=Prim.TANH)
    assert check_kernel(InductorBackend().compile(fused, "cpu").fn(*args), fused_want, fused.graph) is None
    assert "grouped matmul" in OnnxRuntimeBackend().supports(spec, "cpu")


@pytest.mark.parametrize(
    "ends", [[3, 3, 8, 10], [0, 4, 4, 7], [0, 0, 0, 0]], ids=["empty-group", "rows-past-the-end", "no-rows"]
)
@pytest.mark.parametrize("k,n,grouped_mm", [(6, 5, False), (8, 16, True)], ids=["masked", "grouped_mm"])
def test_bfloat16_grouped_matmul_on_the_device_and_in_inductor(ends, k, n, grouped_mm):
    """On a GPU a grouped matmul runs without reading its ends on the host (a GPU plan replays as a
    CUDA graph): in bfloat16 by torch._grouped_mm, whose ends are sorted within the rows, as every
    source of the primitive promises; where torch cannot take the operands (strides not multiples
    of 16 bytes), every group's product for every row, masked. The same code on the CPU, and
    Inductor's kernel of a bfloat16 grouped matmul and what follows it."""
    from korch.backends import torch_ops

    spec, inputs, want = grouped_matmul_spec(ends, k, n, "bfloat16", then=Prim.TANH)
    args = [tensors.as_tensor(x) for x in inputs]
    assert torch_ops._grouped_mm_takes(args[0], args[1]) is grouped_mm
    assert check_kernel([torch.tanh(torch_ops.grouped_matmul_on_device(*args))], want, spec.graph) is None
    inductor = InductorBackend()
    assert inductor.supports(spec, "cpu") is None
    assert check_kernel(inductor.compile(spec, "cpu").fn(*args), want, spec.graph) is None


def test_unsorted_ends_on_the_device_give_a_result_the_check_refuses():
    """torch._grouped_mm assumes sorted ends within the rows; others are clamped and made
    non-decreasing before it reads them (never out of bounds), so the result is wrong, not a crash."""
    from korch.backends import torch_ops

    spec, inputs, want = grouped_matmul_spec([10, 2, 12, -1], 8, 16, "bfloat16")
    args = [tensors.as_tensor(x) for x in inputs]
    assert "wrong result" in check_kernel([torch_ops.grouped_matmul_on_device(*args)], want, spec.graph)


def test_how_kernels_are_checked_and_timed_is_part_of_every_backend_version():
    """A kernel refused as a wrong result under one tolerance must not stay refused, from the
    cache, under another, nor a timing taken one way be kept once kernels are timed another:
    the check policy's, the reference executor's and the timer's sources are hashed into each
    backend's version."""
    import hashlib
    import inspect

    from korch.backends import source_digest
    from korch.ir import reference
    from korch.measure import timing, tolerance

    h = hashlib.sha256()
    for module in (tolerance, reference, timing):
        h.update(inspect.getsource(module).encode())
    assert source_digest() == h.hexdigest()[:8]
