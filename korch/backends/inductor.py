"""The Inductor backend: a candidate traced to an aten graph and compiled by PyTorch Inductor
(C++/OpenMP on CPU, Triton on CUDA)."""

from __future__ import annotations

import contextlib
import re
import sys
from collections.abc import Iterator

import torch

from korch.backends import Backend, CompiledKernel, onnx_patterns, source_digest, torch_ops
from korch.backends.torch_ops import graph_function
from korch.ir.prims import Prim
from korch.measure.device import example_tensors
from korch.search.kernel import KernelSpec

_DEFINITION = re.compile(r"^(\w+) = async_compile\.\w+\(", re.M)


def count_launches(source: str) -> int:
    """Kernel launches per call in Inductor's generated wrapper: its own kernels (C++ or Triton)
    and library calls such as extern_kernels.mm. At least 1."""
    body = source.split("def call(", 1)[-1]
    launches = sum(len(re.findall(rf"\b{name}(\.run)?\(", body)) for name in _DEFINITION.findall(source))
    launches += len(re.findall(r"\bextern_kernels\.\w+\(", body))
    launches += len(re.findall(r"\btorch\.ops\.\w+\.\w+", body))
    return max(launches, 1)


@contextlib.contextmanager
def outside_dynamo() -> Iterator[None]:
    """Dynamo calls a torch.compile backend inside its tracing context, whose fake-tensor mode
    (with symbolic shapes) make_fx, torch.export and Inductor adopt. korch's own tracing
    (torch.export of a graph, make_fx and compile_fx of each Inductor kernel) must run on
    korch's real tensors, as it does outside torch.compile, so both are set aside."""
    from torch._guards import tracing
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    with tracing(None), unset_fake_temporarily():
        yield


@contextlib.contextmanager
def static_shapes(inputs: list[torch.Tensor]) -> Iterator[list[torch.Tensor]]:
    """Fake copies of `inputs` with fixed sizes, in a tracing context whose fake-tensor mode has a
    shape environment, for compile_fx. Inductor's caches on disk (the FX graph cache, AOT
    autograd's) need that environment: without it they were bypassed, so every compile of the
    same kernel lowered it and generated its code again, paid by the compile worker, the timing
    worker and the plan measured in place (a cache hit skips both). The sizes stay constants, so
    the code is the same as compiled from real inputs."""
    from torch._guards import TracingContext, tracing
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    mode = FakeTensorMode(allow_non_fake_inputs=True, shape_env=ShapeEnv(), static_shapes=True)
    with tracing(TracingContext(mode)):
        yield [mode.from_tensor(x, static_shapes=True) for x in inputs]


class InductorBackend(Backend):
    name = "inductor"

    def version(self) -> str:
        return f"torch-{torch.__version__}+{source_digest(sys.modules[__name__], torch_ops, onnx_patterns)}"

    def supports(self, spec: KernelSpec, device: str) -> str | None:
        if any(n.prim is Prim.OPAQUE for n in spec.graph.nodes):
            return "opaque operators run in ONNX Runtime"
        if any(spec.graph.types[v].dtype == "float64" for v in spec.graph.types) and device.startswith(
            "cuda"
        ):
            return "float64 on CUDA"
        return None

    def compile(self, spec: KernelSpec, device: str) -> CompiledKernel:
        from torch._inductor.compile_fx import compile_fx
        from torch.fx.experimental.proxy_tensor import make_fx

        with outside_dynamo():  # (korch may be called from inside a Dynamo trace)
            examples = example_tensors(spec.graph, device)
            fn = graph_function(spec.graph, device)
            traced = make_fx(fn, tracing_mode="fake", _allow_non_fake_inputs=True)(*examples)
            with static_shapes(examples) as fakes:
                compiled = compile_fx(traced, fakes)
        kernels = count_launches(getattr(compiled, "source_code", "") or "")

        def fn(*inputs: torch.Tensor) -> list[torch.Tensor]:
            # compiled for dense inputs; another kernel may hand over a strided view
            return list(compiled(*[x if x.is_contiguous() else x.contiguous() for x in inputs]))

        return CompiledKernel(fn, kernels)
