"""What the rewrites share: emitting new nodes beside a graph, splicing them in, the driver that
applies a rewrite until none is left, and cutting out the nodes a rewrite replaces to time it."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from types import MappingProxyType

import numpy as np

from korch.ir.graph import Graph, Node, freeze_attr, prune, verify
from korch.ir.prims import Prim, TensorType


class Emitter:
    """New nodes and constants beside an existing graph (fresh names never collide with it)."""

    def __init__(self, graph: Graph, origin: str):
        self.types = dict(graph.types)
        self.constants = dict(graph.constants)
        self.nodes: list[Node] = []
        self.origin = origin
        self._count = 0

    def _fresh(self) -> str:
        while True:
            self._count += 1
            name = f"rw{self._count}"
            if name not in self.types:
                return name

    def const(self, array: np.ndarray) -> str:
        name = self._fresh()
        array = np.array(array, order="C")  # (a copy; np.ascontiguousarray would make a 0-d array 1-d)
        array.setflags(write=False)
        self.constants[name] = array
        self.types[name] = TensorType.of(array)
        return name

    def emit(self, prim: Prim, inputs, origin: str | None = None, **attrs) -> str:
        frozen = tuple(sorted((k, freeze_attr(v)) for k, v in attrs.items()))
        (out_type,) = prim.infer([self.types[v] for v in inputs], dict(frozen))
        out = self._fresh()
        self.types[out] = out_type
        self.nodes.append(Node(prim, tuple(inputs), (out,), frozen, origin or self.origin))
        return out

    def conv(self, x: str, weight: np.ndarray, group: int = 1) -> str:
        """An unpadded stride-1 convolution of x by a new constant weight."""
        nd = weight.ndim - 2
        w = self.const(weight)
        return self.emit(
            Prim.CONV, [x, w], strides=(1,) * nd, pads=(0,) * 2 * nd, dilations=(1,) * nd, group=group
        )


def unit_conv(graph: Graph, node: Node) -> bool:
    """A stride-1, undilated convolution by constant weights."""
    return (
        node.prim is Prim.CONV
        and node.inputs[1] in graph.constants
        and set(node.a["strides"]) == {1}
        and set(node.a["dilations"]) == {1}
    )


def replace_node(graph: Graph, i: int, em: Emitter, y: str) -> Graph:
    """The graph with em's nodes in place of node i, whose readers read em's value y instead
    (verify checks that the types agree); nodes and constants left unread are dropped."""
    return replace_values(graph, i, em, {graph.nodes[i].outputs[0]: y})


def replace_values(graph: Graph, i: int, em: Emitter, renamed: dict[str, str]) -> Graph:
    """The graph with em's nodes in place of node i, each value in `renamed` read as em's value
    it maps to (verify checks that the types agree); nodes and constants left unread are dropped."""

    def rename(n: Node) -> Node:
        return Node(n.prim, tuple(renamed.get(v, v) for v in n.inputs), n.outputs, n.attrs, n.origin)

    result = prune(
        Graph(
            inputs=graph.inputs,
            outputs=tuple(renamed.get(v, v) for v in graph.outputs),
            output_names=graph.output_names,
            types=MappingProxyType(em.types),
            constants=MappingProxyType(em.constants),
            nodes=(*graph.nodes[:i], *em.nodes, *map(rename, graph.nodes[i + 1 :])),
            name=graph.name,
        )
    )
    verify(result)
    return result


class GraphMaps:
    """Who makes and who reads each value of one graph: what a rewrite looks up for each node
    it tries."""

    def __init__(self, graph: Graph):
        self.g = graph
        self.index = {v: i for i, n in enumerate(graph.nodes) for v in n.outputs}
        self.producer = graph.producers()
        self.readers = graph.consumers()


def per_graph(make: Callable[[Graph], GraphMaps]) -> Callable[[Graph], GraphMaps]:
    """make(graph), made once per graph: the driver (rewrite_all) tries a rewrite on one graph
    node after node until it applies, then scans the new graph."""
    made: list[GraphMaps] = []

    def get(graph: Graph) -> GraphMaps:
        if not made or made[0].g is not graph:
            made[:] = [make(graph)]
        return made[0]

    return get


Attempt = Callable[[Graph, int, Node], "tuple[Graph, str] | None"]


def rewrite_all(graph: Graph, attempt: Attempt) -> tuple[Graph, list[str]]:
    """Apply `attempt` (the rewritten graph and a note, or None) to the first node it accepts,
    then scan the new graph again, until it accepts none; the graph and the notes."""
    notes: list[str] = []
    for _ in range(len(graph.nodes) + 1):  # every rewrite removes work; bounded anyway
        for i, node in enumerate(graph.nodes):
            done = attempt(graph, i, node)
            if done is not None:
                graph, note = done
                notes.append(note)
                break
        else:
            break
    return graph, notes


def subgraph(graph: Graph, nodes: Iterable[int]) -> Graph:
    """The given nodes (a chain whose last node's output is the result) as a graph of their own."""
    picked = [graph.nodes[i] for i in sorted(nodes)]
    made = {v for n in picked for v in n.outputs}
    read = list(dict.fromkeys(v for n in picked for v in n.inputs))
    inputs = tuple(v for v in read if v not in made and v not in graph.constants)
    used = set(read) | made
    return Graph(
        inputs=inputs,
        outputs=(picked[-1].outputs[0],),
        output_names=("y",),
        types=MappingProxyType({v: t for v, t in graph.types.items() if v in used}),
        constants=MappingProxyType({v: c for v, c in graph.constants.items() if v in used}),
        nodes=tuple(picked),
        name=graph.name,
    )


# a rewrite's timer: (ms before, ms after) of the nodes it replaces and of its own, on the target
# device (korch.profile.rewrite_timing.RewriteTimer, handed in by korch.pipeline)
Timing = Callable[[Graph, Graph], "tuple[float, float]"]
