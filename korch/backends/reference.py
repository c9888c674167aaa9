"""The reference backend: the numpy executor. Never chosen for speed; it checks every other one."""

from __future__ import annotations

import torch

from korch.backends import Backend, CompiledKernel
from korch.config import VERSION
from korch.ir import reference
from korch.ir.prims import Prim
from korch.ir.tensors import to_numpy, to_tensor
from korch.search.kernel import KernelSpec


class ReferenceBackend(Backend):
    name = "reference"
    selectable = False

    def version(self) -> str:
        return VERSION

    def supports(self, spec: KernelSpec, device: str) -> str | None:
        return None

    def compile(self, spec: KernelSpec, device: str) -> CompiledKernel:
        graph = spec.graph

        def fn(*inputs: torch.Tensor) -> list[torch.Tensor]:
            feeds = {name: to_numpy(t) for name, t in zip(graph.inputs, inputs)}
            outs = reference.run(graph, feeds)
            return [to_tensor(outs[n], device) for n in graph.output_names]

        return CompiledKernel(fn, kernels=sum(n.prim is not Prim.OPAQUE for n in graph.nodes))
