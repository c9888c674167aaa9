"""What a primitive and a kernel must do, from each primitive's row in korch.ir.prims.DEFS: the
FLOPs of its multiply-adds and the bytes it must read and write. Roofline reports and the lower
bounds of korch.orchestrate.bounds are made of these counts."""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from dataclasses import dataclass

from korch.ir.graph import Graph, Node
from korch.ir.prims import DEFS, TensorType

# primitives a backend may return as a view of their input (torch's expand, view, permute, slicing
# and window's unfold), moving no data: their outputs are not counted as written, nor the inputs
# only they read as read
VIEWS = frozenset(prim for prim, definition in DEFS.items() if definition.view)


def node_flops(node: Node, types: Mapping[str, TensorType]) -> int:
    """Multiply-adds counted as two FLOPs, for linear primitives only (0 for anything else)."""
    ins = [types[v] for v in node.inputs]
    return DEFS[node.prim].flops(ins, [types[v] for v in node.outputs])


@dataclass(frozen=True)
class Work:
    """What a kernel must do: multiply-adds counted as two FLOPs, and the bytes of its inputs read
    once and its outputs written once (the constants baked into it are a few elements); and the
    FLOPs of each linear primitive by its class (the primitive, its operands' types and its
    attributes: korch.orchestrate.bounds bounds each by the fastest rate its class has shown)."""

    flops: int
    bytes: int
    linear: tuple[tuple[Hashable, int], ...] = ()  # (class, FLOPs) of each linear primitive
    alone: bool = False  # one linear primitive and nothing else


def kernel_work(graph: Graph) -> Work:
    """The work of a kernel's standalone graph (korch.search.kernel.KernelSpec.graph): bytes of the
    inputs that some primitive other than a view reads, and of the outputs that one writes."""
    types = graph.types
    linear = tuple(
        ((node.prim, tuple(types[v] for v in node.inputs), node.attrs), flops)
        for node in graph.nodes
        if (flops := node_flops(node, types))
    )
    computing = [node for node in graph.nodes if node.prim not in VIEWS]
    read = {v for node in computing for v in node.inputs} & set(graph.inputs)
    written = {v for node in computing for v in node.outputs} & set(graph.outputs)
    return Work(
        sum(f for _, f in linear),
        sum(types[v].nbytes for v in (*read, *written)),
        linear,
        alone=len(graph.nodes) == 1 and len(linear) == 1,
    )
