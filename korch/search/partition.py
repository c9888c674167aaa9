"""Automatic partitioning: cut the primitive graph into contiguous regions at narrow, cheap cuts."""

from __future__ import annotations

from dataclasses import dataclass

from korch.ir.graph import Graph
from korch.ir.prims import Kind


@dataclass(frozen=True)
class PartitionOptions:
    min_nodes: int = 24  # a region is at least this long unless the graph ends
    max_nodes: int = 96  # past this a region is cut at the narrowest place available


@dataclass(frozen=True)
class Partition:
    """Nodes [start, stop) of the graph's topological order; `crossing` are the values computed
    inside and read by later regions (they are always written to memory)."""

    index: int
    start: int
    stop: int
    crossing: tuple[str, ...]

    @property
    def size(self) -> int:
        return self.stop - self.start


def _live_after(graph: Graph) -> list[tuple[str, ...]]:
    """live[i]: values produced by nodes 0..i and still read by a node after i."""
    last_use: dict[str, int] = {}
    for i, node in enumerate(graph.nodes):
        for v in node.inputs:
            last_use[v] = i
    producer = {v for n in graph.nodes for v in n.outputs}
    live: dict[str, None] = {}
    out = []
    for i, node in enumerate(graph.nodes):
        for v in node.inputs:
            if v in live and last_use[v] == i:
                del live[v]
        for v in node.outputs:
            if v in producer and last_use.get(v, -1) > i:
                live[v] = None
        out.append(tuple(live))
    return out


def _cheap_cut(graph: Graph, crossing: tuple[str, ...], consumers) -> bool:
    """A single value read only by linear or opaque primitives: such readers never fuse with its
    producer's epilogue, so cutting here loses at most linear prologue fusions."""
    if len(crossing) != 1:
        return False
    readers = consumers.get(crossing[0], [])
    return bool(readers) and all(n.kind in (Kind.LINEAR, Kind.OPAQUE) for n in readers)


def partition(graph: Graph, options: PartitionOptions = PartitionOptions()) -> list[Partition]:
    """Greedy left to right: end each region at the first cheap cut once it has min_nodes (small
    regions keep the selection programs small), or at the narrowest cut in the window when the
    window has no cheap cut."""
    n = len(graph.nodes)
    if n == 0:
        return []
    live = _live_after(graph)
    consumers = graph.consumers()
    parts: list[Partition] = []
    start = 0
    while start < n:
        if n - start <= options.max_nodes:
            stop = n
        else:
            window = range(start + options.min_nodes, min(start + options.max_nodes, n))
            cheap = [p for p in window if _cheap_cut(graph, live[p - 1], consumers)]
            stop = cheap[0] if cheap else min(window, key=lambda p: (len(live[p - 1]), -p))
        parts.append(Partition(len(parts), start, stop, live[stop - 1] if stop < n else ()))
        start = stop
    return parts
