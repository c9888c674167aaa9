"""Linear-map folding, an algebraic rewrite of the primitive graph before candidates are enumerated.

A *mixing map* is a 1x1 convolution or a matmul by a constant matrix: it mixes one axis of its
input with a constant matrix M [C_in, C_out]. Such a map can move toward its producers:

- through any subgraph that is linear in the moving value and treats every position along the
  mixed axis alike (layout changes, gathers and slices along other axes, resizes, additions of two
  such values, products with constants that do not vary along the axis): mix(R(t)) = R'(mix(t)),
  where R' is R with the axis resized to C_out. Constant additions are affine: mix(u + c) =
  mix(u) + mix(c), with mix(c) computed once here;
- through a concatenation along the mixed axis: mix(concat(x_i)) = sum_i mix_i(x_i), M split by rows;
- into a producing matmul by a constant W, or a convolution: mix(x @ W) = x @ (W M).

Segformer's all-MLP decoder is the textbook case: four linear layers, bilinear upsampling, a
concatenation and a 1x1 convolution become four linear layers whose weights already contain the
convolution, so its work disappears. A rewrite is applied only when the FLOPs it leaves are
less than GAIN of those it replaces; results change by float rounding only (reassociation)."""

from __future__ import annotations

import heapq
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from korch.config import GAIN
from korch.ir.graph import Graph, Node
from korch.ir.prims import FLOAT_DTYPES, Prim
from korch.rewrite.common import Emitter, GraphMaps, per_graph, replace_node, rewrite_all, unit_conv

# region nodes that do arithmetic: resizing the mixed axis changes their work (layout nodes count 0)
_ARITHMETIC = (Prim.ADD, Prim.SUB, Prim.MUL, Prim.NEG, Prim.REDUCE_SUM)


@dataclass
class _Option:
    """One way to compute a mixed value: its FLOPs net of the work it makes unnecessary (so
    possibly negative), and a function that emits it and returns the value's name."""

    flops: float
    emit: Callable[[Emitter], str]


def fold_linear_maps(graph: Graph) -> tuple[Graph, list[str]]:
    """The graph with every profitable mixing-map fold applied, and one line per fold."""
    folders = per_graph(_Folder)

    def attempt(graph: Graph, i: int, node: Node) -> tuple[Graph, str] | None:
        folder = folders(graph)
        mix = folder.mixing(node)
        if mix is None:
            return None
        x, pos, m = mix
        before = graph.types[x].numel * m.shape[1] * 2
        if before == 0:
            return None
        best = folder.hoist(x, pos, m, i)
        if best.flops >= GAIN * before:
            return None
        note = (
            f"{node.origin or node.prim.value}: {m.shape[0]}->{m.shape[1]} mix folded, "
            f"saves {(before - best.flops) / 1e9:.3f} of its {before / 1e9:.3f} GFLOP"
        )
        return folder.apply(i, best), note

    return rewrite_all(graph, attempt)


class _Folder(GraphMaps):
    def __init__(self, graph: Graph):
        super().__init__(graph)
        self.uses = {v: {self.index[r.outputs[0]] for r in rs} for v, rs in self.readers.items()}
        self.outputs = set(graph.outputs)

    def private(self, v: str, members: set[int], x: str, consumer: int) -> bool:
        """Whether a rewrite of x (read by node `consumer`) may replace v: v is read only by the
        region's members, and x itself exactly once, by the consumer. So two parts of one
        concatenation never claim the same producer."""
        if v in self.outputs:
            return False
        readers = self.uses.get(v, set())
        if v == x:
            return readers == {consumer} and self.g.nodes[consumer].inputs.count(x) == 1
        return readers <= members

    def constant(self, v: str, rank: int) -> np.ndarray | None:
        """v's value if it is a constant or a broadcast of one, before the broadcast, with leading
        axes of extent 1 up to `rank`."""
        array = self.g.constants.get(v)
        if array is None:
            node = self.producer.get(v)
            if node is None or node.prim is not Prim.BROADCAST or node.inputs[0] not in self.g.constants:
                return None
            array = self.g.constants[node.inputs[0]]
        return array.reshape((1,) * (rank - array.ndim) + array.shape)

    # ---------------------------------------------------------------- where a map starts

    def mixing(self, node: Node) -> tuple[str, int, np.ndarray] | None:
        """(input, mixed axis, M [C_in, C_out]) when node is a mixing map with constant float
        weights (a convolution's weight [C_out, C_in, 1, ...] is transposed to that)."""
        if len(node.inputs) != 2 or node.inputs[1] not in self.g.constants:
            return None
        x, w = node.inputs[0], self.g.constants[node.inputs[1]]
        if node.inputs[0] in self.g.constants or self.g.types[x].dtype not in FLOAT_DTYPES:
            return None
        a = node.a
        if node.prim is Prim.MATMUL and w.ndim == 2:
            return x, self.g.types[x].rank - 1, w
        if (
            unit_conv(self.g, node)
            and a["group"] == 1
            and all(k == 1 for k in w.shape[2:])
            and not any(a["pads"])
        ):
            return x, 1, w.reshape(w.shape[:2]).T
        return None

    # ---------------------------------------------------------------- moving it up

    def hoist(self, x: str, pos: int, m: np.ndarray, consumer: int) -> _Option:
        """The cheapest way found to compute x (read by node `consumer`) mixed along axis `pos`
        by m: the map moved up through the region above x and landed at its entries."""
        c_in, c_out = m.shape
        region, pos_of, entries = self._region(x, pos, consumer)
        at_entries = {e: self._land(e, pos_of[e], m, region, x, consumer) for e in entries}
        arithmetic = [self.g.nodes[i].outputs[0] for i in region if self.g.nodes[i].prim in _ARITHMETIC]
        resized = sum(self.g.types[v].numel for v in arithmetic) * (c_out - c_in) / c_in

        def emit(em: Emitter) -> str:
            new = {e: option.emit(em) for e, option in at_entries.items()}
            for i in sorted(region):
                node = self.g.nodes[i]
                new[node.outputs[0]] = self._reemit(em, node, pos_of, new, m)
            return new[x]

        return _Option(sum(o.flops for o in at_entries.values()) + resized, emit)

    def _region(self, x: str, pos: int, consumer: int) -> tuple[set[int], dict[str, int], list[str]]:
        """The nodes above x that the map can move through (each read only inside), the mixed axis
        in every value they touch, and the values where the map lands (entries)."""
        pos_of = {x: pos}
        members: set[int] = set()
        heap = [-self.index[x]] if x in self.index else []  # a max-heap of node indices
        while heap:  # latest producer first: all of a value's readers are decided before it
            i = -heapq.heappop(heap)
            node = self.g.nodes[i]
            if i in members or len(node.outputs) != 1:
                continue
            v = node.outputs[0]
            if self.g.types[v].dtype not in FLOAT_DTYPES or not self.private(v, members, x, consumer):
                continue
            ins = self._through(node, pos_of[v])
            if ins is None or any(pos_of.get(w, p) != p for w, p in ins.items()):
                continue
            members.add(i)
            pos_of.update(ins)
            for w in ins:
                if w in self.index:
                    heapq.heappush(heap, -self.index[w])
        produced = {self.g.nodes[i].outputs[0] for i in members}
        return members, pos_of, [v for v in pos_of if v not in produced]

    def _through(self, node: Node, pos: int) -> dict[str, int] | None:
        """The mixed axis in each input of node that carries it, if node is linear (affine with
        constants) in those inputs and treats every position along the axis alike; else None."""
        p, a, ins = node.prim, node.a, node.inputs
        out = self.g.types[node.outputs[0]]
        types = [self.g.types[v] for v in ins]
        if p in (Prim.ADD, Prim.SUB, Prim.NEG, Prim.MUL):
            moving = [v for v in ins if self.constant(v, out.rank) is None]
            if not moving or any(self.g.types[v].rank != out.rank for v in moving):
                return None
            if p is Prim.MUL:
                fixed = [self.constant(v, out.rank) for v in ins if v not in moving]
                if len(moving) != 1 or _uniform(fixed[0], pos) is None:
                    return None
            return {v: pos for v in moving}
        if ins[0] in self.g.constants:
            return None
        if p is Prim.TRANSPOSE:
            return {ins[0]: a["perm"][pos]}
        if p is Prim.RESHAPE:
            before = int(np.prod(out.shape[:pos]))
            for j, extent in enumerate(types[0].shape):
                if extent == out.shape[pos] and int(np.prod(types[0].shape[:j])) == before:
                    return {ins[0]: j}
            return None
        if p is Prim.GATHER:
            k, axis = types[1].rank, a["axis"]
            if pos < axis:
                return {ins[0]: pos}
            return {ins[0]: pos - k + 1} if pos >= axis + k else None
        if p is Prim.SLICE:
            full = a["starts"][pos] == 0 and a["steps"][pos] == 1 and a["sizes"][pos] == types[0].shape[pos]
            return {ins[0]: pos} if full else None
        if p is Prim.PAD:
            linear = a["mode"] != "constant" or a["value"] == 0
            untouched = a["pads"][pos] == 0 and a["pads"][out.rank + pos] == 0
            return {ins[0]: pos} if linear and untouched else None
        if p is Prim.BROADCAST:
            j = pos - (out.rank - types[0].rank)
            return {ins[0]: j} if j >= 0 and types[0].shape[j] == out.shape[pos] else None
        if p is Prim.REDUCE_SUM:
            return None if pos in a["axes"] else {ins[0]: pos}
        if p is Prim.WINDOW:
            return {ins[0]: pos} if pos < types[0].rank - len(a["kernel"]) else None
        if p is Prim.CONCAT and a["axis"] != pos and not any(v in self.g.constants for v in ins):
            return {v: pos for v in ins}
        return None

    def _land(self, e: str, pos: int, m: np.ndarray, region: set[int], x: str, consumer: int) -> _Option:
        """Where the map lands at entry e: as a mixing node there, split over a concatenation,
        or folded into the matmul or convolution that produces e."""
        t = self.g.types[e]
        c_in, c_out = m.shape
        options = [_Option(t.numel * c_out * 2, lambda em: _materialize(em, e, pos, m))]
        node = self.producer.get(e)
        if node is None or not self.private(e, region, x, consumer):
            return options[0]
        consts = self.g.constants
        if node.prim is Prim.CONCAT and node.a["axis"] == pos and not any(v in consts for v in node.inputs):
            cuts = np.cumsum([self.g.types[v].shape[pos] for v in node.inputs])[:-1]
            me = self.index[e]
            pieces = zip(node.inputs, np.split(m, cuts))
            parts = [self.hoist(v, pos, piece, me) for v, piece in pieces if piece.shape[0]]
            adds = t.numel // c_in * c_out * (len(parts) - 1)
            options.append(_Option(sum(o.flops for o in parts) + adds, lambda em: _sum(em, parts)))
        elif node.prim is Prim.MATMUL and pos == t.rank - 1 and node.inputs[1] in consts:
            z, w = node.inputs[0], consts[node.inputs[1]]
            if w.ndim == 2 and z not in consts:
                work = self.g.types[z].numel * (c_out - c_in) * 2
                folded = (w.astype(np.float64) @ m).astype(w.dtype)
                options.append(
                    _Option(work, lambda em: em.emit(Prim.MATMUL, [z, em.const(folded)], node.origin))
                )
        elif node.prim is Prim.CONV and pos == 1 and node.a["group"] == 1 and node.inputs[1] in consts:
            z, w = node.inputs[0], consts[node.inputs[1]]
            if z not in consts:
                work = t.numel // c_in * (c_out - c_in) * int(np.prod(w.shape[1:])) * 2
                folded = np.tensordot(m.T.astype(np.float64), w, axes=1).astype(w.dtype)
                options.append(
                    _Option(work, lambda em: em.emit(Prim.CONV, [z, em.const(folded)], node.origin, **node.a))
                )
        return min(options, key=lambda o: o.flops)

    def _reemit(self, em: Emitter, node: Node, pos_of: dict[str, int], new: dict[str, str], m) -> str:
        """node again, on the mixed inputs (its mixed axis now C_out long)."""
        out = self.g.types[node.outputs[0]]
        pos = pos_of[node.outputs[0]]
        shape = list(out.shape)
        shape[pos] = m.shape[1]
        inputs = []
        for v in node.inputs:
            c = self.constant(v, out.rank) if node.prim in (Prim.ADD, Prim.SUB, Prim.MUL) else None
            if c is None:
                inputs.append(new.get(v, v))  # a mixed value, or one the map does not touch (indices)
            elif node.prim is Prim.MUL:
                scale = _uniform(c, pos)
                inputs.append(v if self.g.types[v].rank == 0 else _broadcast(em, scale, shape))
            else:  # an added constant is mixed too
                inputs.append(_broadcast(em, _mix_constant(c, pos, m).astype(out.dtype), shape))
        attrs = node.a
        if node.prim in (Prim.RESHAPE, Prim.BROADCAST):
            attrs["shape"] = shape
        if node.prim is Prim.SLICE:
            attrs["sizes"] = tuple(shape)
        return em.emit(node.prim, inputs, node.origin, **attrs)

    def apply(self, i: int, option: _Option) -> Graph:
        """The graph with node i's output computed by `option` instead."""
        em = Emitter(self.g, self.g.nodes[i].origin)
        return replace_node(self.g, i, em, option.emit(em))


def _uniform(c: np.ndarray, pos: int) -> np.ndarray | None:
    """c with extent 1 along pos, if it does not vary along pos."""
    first = c.take([0], axis=pos)
    return first if np.array_equal(np.broadcast_to(first, c.shape), c) else None


def _mix_constant(c: np.ndarray, pos: int, m: np.ndarray) -> np.ndarray:
    full = np.broadcast_to(c, c.shape[:pos] + (m.shape[0],) + c.shape[pos + 1 :]).astype(np.float64)
    return np.moveaxis(np.tensordot(np.moveaxis(full, pos, -1), m.astype(np.float64), axes=1), -1, pos)


def _broadcast(em: Emitter, array: np.ndarray, shape) -> str:
    return em.emit(Prim.BROADCAST, [em.const(array)], shape=tuple(shape))


def _sum(em: Emitter, parts: list[_Option]) -> str:
    total = parts[0].emit(em)
    for part in parts[1:]:
        total = em.emit(Prim.ADD, [total, part.emit(em)])
    return total


def _materialize(em: Emitter, e: str, pos: int, m: np.ndarray) -> str:
    """e mixed along pos by m, as one matmul (or a 1x1 convolution on a channel axis)."""
    t = em.types[e]
    m = m.astype(t.dtype)
    c_in, c_out = m.shape
    if pos == 1 and 3 <= t.rank <= 5:  # a 1-3d convolution
        return em.conv(e, m.T.reshape(c_out, c_in, *(1,) * (t.rank - 2)))
    if t.rank == 1:
        row = em.emit(Prim.RESHAPE, [e], shape=(1, c_in))
        return em.emit(Prim.RESHAPE, [em.emit(Prim.MATMUL, [row, em.const(m)])], shape=(c_out,))
    if pos == t.rank - 1:
        return em.emit(Prim.MATMUL, [e, em.const(m)])
    perm = [i for i in range(t.rank) if i != pos] + [pos]
    moved = em.emit(Prim.MATMUL, [em.emit(Prim.TRANSPOSE, [e], perm=perm), em.const(m)])
    return em.emit(Prim.TRANSPOSE, [moved], perm=tuple(int(i) for i in np.argsort(perm)))
