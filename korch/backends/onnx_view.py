"""What korch.backends.onnx_patterns' patterns read of a kernel graph, and what they write: a
pattern is a function (View, the index of its root node, that node) -> Fused or None."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from korch.ir.graph import Graph, Node
from korch.ir.prims import Prim


@dataclass(frozen=True)
class Fused:
    """One ONNX operator standing for the primitives `absorbed` (its root included): `inputs` are
    the graph's values or constant arrays ("" an omitted optional input)."""

    op: str
    inputs: tuple[str | np.ndarray, ...]
    absorbed: frozenset[int]
    attrs: dict = field(default_factory=dict)


class View:
    """The questions a pattern asks of the graph."""

    def __init__(self, graph: Graph, weights: Mapping[str, np.ndarray] | None = None):
        self.graph = graph
        self.weights = weights or {}
        self.index = {v: i for i, n in enumerate(graph.nodes) for v in n.outputs}
        self.readers: dict[str, list[int]] = {}
        for i, n in enumerate(graph.nodes):
            for v in n.inputs:
                self.readers.setdefault(v, []).append(i)
        self.taken: set[int] = set()

    def inner(self, v: str, *prims: Prim) -> tuple[int, Node] | None:
        """The node producing v when the pattern may swallow it: one of `prims`, read once, not a
        kernel output, not already inside another pattern."""
        return self.shared(v, *prims) if len(self.readers.get(v, ())) == 1 else None

    def shared(self, v: str, *prims: Prim) -> tuple[int, Node] | None:
        """As `inner`, for a value the pattern reads more than once (`fuse` checks that nothing
        outside the pattern reads it)."""
        i = self.index.get(v)
        if i is None or i in self.taken or v in self.graph.outputs:
            return None
        node = self.graph.nodes[i]
        return (i, node) if node.prim in prims else None

    def value(self, v: str) -> np.ndarray | None:
        """A constant's or a known weight's array."""
        for known in (self.graph.constants, self.weights):
            if v in known:
                return np.asarray(known[v])
        return None

    def shape(self, v: str) -> tuple[int, ...]:
        return tuple(self.graph.types[v].shape)

    def sealed(self, absorbed: frozenset[int], root: int) -> bool:
        """Whether only the pattern reads what its inner nodes compute."""
        return all(
            v not in self.graph.outputs and all(r in absorbed for r in self.readers.get(v, ()))
            for i in absorbed - {root}
            for v in self.graph.nodes[i].outputs
        )

    def scalar(self, v: str) -> float | None:
        c = self.graph.constants.get(v)
        return float(np.asarray(c).reshape(-1)[0]) if c is not None and np.size(c) == 1 else None

    def operand_and_scalar(self, node: Node) -> tuple[str, float] | None:
        """(x, c) for a binary primitive of x and a scalar constant c, in either order."""
        a, b = node.inputs
        if self.scalar(b) is not None:
            return a, self.scalar(b)
        if self.scalar(a) is not None and node.prim in (Prim.ADD, Prim.MUL, Prim.MAX, Prim.MIN):
            return b, self.scalar(a)
        return None

    def dtype(self, v: str) -> str:
        return self.graph.types[v].dtype

    def rank(self, v: str) -> int:
        return self.graph.types[v].rank


def close(a: float, b: float) -> bool:
    return abs(a - b) <= 1e-6 * max(1.0, abs(b))
