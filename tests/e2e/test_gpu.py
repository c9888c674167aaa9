"""The CUDA paths (Inductor's Triton kernels, cuBLAS/cuDNN through torch, the runtime, bench peers
with CUDA graphs): marked `gpu`, skipped where no CUDA device is present."""

import time
import warnings

import numpy as np
import pytest
import torch
from test_backends import CASES, _whole_graph_spec, grouped_matmul_spec
from test_bench import FAST, attention_onnx

from korch.backends import get_backends
from korch.cli.bench import bench
from korch.ir import tensors
from korch.measure.device import hold_device, timing_events
from korch.measure.timing import time_fn
from korch.pipeline import OptimizeOptions, optimize
from korch.plan.runtime import measure_in_place
from korch.profile.jobs import check_kernel

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


@pytest.mark.parametrize(
    "case",
    [
        "softmax",
        "layernorm",
        "gelu",
        "conv_bias",
        "gemm_bias",
        "maxpool",
        "resize",
        "scatter_nd_max",
        "scatter_elements_add",
        "top_k",
        "grid_sample",
    ],
)
@pytest.mark.parametrize("backend", ["inductor", "vendor", "onnxruntime"])
def test_cuda_backend_matches_reference(case, backend):
    """(onnxruntime: its CUDA provider, where the installed ONNX Runtime has one; else it declines)"""
    assert case in CASES
    (b,) = get_backends([backend])
    spec, inputs, want = _whole_graph_spec(case)
    if b.supports(spec, "cuda") is not None:
        return
    compiled = b.compile(spec, "cuda")
    tensors = [torch.as_tensor(np.asarray(x)).cuda() for x in inputs]
    outs = compiled.fn(*tensors)
    assert all(o.is_cuda for o in outs)
    assert check_kernel([o.cpu() for o in outs], want, spec.graph) is None
    median, low, high, n, *_ = time_fn(compiled.fn, tensors, "cuda", min_time=0.01)
    assert 0 < low <= median <= high and n >= 5


@pytest.mark.parametrize("dtype,k,n", [("float32", 6, 5), ("bfloat16", 8, 16)])
@pytest.mark.parametrize("backend", ["vendor", "inductor"])
def test_grouped_matmul_on_cuda_replays_in_a_cuda_graph(backend, dtype, k, n):
    """Reading the groups' ends on the host would break CUDA graph capture: on a GPU a grouped
    matmul runs torch._grouped_mm in bfloat16 (compute capability 9 or 10), elsewhere every
    group's product for every row, masked; Inductor calls the same with what follows it."""
    from korch.ir.prims import Prim

    spec, inputs, want = grouped_matmul_spec(
        [3, 3, 8, 10], k, n, dtype, then=Prim.TANH if backend == "inductor" else None
    )
    fn = get_backends([backend])[0].compile(spec, "cuda").fn
    tensors = [tensors.as_tensor(x).cuda() for x in inputs]
    fn(*tensors)  # (warm-up, outside the capture)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outs = fn(*tensors)
    graph.replay()
    torch.cuda.synchronize()
    assert check_kernel([o.cpu() for o in outs], want, spec.graph) is None


@pytest.fixture(scope="module")
def attention_plan(tmp_path_factory):
    """The Attention block optimized for CUDA once (every backend), and its module."""
    tmp = tmp_path_factory.mktemp("cuda")
    module, path = attention_onnx(tmp)
    options = OptimizeOptions(device="cuda", cache=tmp / "p.sqlite", **{**FAST, "backends": None})
    return optimize(path, options=options), module


def test_cuda_plan_verifies_and_runs_beside_cuda_graph_peers(attention_plan):
    plan, module = attention_plan
    assert plan.verify() <= 1e-4
    # Inductor (Triton) and vendor kernels replay as one CUDA graph; outputs are copied out
    x1, x2 = torch.randn(2, 8, 16), torch.randn(2, 8, 16)
    y1, y2 = plan(x1.cuda())[0], plan(x2.cuda())[0]
    assert plan.executable().captured, "the plan was not captured as a CUDA graph"
    with torch.no_grad():
        torch.testing.assert_close(y1.cpu(), module(x1), rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(y2.cpu(), module(x2), rtol=1e-4, atol=1e-4)
    peers = ("eager", "torch-compile", "torch-compile-cudagraphs", "torch-compile-cudagraphs-freezing")
    report = bench(plan, peers, rounds=2, module=module)
    for peer in peers:
        assert report["results"][peer]["max_rel_err"] <= 1e-3
    assert report["results"]["korch"]["cuda_graph"] is True


def test_a_plan_that_cannot_be_captured_says_so(attention_plan, caplog):
    """A kernel that synchronizes cannot be captured in a CUDA graph: the plan runs kernel by
    kernel, still correct, and says so (a warning; Executable.captured False; bench's
    "cuda_graph" False and its table's note), never compared as if it were captured."""
    plan, module = attention_plan
    exe = plan.executable()
    fn, *rest = exe.steps[0]

    def synchronizing(*inputs):
        torch.cuda.synchronize()  # (not allowed while a stream is being captured)
        return fn(*inputs)

    exe.steps[0] = (synchronizing, *rest)
    x = torch.randn(2, 8, 16)
    with caplog.at_level("WARNING", logger="korch"):
        y = exe(x.cuda())[0]
    assert exe.captured is False
    assert "CUDA graph capture failed" in caplog.text
    with torch.no_grad():
        torch.testing.assert_close(y.cpu(), module(x), rtol=1e-4, atol=1e-4)


def test_a_plan_whose_cuda_graph_captures_nothing_says_so(attention_plan, caplog):
    """A capture that records no kernel only makes torch warn ("The CUDA Graph is empty"), and its
    replay does nothing: the plan is reported as not captured, as a failed capture is."""
    plan, _ = attention_plan
    exe = plan.executable()

    def hollow(fn):
        """The kernel once (the first warm-up call), then new buffers of its outputs' shapes:
        nothing is launched while the graph is captured."""
        first: list[torch.Tensor] = []

        def run(*inputs):
            if not first:
                first.extend(fn(*inputs))
                return first
            return [torch.empty_like(t) for t in first]

        return run

    exe.steps = [(hollow(fn), *rest) for fn, *rest in exe.steps]
    with caplog.at_level("WARNING", logger="korch"):
        exe(torch.randn(2, 8, 16).cuda())
    assert exe.captured is False
    assert "the CUDA graph is empty" in caplog.text


def test_the_held_stream_spins_about_as_long_as_asked():
    hold_device("cuda", 1.0)  # calibrates
    start, end = timing_events()
    start.record()
    hold_device("cuda", 5.0)
    end.record()
    end.synchronize()
    assert 3.0 < start.elapsed_time(end) < 10.0


def test_device_timings_leave_out_the_hosts_launch_overhead():
    """3 ms on the host before one tiny kernel: the profiler counts the device's microseconds, as
    a plan replayed from a CUDA graph pays them (the host's time would be 3 ms)."""
    x = torch.randn(1024, device="cuda")

    def slow_host(t):
        time.sleep(0.003)
        return [t + 1]

    median, low, high, n, *_ = time_fn(slow_host, [x], "cuda", min_time=0.01)
    assert 0 < low <= median < 1.0 and n >= 5


def test_a_cuda_plan_is_timed_in_place_kernel_by_kernel(attention_plan):
    plan, _ = attention_plan
    measured = measure_in_place(plan)
    steps = measured["kernels_ms"]
    # the device's time of each kernel (0 for one that launches nothing, a view): together no
    # more than the replayed graph's wall clock
    assert len(steps) == len(plan.kernels) and all(ms >= 0 for ms in steps)
    assert sum(steps) <= 1.5 * measured["ms"]


def test_torch_compile_backend_on_cuda_returns_outputs_the_caller_owns(tmp_path):
    """torch.compile(backend="korch") on CUDA tensors: the plan replays as a CUDA graph whose
    output buffers the next call overwrites; each call's result must stay the caller's own."""
    import torch._dynamo
    from test_torch_frontend import Block

    from korch import torch_backend

    module = Block().eval().cuda()
    # (a budget: the H200 run without one did not end within 100 s)
    options = {**FAST, "backends": ("inductor", "vendor"), "time_budget": 10, "jobs": 4}
    options["cache"] = str(tmp_path / "p.sqlite")
    torch._dynamo.reset()
    try:
        # the backend by its function: the GPU run uses the source tree, where the "korch" name
        # (a package entry point) is not registered
        compiled = torch.compile(module, backend=torch_backend.korch_backend, options=options)
        xs = [torch.randn(2, 5, 16, device="cuda") for _ in range(3)]
        with warnings.catch_warnings(record=True) as record, torch.no_grad():
            warnings.simplefilter("always")
            got = [compiled(x) for x in xs]  # all kept before any is compared
            want = [module(x) for x in xs]
    finally:
        torch._dynamo.reset()
    # korch falls back to eager PyTorch with a warning: that would pass the comparison below
    assert [str(w.message) for w in record if str(w.message).startswith("korch:")] == []
    for g, w in zip(got, want):
        assert g.is_cuda
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-4)


def test_a_bfloat16_module_on_cuda_matches_eager(tmp_path):
    """Inductor's and the vendor's bfloat16 kernels on a GPU (tensor cores), checked against the
    reference and against eager bfloat16 on the same device."""
    from test_bfloat16 import TOLERANCE, Block

    import korch
    from korch.ir.tensors import to_numpy
    from korch.measure import check

    torch.manual_seed(0)
    module = Block().eval().to(torch.bfloat16).cuda()
    x = torch.randn(2, 8, 32, dtype=torch.bfloat16, device="cuda")
    options = {**FAST, "backends": ("inductor", "vendor"), "time_budget": 10, "jobs": 4}
    plan = korch.optimize(module, (x,), device="cuda", cache=str(tmp_path / "p.sqlite"), **options)
    (got,) = plan(x)
    with torch.no_grad():
        want = module(x)
    assert got.is_cuda and got.dtype == torch.bfloat16
    assert check.rel_err(to_numpy(got), to_numpy(want)) <= TOLERANCE
    assert plan.verify() <= TOLERANCE
