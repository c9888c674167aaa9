"""Transpose pulling and sinking, a layout rewrite of the primitive graph before candidates are
enumerated.

A transpose commutes with most primitives: T(f(x)) = f'(T(x)) for elementwise work, broadcasts,
reductions, slices, pads and concatenations (their axes permuted), and a transpose that swaps
the last two axes of a matmul swaps its operands: T(A @ B) = T(B) @ T(A).
- Pulled toward the inputs, a transpose disappears where it meets another transpose that undoes
  it, folds into a constant, or stays as a transpose of whatever it reaches, wherever that is
  cheapest.
- Sunk past the work below it that can run on the untransposed value instead (elementwise work
  on what it computes, such as a GELU that reads it twice, and reductions, slices and pads), a
  transpose moves only the parts that are sliced out, lands on a matmul's operand, or meets a
  transpose that undoes it. It goes as far as that moves less.
- A transpose that moves only axes of size 1 is a reshape.
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

import heapq
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from korch.ir.graph import Graph, Node
from korch.ir.prims import Kind, Prim
from korch.rewrite.common import Emitter, GraphMaps, per_graph, replace_node, replace_values, rewrite_all

_ALONG = (Prim.SLICE, Prim.PAD, Prim.CONCAT, Prim.BROADCAST)  # layout work that permutes its attrs
_REDUCES = (Prim.REDUCE_SUM, Prim.REDUCE_PROD, Prim.REDUCE_MAX, Prim.REDUCE_MIN)
_DEPTH = 100  # primitives a pull passes at most, one after another (each costs two Python frames)
_REGION = 200  # primitives a transpose moves after at most


def pull_transposes(graph: Graph) -> tuple[Graph, list[str]]:
    """The graph with every profitable transpose pull applied, and one line per pull."""
    maps = per_graph(GraphMaps)

    def attempt(graph: Graph, i: int, node: Node) -> tuple[Graph, str] | None:
        if node.prim is not Prim.TRANSPOSE:
            return None
        return _as_reshape(graph, i, node) or _Puller(maps(graph), i).apply() or _sink(maps(graph), i, node)

    return rewrite_all(graph, attempt)


def _as_reshape(graph: Graph, i: int, node: Node) -> tuple[Graph, str] | None:
    """A transpose that moves only axes of size 1 moves no data: it is a reshape (Segformer's
    first stage splits its one attention head off and back that way)."""
    (x,), (y,) = node.inputs, node.outputs
    shape = graph.types[x].shape
    moved = [a for a in node.a["perm"] if shape[a] != 1]
    if moved != sorted(moved):
        return None
    em = Emitter(graph, node.origin)
    out = em.emit(Prim.RESHAPE, [x], shape=graph.types[y].shape)
    note = f"{node.origin or 'transpose'}: moves axes of size 1 only, a reshape"
    return replace_node(graph, i, em, out), note


def _sink(maps: GraphMaps, i: int, node: Node) -> tuple[Graph, str] | None:
    """The transpose at node i moved after the work below it that can run on the untransposed
    value instead, where the values that leave that work cost less to transpose: a slice's
    result is smaller, a result that a matmul reads costs nothing, one read by another
    transpose composes with it (and may cancel)."""
    sinker = _Sinker(maps, i)
    members = sinker.trimmed(sinker.grown())
    before, after = sinker.costs(members)
    if not members or after >= before:
        return None
    note = (
        f"{node.origin or 'transpose'}: transpose moved after {len(members)} primitives, "
        f"moves {after} of {before} elements"
    )
    return sinker.emit(members), note


class _Sinker:
    """The work below a transpose T(x) that can run on x instead: elementwise work, reductions,
    broadcasts, slices, pads and concatenations of what T(x) computes, their other inputs
    scalars known before the transpose or constants (transposed back). A set of that work (its
    members, by output value) is closed: what a member reads from the work is a member's."""

    def __init__(self, maps: GraphMaps, i: int):
        self.g, self.readers, self.index, self.i = maps.g, maps.readers, maps.index, i
        root = self.g.nodes[i]
        self.root, self.x, self.t = root, root.inputs[0], root.outputs[0]
        self.perm = tuple(root.a["perm"])
        self.back = _inverse(self.perm)

    def _node(self, v: str) -> Node:
        return self.g.nodes[self.index[v]]

    def grown(self) -> set[str]:
        """All such work, up to _REGION primitives."""
        members: set[str] = set()
        seen: set[str] = set()
        todo = [(self.index[r.outputs[0]], r.outputs[0]) for r in self.readers.get(self.t, [])]
        heapq.heapify(todo)
        while todo and len(members) < _REGION:
            _, out = heapq.heappop(todo)
            if out in seen:
                continue
            seen.add(out)  # in graph order: whatever it reads from the work has been decided
            if self._joins(self._node(out), members):
                members.add(out)
                for r in self.readers.get(out, []):
                    heapq.heappush(todo, (self.index[r.outputs[0]], r.outputs[0]))
        return members

    def _joins(self, node: Node, members: set[str]) -> bool:
        # what a transpose passes (_moves), but a matmul: it takes a transposed operand as it is
        if len(node.outputs) != 1 or node.prim is Prim.MATMUL or _moves(self.g, node, self.back) is None:
            return False
        for u in node.inputs:
            if u == self.t or u in members:
                continue
            scalar = self.g.types[u].rank == 0
            if u in self.g.constants and (scalar or node.prim not in (Prim.SLICE, Prim.PAD)):
                continue  # a constant is transposed back
            if not (scalar and self.index.get(u, -1) < self.i):
                return False  # (the work is written where the transpose was)
        return True

    def trimmed(self, members: set[str]) -> set[str]:
        """The cheapest of the sets met while peeling members that no member reads off one at
        a time, always the one whose leaving costs least (a slice that a larger pad reads
        stays, the pad goes)."""
        members = set(members)
        net = sum(self._value_cost(v, members) for v in (self.t, *members))
        best, best_net = set(members), net
        while members:
            leaves = [v for v in members if not any(r.outputs[0] in members for r in self.readers.get(v, []))]
            delta, out = min((self._peel_cost(members, v), v) for v in leaves)
            members.discard(out)
            net += delta
            if net <= best_net:
                best, best_net = set(members), net
        return best

    def _peel_cost(self, members: set[str], out: str) -> int:
        """How the cost changes when member `out`, which no member reads, leaves the set."""
        fewer = members - {out}
        read = {u for u in self._node(out).inputs if u == self.t or u in members}
        return -self._value_cost(out, members) + sum(
            self._value_cost(u, fewer) - self._value_cost(u, members) for u in read
        )

    def _value_cost(self, v: str, members: set[str]) -> int:
        """Elements transposed for v's readers outside the members after the move, less those
        the transposes among them moved before."""
        before, after = self._value_costs(v, members)
        return after - before

    def _value_costs(self, v: str, members: set[str]) -> tuple[int, int]:
        """Elements transposed for v's readers outside the members: before the move (by the
        transposes among them), and after (v's own transpose, and those composed with them)."""
        plain, composed = self._leaving(v, members)
        before = sum(_cost(self.g, self.readers, q) for q in composed)
        after = _elements(self.g, v, self.perm, plain) if plain else 0
        return before, after + sum(self._composed_cost(q) for q in composed)

    def costs(self, members: set[str]) -> tuple[int, int]:
        """Elements transposed before and after moving the transpose after `members`: the
        root and the transposes that read what they compute, against the transposes of the
        values that leave them."""
        before, after = _cost(self.g, self.readers, self.root), 0
        for v in (self.t, *members):
            b, a = self._value_costs(v, members)
            before, after = before + b, after + a
        return before, after

    def _leaving(self, v: str, members: set[str]) -> tuple[list[Node | None], list[Node]]:
        """v's readers outside the members (None for a graph output), and the transposes among them."""
        plain: list[Node | None] = [None] if v in self.g.outputs else []
        composed = []
        for r in self.readers.get(v, []):
            if r.outputs[0] not in members:
                (composed if r.prim is Prim.TRANSPOSE else plain).append(r)
        return plain, composed

    def _then(self, q: Node) -> tuple[int, ...]:
        """The one transpose that does the root's and then q's."""
        return tuple(self.perm[k] for k in q.a["perm"])

    def _composed_cost(self, q: Node) -> int:
        perm = self._then(q)
        return 0 if _identity(perm) else _cost(self.g, self.readers, q, perm)

    def emit(self, members: set[str]) -> Graph:
        em = Emitter(self.g, self.root.origin)
        new = {self.t: self.x}
        order = sorted(members, key=self.index.__getitem__)  # (sets differ in order between runs)
        for out in order:
            node = self._node(out)
            prim, attrs = _moved(node, self.back)
            inputs = [self._untransposed(em, u, new) for u in node.inputs]
            new[out] = em.emit(prim, inputs, origin=node.origin, **attrs)
        renamed = {}
        for v in (self.t, *order):
            plain, composed = self._leaving(v, members)
            if plain:
                renamed[v] = em.emit(Prim.TRANSPOSE, [new[v]], perm=self.perm)
            for q in composed:
                perm = self._then(q)
                renamed[q.outputs[0]] = (
                    new[v] if _identity(perm) else em.emit(Prim.TRANSPOSE, [new[v]], perm=perm)
                )
        return replace_values(self.g, self.i, em, renamed)

    def _untransposed(self, em: Emitter, u: str, new: dict[str, str]) -> str:
        if u in new:
            return new[u]
        if u in self.g.constants and self.g.types[u].rank:
            return em.const(_transposed(self.g.constants[u], self.back))
        return u


def _cost(graph: Graph, readers: dict[str, list[Node]], node: Node, perm=None) -> int:
    """The elements moved by the transpose `node` (by perm instead of its own, if given)."""
    out = node.outputs[0]
    return _elements(graph, out, tuple(node.a["perm"] if perm is None else perm), readers.get(out, []))


def _elements(graph: Graph, v: str, perm: tuple[int, ...], readers: list[Node | None]) -> int:
    """The elements moved by transposing v by perm for `readers` (None: a graph output): none
    where they are all matmuls and it swaps their operand's last two axes."""
    swap = perm == _swap_last(len(perm))
    if readers and swap and all(r is not None and r.prim is Prim.MATMUL for r in readers):
        return 0
    return graph.types[v].numel


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

    def __init__(self, maps: GraphMaps, root: int):
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
            out = em.const(_transposed(self.g.constants[v], perm))
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


def _transposed(array: np.ndarray, perm: tuple[int, ...]) -> np.ndarray:
    """A constant transposed, with leading axes of size 1 added first when it has fewer (as
    broadcasting aligns it)."""
    return np.transpose(array.reshape((1,) * (len(perm) - array.ndim) + array.shape), perm)


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
    if node.prim is Prim.BROADCAST:
        (u,) = node.inputs
        if graph.types[u].rank != rank and u not in graph.constants:
            return None  # (a bias broadcast from fewer axes is transposed as a constant)
    if node.prim in _REDUCES or node.prim in _ALONG:
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
