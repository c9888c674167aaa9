"""Candidate kernels: every connected, convex, legal set of primitives up to a size bound.

Enumeration runs per partition with each set as a bitmask over the partition's nodes. It is the
ESU scheme (Wernicke 2006): a set is grown only from its lowest node and only with nodes adjacent
to the newest addition that are not adjacent to anything before, so every connected set appears
exactly once. Growth stops at sets that break a monotone legality rule, and at sets whose convex
closure (every node on a path between two of its members) is already larger than the bound.
A region where the bound allows more than `max_per_partition` sets (a value that many chains
read, such as an unrolled scan's gathers from one tensor), or where growing them looks
at more than `max_visits` sets, legal or not, gets the largest bound that keeps it under both
numbers. The second limit is for sets that legality rejects only once finished: Keras'
UpSampling1D, as tf2onnx writes it, splits a tensor into 64 rows and concatenates each twice, and
every set of up to 11 of the rows with their source is connected and convex but writes too many
outputs: without the limit, enumeration looks at far more sets than it could finish, and keeps
none. Both limits sit above what every other model measured keeps and looks at (BENCHMARKS.md)."""

from __future__ import annotations

import hashlib
import time
from collections import Counter
from dataclasses import dataclass, field, replace

import numpy as np

from korch.config import INDEX_CONSTANT, SMALL_CONSTANT
from korch.ir.graph import Graph
from korch.ir.prims import Kind
from korch.search.legality import LegalityOptions, final_reason, monotone_reason
from korch.search.partition import Partition, PartitionOptions, partition


def baked(array: np.ndarray) -> bool:
    """Whether a constant is part of a kernel (and of its key) rather than one of its inputs."""
    return array.size <= SMALL_CONSTANT or (array.dtype.kind in "iub" and array.size <= INDEX_CONSTANT)


@dataclass(frozen=True)
class CandidateOptions:
    max_size: int = 12  # primitives per candidate, broadcasts not counted
    max_per_partition: int = 50_000  # past this a partition's size bound is lowered (see the module doc)
    max_visits: int = 500_000  # sets looked at, kept or rejected: past this too (a bound on the time)
    legality: LegalityOptions = LegalityOptions()
    partition: PartitionOptions = PartitionOptions()


@dataclass(frozen=True)
class Candidate:
    """A set of primitives one kernel could run. `outputs` are the values it writes: those read
    outside the set, and graph outputs. `key` is equal for structurally identical candidates."""

    nodes: tuple[int, ...]
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    key: str
    partition: int
    seed: bool = False  # a whole partition offered as one kernel (not size-bounded or legality-checked)


WHOLE_GRAPH = -1  # the partition index of a candidate over the whole graph (korch.pipeline's seeds)


@dataclass
class CandidateSet:
    graph: Graph
    partitions: list[Partition]
    candidates: list[Candidate]
    pruned: Counter = field(default_factory=Counter)
    seconds: float = 0.0
    lowered: dict[int, int] = field(default_factory=dict)  # partition -> its size bound, where lowered

    @property
    def unique_keys(self) -> int:
        return len({c.key for c in self.candidates})

    def summary(self) -> dict:
        return {
            "primitives": len(self.graph.nodes),
            "partitions": len(self.partitions),
            "candidates": len(self.candidates),
            "unique_candidates": self.unique_keys,
            "pruned": dict(sorted(self.pruned.items())),
            "seconds": round(self.seconds, 4),
        }

    def lowered_note(self, max_size: int, cap: int) -> str | None:
        """One line on the partitions whose size bound was lowered, or None."""
        if not self.lowered:
            return None
        parts = ", ".join(
            f"{p} ({self.partitions[p].size} primitives) to {k}" for p, k in sorted(self.lowered.items())
        )
        return (
            f"over {cap} candidates of up to {max_size} primitives (or too many sets to look at) in a"
            f" partition; bound lowered: {parts}"
        )


# --------------------------------------------------------------------------- keys


class _KeyMaker:
    """Canonical structural keys: primitives, attributes, types and wiring, never value names."""

    def __init__(self, graph: Graph):
        self.graph = graph
        self.node_sig = [self._node_sig(n) for n in graph.nodes]

    def _node_sig(self, node) -> str:
        attrs = []
        for k, v in node.attrs:
            if isinstance(v, bytes):
                v = hashlib.sha256(v).hexdigest()[:16]
            attrs.append((k, v))
        types = tuple(str(self.graph.types[v]) for v in node.outputs)
        return repr((node.prim.value, tuple(attrs), types))

    def _input_sig(self, value: str) -> str:
        graph = self.graph
        if value in graph.constants:
            array = graph.constants[value]
            if array.size <= SMALL_CONSTANT:
                return f"k{graph.types[value]}{array.reshape(-1).tolist()}"
            if baked(array):
                digest = hashlib.sha256(np.ascontiguousarray(array).tobytes()).hexdigest()[:16]
                return f"k{graph.types[value]}{digest}"
            return f"w{graph.types[value]}"
        return f"x{graph.types[value]}"

    def key(self, nodes: tuple[int, ...], outputs: tuple[str, ...]) -> tuple[str, tuple[str, ...]]:
        """(key, external inputs in first-use order)."""
        local: dict[str, str] = {}
        external: dict[str, int] = {}
        parts = []
        for pos, idx in enumerate(nodes):
            node = self.graph.nodes[idx]
            refs = []
            for v in node.inputs:
                if v not in local:
                    external.setdefault(v, len(external))
                    refs.append(f"in{external[v]}")
                else:
                    refs.append(local[v])
            parts.append(f"{self.node_sig[idx]}({','.join(refs)})")
            for j, v in enumerate(node.outputs):
                local[v] = f"n{pos}.{j}"
        text = ";".join(parts) + "|" + ",".join(self._input_sig(v) for v in external)
        text += "|" + ",".join(local[v] for v in outputs)
        return hashlib.sha256(text.encode()).hexdigest()[:24], tuple(external)


# -------------------------------------------------------------------- enumeration


class _Region:
    """One partition's nodes as bitmasks: adjacency, descendants, ancestors, output readers."""

    def __init__(self, graph: Graph, part: Partition):
        self.part = part
        nodes = graph.nodes[part.start : part.stop]
        m = len(nodes)
        producer = {v: i for i, n in enumerate(nodes) for v in n.outputs}
        consumers = graph.consumers()
        graph_outputs = set(graph.outputs)
        self.kind = [n.kind for n in nodes]
        # broadcasts are index arithmetic inside a kernel: they do not count toward the size bound
        self.counted = sum(1 << i for i, n in enumerate(nodes) if n.kind is not Kind.BROADCAST)
        self.adj = [0] * m
        self.anc = [0] * m
        for i, n in enumerate(nodes):
            for v in n.inputs:
                p = producer.get(v)
                if p is not None:
                    self.adj[i] |= 1 << p
                    self.adj[p] |= 1 << i
                    self.anc[i] |= (1 << p) | self.anc[p]
        self.desc = [0] * m
        for i in range(m - 1, -1, -1):
            for j in _bits(self.adj[i] >> (i + 1) << (i + 1)):  # later neighbours read from i
                self.desc[i] |= (1 << j) | self.desc[j]
        # per output value: readers inside the region (mask) and whether anything outside reads it
        self.outputs = []
        for n in nodes:
            outs = []
            for v in n.outputs:
                mask, outside = 0, v in graph_outputs
                for c in consumers.get(v, []):
                    j = producer.get(c.outputs[0])
                    if j is None:
                        outside = True
                    else:
                        mask |= 1 << j
                outs.append((v, mask, outside))
            self.outputs.append(outs)

    def written(self, members: int) -> tuple[str, ...]:
        return tuple(
            v
            for i in _bits(members)
            for v, readers, outside in self.outputs[i]
            if outside or readers & ~members
        )


def _bits(mask: int):
    while mask:
        low = mask & -mask
        yield low.bit_length() - 1
        mask ^= low


def _enumerate_region(region: _Region, options: CandidateOptions, pruned: Counter):
    """Yield (member mask, written values) for every legal connected convex set, and None for
    each connected set looked at and rejected (the caller counts the work)."""
    k = options.max_size
    legality = options.legality
    kinds = region.kind

    def grow(members, ext, excl, lowest_above, counts, desc, anc):
        between = desc & anc & ~members
        if not between:
            written = region.written(members)
            reason = final_reason(len(written), legality)
            if reason:
                pruned[reason] += 1
                yield None
            else:
                yield members, written
        else:
            pruned["non-convex"] += 1
            yield None
        while ext:
            w = (ext & -ext).bit_length() - 1
            ext &= ext - 1
            bigger = members | (1 << w)
            if (bigger & region.counted).bit_count() > k:
                continue  # the size bound, not a rejection
            grown = counts.copy()
            grown[kinds[w]] += 1
            reason = monotone_reason(grown, legality)
            if reason:
                pruned[reason] += 1
                continue
            d, a = desc | region.desc[w], anc | region.anc[w]
            if ((bigger | (d & a)) & region.counted).bit_count() > k:
                pruned["non-convex"] += 1  # its convex closure no longer fits the bound
                continue
            new_ext = ext | (region.adj[w] & lowest_above & ~excl)
            yield from grow(bigger, new_ext, excl | region.adj[w], lowest_above, grown, d, a)

    for v in range(len(kinds)):
        above = ~((1 << (v + 1)) - 1)
        counts = Counter({kinds[v]: 1})
        yield from grow(
            1 << v,
            region.adj[v] & above,
            region.adj[v] | (1 << v),
            above,
            counts,
            region.desc[v],
            region.anc[v],
        )


def enumerate_candidates(graph: Graph, options: CandidateOptions = CandidateOptions()) -> CandidateSet:
    start = time.perf_counter()
    parts = partition(graph, options.partition)
    keys = _KeyMaker(graph)
    pruned: Counter = Counter()
    found: list[Candidate] = []
    lowered: dict[int, int] = {}
    for part in parts:
        sets, size = _bounded(_Region(graph, part), options, pruned)
        if size < options.max_size:
            lowered[part.index] = size
        for members, written in sets:
            nodes = tuple(part.start + i for i in _bits(members))
            key, inputs = keys.key(nodes, written)
            found.append(Candidate(nodes, inputs, written, key, part.index))
    return CandidateSet(graph, parts, found, pruned, time.perf_counter() - start, lowered)


def _bounded(region: _Region, options: CandidateOptions, pruned: Counter) -> tuple[list, int]:
    """(the region's sets, the size bound they keep): all sets up to options.max_size, or where
    those are more than options.max_per_partition or take looking at more than options.max_visits,
    those up to the largest bound that stays within both (found by bisection; each try stops at
    the first set past a limit)."""

    def sets_up_to(size: int) -> tuple[list, Counter] | None:
        counted: Counter = Counter()
        sets = []
        looked = _enumerate_region(region, replace(options, max_size=size), counted)
        for visits, found in enumerate(looked, 1):
            too_many = found is not None and len(sets) == options.max_per_partition
            if (too_many or visits > options.max_visits) and size > 1:  # (every primitive needs a kernel)
                return None
            if found is not None:
                sets.append(found)
        return sets, counted

    best, size = sets_up_to(options.max_size), options.max_size
    if best is None:  # the bound fits between `size` (too many) and 1 (one set per node at most)
        low, high = 1, options.max_size
        while high - low > 1:
            middle = (low + high) // 2
            tried = sets_up_to(middle)
            if tried is None:
                high = middle
            else:
                low, best = middle, tried
        size, best = low, best or sets_up_to(1)
    pruned.update(best[1])
    return best[0], size


def is_convex(graph: Graph, nodes) -> bool:
    """Independent check by plain graph search: no path leaves the set and comes back."""
    members = set(nodes)
    index = {v: i for i, n in enumerate(graph.nodes) for v in n.outputs}
    readers = {v: [index[c.outputs[0]] for c in cs] for v, cs in graph.consumers().items()}

    def successors(i):
        return [j for v in graph.nodes[i].outputs for j in readers.get(v, [])]

    frontier = [j for i in members for j in successors(i) if j not in members]
    outside = set()
    while frontier:
        j = frontier.pop()
        if j in outside:
            continue
        outside.add(j)
        for nxt in successors(j):
            if nxt in members:
                return False
            frontier.append(nxt)
    return True


__all__ = ["Candidate", "CandidateOptions", "CandidateSet", "enumerate_candidates", "is_convex"]


def make_candidate(
    graph: Graph, nodes, partition: int = -1, keys: _KeyMaker | None = None, seed: bool = False
) -> Candidate:
    """A candidate for any set of nodes (no legality or convexity check): used for seeds and tests."""
    nodes = tuple(sorted(nodes))
    members = set(nodes)
    index = {v: i for i, n in enumerate(graph.nodes) for v in n.outputs}
    readers = graph.consumers()
    outputs = set(graph.outputs)
    written = tuple(
        v
        for i in nodes
        for v in graph.nodes[i].outputs
        if v in outputs or any(index[c.outputs[0]] not in members for c in readers.get(v, []))
    )
    key, inputs = (keys or _KeyMaker(graph)).key(nodes, written)
    return Candidate(nodes, inputs, written, key, partition, seed)
