"""What the rewrites share: emitting new nodes beside a graph, splicing them in, the driver that
applies a rewrite until none is left, and timing a rewrite on its own nodes."""

from __future__ import annotations

import dataclasses
import hashlib
import math
from collections.abc import Callable, Iterable
from types import MappingProxyType

import numpy as np

from korch.ir.graph import Graph, Node, freeze_attr, prune, to_text, verify
from korch.ir.prims import Prim, TensorType
from korch.profile.database import ProfileDB

GAIN = 0.8  # a FLOP-saving rewrite must leave less than this fraction of the FLOPs it replaces
FASTER = 0.8  # a measured rewrite must take less than this fraction of the time


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
        array = np.ascontiguousarray(array)
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


def measure(before: Graph, after: Graph, device: str, rounds: int = 3) -> tuple[float, float]:
    """Milliseconds of two graphs computing the same thing (run op by op in PyTorch: the
    convolutions Inductor and the vendor backend call), each the fastest of interleaved rounds of
    the profiler's timer. If either fails to run (a dtype without a kernel, out of memory), the
    rewritten one counts as never faster."""
    import torch

    from korch.backends.torch_ops import graph_function
    from korch.profile.profiler import example_tensors, time_fn

    best = [float("inf"), float("inf")]
    try:
        inputs = example_tensors(before, device)
        fns = [graph_function(g, device) for g in (before, after)]
        with torch.no_grad():
            for _ in range(rounds):
                for k, fn in enumerate(fns):
                    best[k] = min(best[k], time_fn(fn, inputs, device, min_time=0.02)[0])
    except Exception:  # the rewrite is an optimization: never let it fail the optimize
        return 1.0, float("inf")
    return best[0], best[1]


Timing = Callable[[Graph, Graph], "tuple[float, float]"]  # (ms before, ms after) of a rewrite


class Timer:
    """Times a rewrite against the nodes it replaces on a device (`measure`). Given a profile
    database, each timing is kept there under the pair's structure (weights' values aside), the
    torch version and the device, so a later optimize makes the same decision without timing
    again (a decision near the FASTER line would otherwise flip between runs and change every
    candidate key downstream). Timings that failed are not kept."""

    def __init__(self, device: str, db: ProfileDB | None = None):
        self.device = device
        self.db = db

    def __call__(self, before: Graph, after: Graph) -> tuple[float, float]:
        if self.db is None:
            return measure(before, after, self.device)
        import torch

        from korch.backends import device_name

        where = (_pair_key(before, after), f"torch {torch.__version__}", device_name(self.device))
        kept = self.db.rewrite_timing(*where)
        if kept is not None:
            return kept
        ms = measure(before, after, self.device)
        if math.isfinite(ms[0]) and math.isfinite(ms[1]):
            self.db.store_rewrite_timing(*where, *ms)
        return ms


def _pair_key(before: Graph, after: Graph) -> str:
    text = "\n".join(to_text(dataclasses.replace(g, name="g")) for g in (before, after))
    return hashlib.sha256(text.encode()).hexdigest()[:24]
