"""Transpose pulling and sinking, a layout rewrite of the primitive graph before candidates are
enumerated.

A transpose commutes with most primitives: T(f(x)) = f'(T(x)) for elementwise work, broadcasts,
reductions, slices, pads and concatenations (their axes permuted), and a transpose that swaps
the last two axes of a matmul swaps its operands: T(A @ B) = T(B) @ T(A).
- Pulled toward the inputs, a transpose disappears where it meets another transpose that undoes
  it, folds into a constant, or stays as a transpose of whatever it reaches, wherever that is
  cheapest.
- Sunk past the slices, pads and elementwise work that read it, a transpose moves only the parts
  that are sliced out, or lands on a matmul's operand.
The cost of a transpose is the elements it moves, none where only matmuls read it with their
operand's last two axes swapped (ONNX Runtime, BLAS and Inductor all take such an operand as it
is). A rewrite is applied only where it lowers that cost; results are unchanged up to the order
in which a matmul sums.

EfficientViT's linear attention is the case this was written for: it transposes its [heads, 3d,
HW] projection to [heads, HW, 3d], transposes k back to multiply it by v, and transposes the
result back again, three full-size transposes per block. Rewritten, the result comes out in the
projection's own layout and the one transpose left (of v) is an operand of a matmul. ONNX
Runtime's own optimizer pushes transposes through elementwise operators but stops at MatMul."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from korch.ir import Graph, Node
from korch.prims import Kind, Prim
from korch.rewrite.common import Emitter, replace_node, replace_values, rewrite_all

_ALONG = (Prim.SLICE, Prim.PAD, Prim.CONCAT, Prim.BROADCAST)  # layout work that permutes its attrs
_REDUCES = (Prim.REDUCE_SUM, Prim.REDUCE_PROD, Prim.REDUCE_MAX, Prim.REDUCE_MIN)
_DEPTH = 100  # primitives a pull passes at most, one after another (each costs two Python frames)


def pull_transposes(graph: Graph) -> tuple[Graph, list[str]]:
    """The graph with every profitable transpose pull applied, and one line per pull."""
    scanned: list[_Maps] = []  # of the graph the driver is scanning

    def attempt(graph: Graph, i: int, node: Node) -> tuple[Graph, str] | None:
        if node.prim is not Prim.TRANSPOSE:
            return None
        if not scanned or scanned[0].g is not graph:
            scanned[:] = [_Maps(graph)]
        return _Puller(scanned[0], i).apply() or _sink(scanned[0], i, node)

    return rewrite_all(graph, attempt)


class _Maps:
    """Who makes and who reads each value of a graph."""

    def __init__(self, graph: Graph):
        self.g = graph
        self.index = {v: i for i, n in enumerate(graph.nodes) for v in n.outputs}
        self.producer = graph.producers()
        self.readers: dict[str, list[Node]] = graph.consumers()


def _sink(maps: _Maps, i: int, node: Node) -> tuple[Graph, str] | None:
    """A transpose read only by slices, pads and elementwise work on it alone moves after them
    where that transposes less: each reader works on the untransposed value and only its result
    is transposed (a slice's result is smaller, a result that a matmul reads costs nothing)."""
    graph, readers = maps.g, maps.readers
    (x,), perm, t = node.inputs, tuple(node.a["perm"]), node.outputs[0]
    mine = readers.get(t, [])
    if t in graph.outputs or not mine or not all(_sinks(maps, r, t, i) for r in mine):
        return None
    moved = sum(_cost(graph, readers, r, perm) for r in mine)
    if moved >= graph.types[t].numel:
        return None
    em = Emitter(graph, node.origin)
    renamed = {}
    for r in mine:
        prim, attrs = _moved(r, _inverse(perm))
        part = em.emit(prim, [x if u == t else u for u in r.inputs], origin=r.origin, **attrs)
        renamed[r.outputs[0]] = em.emit(Prim.TRANSPOSE, [part], perm=perm)
    note = (
        f"{node.origin or 'transpose'}: transpose moved after {len(mine)} of its readers, "
        f"moves {moved} of {graph.types[t].numel} elements"
    )
    return replace_values(graph, i, em, renamed), note


def _sinks(maps: _Maps, reader: Node, t: str, i: int) -> bool:
    """Whether the transpose t at node i can move after this reader of it (its replacement is
    written at i, so a scalar it also reads must be known there)."""
    if reader.prim in (Prim.SLICE, Prim.PAD):
        return True
    others = [u for u in reader.inputs if u != t]
    return reader.kind is Kind.ELEMENTWISE and all(
        maps.g.types[u].rank == 0 and maps.index.get(u, -1) < i for u in others
    )


def _cost(graph: Graph, readers: dict[str, list[Node]], node: Node, perm=None) -> int:
    """The elements moved by transposing node's output by perm (by the node's own perm if not
    given): none where only matmuls read it and it swaps their operand's last two axes."""
    perm = tuple(node.a["perm"] if perm is None else perm)
    out = node.outputs[0]
    mine = readers.get(out, [])
    if mine and perm == _swap_last(len(perm)) and all(r.prim is Prim.MATMUL for r in mine):
        return 0
    return graph.types[out].numel


@dataclass
class _Way:
    """How to compute a transposed value: the transposes it leaves (value, perm -> elements),
    the values whose computation it redoes transposed, and the transposes it meets."""

    leaves: dict[tuple[str, tuple[int, ...]], int] = field(default_factory=dict)
    through: set[str] = field(default_factory=set)
    met: set[str] = field(default_factory=set)

    def add(self, other: _Way) -> None:
        self.leaves.update(other.leaves)
        self.through |= other.through
        self.met |= other.met

    @property
    def cost(self) -> int:
        return sum(self.leaves.values())


class _Puller:
    """Pulls the transpose at node `root` of a graph: chooses, for each value it reaches, whether
    to transpose it there or to pull further, then checks that what it redoes transposed is read
    by nothing else. A value read by a transpose left at a reader is pulled through that reader
    too (the choice was made without seeing the value's other readers); one read from outside,
    or as it is by a matmul, is transposed where it is. The choice is then made again."""

    def __init__(self, maps: _Maps, root: int):
        self.g, self.producer, self.readers = maps.g, maps.producer, maps.readers
        self.root = self.g.nodes[root]
        self.index = root
        self.kept: set[str] = set(self.g.outputs)  # values that must be transposed where they are
        self.forced: set[str] = set()  # values that must be pulled through where they can
        # (matmul output, operand, perm): an operand left transposed, for the matmul to take
        self.operands: set[tuple[str, str, tuple[int, ...]]] = set()
        self.depth = 0

    @cached_property
    def above_root(self) -> set[str]:
        return _ancestors(self.producer, self.root.inputs[0])

    def apply(self) -> tuple[Graph, str] | None:
        (x,), perm = self.root.inputs, tuple(self.root.a["perm"])
        while True:
            self.ways: dict[tuple[str, tuple[int, ...]], _Way] = {}
            self.operands.clear()
            way = self._way(x, perm)
            inner = way.through | {self.root.outputs[0]}
            outside = {
                (v, r.outputs[0]) for v in way.through for r in self.readers[v] if r.outputs[0] not in inner
            }
            # a matmul operand left as it is, and also redone transposed for another reader
            twice = way.through & {u for _, u, _ in self.operands}
            if not outside and not twice:
                break
            self.kept |= twice
            for v, read in outside:
                below = self._below(read)
                if below and not below <= self.forced:
                    self.forced |= below
                else:
                    self.kept.add(v)
        removed = _cost(self.g, self.readers, self.root) + self._freed(way, inner)
        if way.cost >= removed:
            return None
        em = Emitter(self.g, self.root.origin)
        y = self._emit(em, x, perm, {})
        note = (
            f"{self.root.origin or 'transpose'}: transpose pulled through {len(way.through)} "
            f"primitives, moves {way.cost} of {removed} elements"
        )
        return replace_node(self.g, self.index, em, y), note

    def _below(self, v: str) -> set[str]:
        """v and the values between it and the root's input, if the root reads v at all."""
        if v not in self.above_root:
            return set()
        found, todo = {v}, [v]
        while todo:
            for r in self.readers.get(todo.pop(), []):
                u = r.outputs[0]
                if u in self.above_root and u not in found:
                    found.add(u)
                    todo.append(u)
        return found

    def _numel(self, v: str) -> int:
        return self.g.types[v].numel

    def _freed(self, way: _Way, inner: set[str]) -> int:
        """Elements of the transposes the way meets that nothing outside `inner` reads."""
        return sum(
            _cost(self.g, self.readers, self.producer[t])
            for t in way.met
            if t not in self.g.outputs and all(r.outputs[0] in inner for r in self.readers[t])
        )

    # -------------------------------------------------------------- choosing

    def _way(self, v: str, perm: tuple[int, ...]) -> _Way:
        key = (v, perm)
        if key not in self.ways:
            here = _Way(leaves={} if _identity(perm) else {key: self._numel(v)})
            self.depth += 1
            pulled = self._pulled(v, perm) if self.depth <= _DEPTH else None
            self.depth -= 1
            better = pulled is not None and (
                v in self.forced or pulled.cost - self._freed(pulled, pulled.through) <= here.cost
            )
            self.ways[key] = pulled if better else here
        return self.ways[key]

    def _pulled(self, v: str, perm: tuple[int, ...]) -> _Way | None:
        """The way that pulls the transpose through v's producer, or None where it cannot."""
        if _identity(perm) or v in self.g.constants:
            return _Way()
        node = self.producer.get(v)
        if node is None or len(node.outputs) != 1:
            return None
        if node.prim is Prim.TRANSPOSE:
            (y,), q = node.inputs, node.a["perm"]
            way = self._way(y, tuple(q[p] for p in perm))
            return _Way(dict(way.leaves), set(way.through), way.met | {v})
        if v in self.kept:
            return None
        moves = _moves(self.g, node, perm)
        if moves is None:
            return None
        way = _Way(through={v})
        for u, p in moves:
            part = self._way(u, p)
            if node.prim is Prim.MATMUL and part.cost > 0:
                self.operands.add((v, u, p))
                part = _Way()
            way.add(part)
        return way

    # -------------------------------------------------------------- emitting

    def _emit(self, em: Emitter, v: str, perm: tuple[int, ...], done: dict) -> str:
        key = (v, perm)
        if key in done:
            return done[key]
        way = self.ways.get(key)
        if _identity(perm):
            out = v
        elif v in self.g.constants:
            out = em.const(np.transpose(self.g.constants[v], perm))
        elif way is None or key in way.leaves:
            out = em.emit(Prim.TRANSPOSE, [v], perm=perm)
        else:
            node = self.producer[v]
            if node.prim is Prim.TRANSPOSE:
                q = node.a["perm"]
                out = self._emit(em, node.inputs[0], tuple(q[p] for p in perm), done)
            else:
                inputs = [
                    em.emit(Prim.TRANSPOSE, [u], perm=p)
                    if (v, u, p) in self.operands
                    else self._emit(em, u, p, done)
                    for u, p in _moves(self.g, node, perm)
                ]
                prim, attrs = _moved(node, perm)
                out = em.emit(prim, inputs, origin=node.origin, **attrs)
        done[key] = out
        return out


def _ancestors(producer: dict[str, Node], x: str) -> set[str]:
    """x and every value it is computed from."""
    found, todo = {x}, [x]
    while todo:
        node = producer.get(todo.pop())
        for u in node.inputs if node else ():
            if u not in found:
                found.add(u)
                todo.append(u)
    return found


def _identity(perm) -> bool:
    return tuple(perm) == tuple(range(len(perm)))


def _inverse(perm) -> tuple[int, ...]:
    return tuple(int(i) for i in np.argsort(perm))


def _moves(graph: Graph, node: Node, perm: tuple[int, ...]) -> list[tuple[str, tuple[int, ...]]] | None:
    """The transposes of node's inputs that give its output transposed by perm, in input order
    (in the swapped order for a matmul), or None where the transpose cannot pass the node."""
    rank = len(perm)
    if node.kind is Kind.ELEMENTWISE:
        return [(u, perm if graph.types[u].rank else ()) for u in node.inputs]
    if node.prim in _REDUCES or node.prim in _ALONG:
        if node.prim is Prim.BROADCAST and graph.types[node.inputs[0]].rank != rank:
            return None
        return [(u, perm) for u in node.inputs]
    if node.prim is Prim.MATMUL:
        a, b = node.inputs
        if perm != _swap_last(rank):
            return None
        return [(u, _swap_last(graph.types[u].rank)) for u in (b, a)]
    return None


def _swap_last(rank: int) -> tuple[int, ...]:
    return (*range(rank - 2), rank - 1, rank - 2)


def _moved(node: Node, perm: tuple[int, ...]) -> tuple[Prim, dict]:
    """Node's primitive and attributes for its output transposed by perm."""
    a = node.a
    if node.prim is Prim.SLICE:
        return node.prim, {k: tuple(a[k][p] for p in perm) for k in ("starts", "steps", "sizes")}
    if node.prim is Prim.PAD:
        rank = len(perm)
        begins, ends = a["pads"][:rank], a["pads"][rank:]
        pads = tuple(begins[p] for p in perm) + tuple(ends[p] for p in perm)
        return node.prim, {**a, "pads": pads}
    if node.prim is Prim.CONCAT:
        return node.prim, {"axis": _inverse(perm)[a["axis"]]}
    if node.prim is Prim.BROADCAST:
        return node.prim, {"shape": tuple(a["shape"][p] for p in perm)}
    if node.prim in _REDUCES:
        inverse = _inverse(perm)
        return node.prim, {**a, "axes": tuple(sorted(inverse[x] for x in a["axes"]))}
    return node.prim, a
