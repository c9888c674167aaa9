"""A candidate cut out of its graph as a standalone primitive graph: what every backend compiles."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from korch.config import INDEX_CONSTANT
from korch.errors import KorchError
from korch.ir.graph import Graph, Node
from korch.ir.serialize import graph_to_json
from korch.search.candidates import Candidate, baked

SOURCE_MODEL_PREFIX = "model-"  # key prefix of the source model run whole (korch.pipeline)
WHOLE_GRAPH_PREFIX = "graph-"  # key prefix of the whole primitive graph as one kernel (korch.pipeline)


def runs_alone(key: str) -> bool:
    """Whether a kernel is a plan by itself (the source model, or the whole primitive graph): no
    other kernel runs beside it, so it may keep the cores busy between calls (ONNX Runtime's
    spinning thread pool)."""
    return key.startswith((SOURCE_MODEL_PREFIX, WHOLE_GRAPH_PREFIX))


@dataclass(frozen=True)
class KernelSpec:
    """`graph` reads in0..inN and writes out0..outM. Small constants and index arrays are baked in
    (korch.search.candidates.baked); others (weights) are inputs, so structurally identical candidates
    (same key)
    share one compiled kernel. `inputs` / `outputs` name the values in the original graph."""

    key: str
    graph: Graph
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    seed: bool = False  # a whole partition (see korch.pipeline.add_seeds)
    # positions in graph.inputs of the inputs that are the model's constants (its weights), where
    # known: a backend that bakes weights in asks which ones it would get (korch.backends.inductor)
    weights: tuple[int, ...] = ()

    @property
    def signature(self) -> str:
        g = self.graph
        ins = ",".join(str(g.types[v]) for v in g.inputs)
        outs = ",".join(str(g.types[v]) for v in g.outputs)
        return f"({ins})->({outs})"


def kernel_spec(graph: Graph, candidate: Candidate) -> KernelSpec:
    rename: dict[str, str] = {}
    types, constants, inputs = {}, {}, []
    for v in candidate.inputs:
        array = graph.constants.get(v)
        if array is not None and baked(array):
            rename[v] = f"c{len(constants)}"
            constants[rename[v]] = array
        else:
            rename[v] = f"in{len(inputs)}"
            inputs.append(v)
        types[rename[v]] = graph.types[v]
    nodes = []
    for pos, idx in enumerate(candidate.nodes):
        node = graph.nodes[idx]
        for j, v in enumerate(node.outputs):
            rename[v] = f"t{pos}_{j}"
            types[rename[v]] = graph.types[v]
        nodes.append(
            Node(
                node.prim,
                tuple(rename[v] for v in node.inputs),
                tuple(rename[v] for v in node.outputs),
                node.attrs,
                node.origin,
            )
        )
    sub = Graph(
        inputs=tuple(rename[v] for v in inputs),
        outputs=tuple(rename[v] for v in candidate.outputs),
        output_names=tuple(f"out{i}" for i in range(len(candidate.outputs))),
        types=MappingProxyType(types),
        constants=MappingProxyType(constants),
        nodes=tuple(nodes),
        name=f"k_{candidate.key}",
    )
    # (not verified here: a renamed part of a verified graph, built for every candidate of a
    # model, tens of thousands; tests/search/test_kernel.py verifies what this builds)
    weights = tuple(i for i, v in enumerate(inputs) if v in graph.constants)
    return KernelSpec(candidate.key, sub, tuple(inputs), candidate.outputs, candidate.seed, weights)


def kernel_graph_json(graph: Graph, by_reference: Mapping[str, bytes] = MappingProxyType({})) -> dict:
    """A kernel's graph as one JSON document: its own constants are small (korch.search.candidates.baked),
    so they are written inline (graph_io.graph_to_json for `by_reference`)."""
    doc, big = graph_to_json(graph, by_reference, inline_limit=INDEX_CONSTANT)
    if big:
        raise KorchError("internal: kernel graphs carry only small constants")
    return doc
