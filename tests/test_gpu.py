"""The CUDA paths (Inductor's Triton kernels, cuBLAS/cuDNN through torch, the runtime, bench peers
with CUDA graphs): marked `gpu`, skipped where no CUDA device is present."""

import numpy as np
import pytest
import torch
from test_backends import CASES, _whole_graph_spec
from test_bench import FAST, Attention

from korch.backends import get_backends
from korch.bench import bench
from korch.pipeline import OptimizeOptions, optimize
from korch.profiler import check_kernel, time_fn

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


@pytest.mark.parametrize(
    "case", ["softmax", "layernorm", "gelu", "conv_bias", "gemm_bias", "maxpool", "resize"]
)
@pytest.mark.parametrize("backend", ["inductor", "vendor"])
def test_cuda_backend_matches_reference(case, backend):
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
    median, low, high, n = time_fn(compiled.fn, tensors, "cuda", min_time=0.01)
    assert 0 < low <= median <= high and n >= 5


def test_cuda_plan_verifies_and_runs_beside_cuda_graph_peers(tmp_path):
    torch.manual_seed(0)
    module = Attention().eval()
    path = tmp_path / "attn.onnx"
    torch.onnx.export(
        module, (torch.randn(2, 8, 16),), str(path), dynamo=False, opset_version=17, input_names=["x"]
    )
    options = OptimizeOptions(device="cuda", cache=tmp_path / "p.sqlite", **{**FAST, "backends": None})
    plan = optimize(path, options=options)
    assert plan.verify() <= 1e-4
    # Inductor (Triton) and vendor kernels replay as one CUDA graph; outputs are copied out
    x1, x2 = torch.randn(2, 8, 16), torch.randn(2, 8, 16)
    y1, y2 = plan(x1.cuda())[0], plan(x2.cuda())[0]
    assert plan.executable()._cuda_graph, "the plan was not captured as a CUDA graph"
    with torch.no_grad():
        torch.testing.assert_close(y1.cpu(), module(x1), rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(y2.cpu(), module(x2), rtol=1e-4, atol=1e-4)
    report = bench(plan, ("eager", "torch-compile", "torch-compile-cudagraphs"), rounds=2, module=module)
    for peer in ("eager", "torch-compile", "torch-compile-cudagraphs"):
        assert report["results"][peer]["max_rel_err"] <= 1e-3
