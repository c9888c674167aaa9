"""The eager backend: one primitive run by its PyTorch operation (ATen's own kernel, nothing to
compile). Every primitive then has a kernel as soon as profiling starts, so a time budget goes
to fusions. It matters on CUDA, where each single-primitive kernel from Inductor is a slow Triton
compile and ONNX Runtime usually has no CUDA provider; on CPU ONNX Runtime covers single
primitives as cheaply, so eager is not a default there."""

from __future__ import annotations

import sys

import torch

from korch.backends import Backend, CompiledKernel, source_digest, torch_ops
from korch.backends.torch_ops import graph_function
from korch.ir.prims import Prim
from korch.search.kernel import KernelSpec


class EagerBackend(Backend):
    name = "eager"
    default_on = ("cuda",)

    def version(self) -> str:
        return f"torch-{torch.__version__}+{source_digest(sys.modules[__name__], torch_ops)}"

    def supports(self, spec: KernelSpec, device: str) -> str | None:
        if len(spec.graph.nodes) != 1:
            return "runs single primitives (a fusion needs a compiler)"
        if spec.graph.nodes[0].prim is Prim.OPAQUE:
            return "opaque operators run in ONNX Runtime"
        return None

    def compile(self, spec: KernelSpec, device: str) -> CompiledKernel:
        run = graph_function(spec.graph, device)

        def fn(*inputs: torch.Tensor) -> list[torch.Tensor]:
            # a transpose or slice is a view in PyTorch: copied here, where its cost belongs,
            # instead of in whichever kernel reads it next
            return [y.contiguous() for y in run(*inputs)]

        return CompiledKernel(fn, kernels=1)
