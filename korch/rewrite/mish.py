"""Mish in one exp and a division, a rewrite of the primitive graph before candidates are enumerated.

The importers write Mish (ONNX's Mish; Softplus, Tanh and Mul as exporters spell it; torch's mish)
as x * tanh(softplus(x)), softplus as max(x, 0) + log(exp(-|x|) + 1)
(korch.frontend.ops.elementwise.softplus_core): an exp, a log and a tanh per element, which a
generated loop computes in full. With n = exp(x), tanh(log(1 + n)) = ((1 + n)^2 - 1) / ((1 + n)^2 + 1)
= m / (m + 2) where m = n * (n + 2), so Mish is x * m / (m + 2): one exp and a division. n is taken of
min(x, cap): past the cap m / (m + 2) rounds to 1 in the dtype, as tanh(softplus(x)) does, and below
it m does not overflow (CAPS). Applied wherever the pattern appears: less work on every device."""

from __future__ import annotations

import numpy as np

from korch.ir.graph import Graph, Node
from korch.ir.prims import Prim
from korch.rewrite.common import Emitter, GraphMaps, per_graph, replace_node, rewrite_all

# m / (m + 2) rounds to 1 from x = 4.5 on in float16, 3.5 in bfloat16, 9.1 in float32, 19.1 in
# float64; m overflows past 5.5 in float16, 44 in bfloat16 and float32, 354 in float64
CAPS = {"float16": 5.0, "bfloat16": 20.0, "float32": 20.0, "float64": 20.0}

_maps = per_graph(GraphMaps)


def cheaper_mish(graph: Graph) -> tuple[Graph, list[str]]:
    """The graph with every x * tanh(softplus(x)) computed as x * m / (m + 2)."""

    def attempt(graph: Graph, i: int, node: Node) -> tuple[Graph, str] | None:
        x = _mish_input(_maps(graph), node)
        if x is None:
            return None
        em = Emitter(graph, node.origin)
        dtype = graph.types[x].dtype
        n = em.emit(Prim.EXP, [em.emit(Prim.MIN, [x, em.const(np.array(CAPS[dtype], dtype))])])
        two = em.const(np.array(2, dtype))
        m = em.emit(Prim.MUL, [n, em.emit(Prim.ADD, [n, two])])
        y = em.emit(Prim.MUL, [x, em.emit(Prim.DIV, [m, em.emit(Prim.ADD, [m, two])])])
        return replace_node(graph, i, em, y), f"{node.origin or 'mish'}: Mish as one exp and a division"

    return rewrite_all(graph, attempt)


def _mish_input(maps: GraphMaps, node: Node) -> str | None:
    """x where `node` is x * tanh(max(x, 0) + log(exp(-|x|) + 1)), its inner values read by the
    pattern alone."""
    if node.prim is not Prim.MUL:
        return None
    for x, gate in (node.inputs, node.inputs[::-1]):
        tanh = _inner(maps, gate, Prim.TANH)
        total = tanh and _inner(maps, tanh.inputs[0], Prim.ADD)
        if not total or maps.g.types[x].dtype not in CAPS:
            continue
        for relu_v, log_v in (total.inputs, total.inputs[::-1]):
            relu = _inner(maps, relu_v, Prim.MAX)
            log = _inner(maps, log_v, Prim.LOG)
            one = log and _inner(maps, log.inputs[0], Prim.ADD)
            if not relu or _with_scalar(maps, relu) != (x, 0.0) or not one:
                continue
            tail = _with_scalar(maps, one)
            exp = tail and tail[1] == 1.0 and _inner(maps, tail[0], Prim.EXP)
            neg = exp and _inner(maps, exp.inputs[0], Prim.NEG)
            absolute = neg and _inner(maps, neg.inputs[0], Prim.ABS)
            if absolute and absolute.inputs[0] == x:
                return x
    return None


def _inner(maps: GraphMaps, v: str, prim: Prim) -> Node | None:
    """The node of kind `prim` making v, where v is read once and is no output of the graph."""
    node = maps.producer.get(v)
    if node is None or node.prim is not prim or v in maps.g.outputs or len(maps.readers.get(v, ())) != 1:
        return None
    return node


def _with_scalar(maps: GraphMaps, node: Node) -> tuple[str, float] | None:
    """(x, c) for a binary primitive of x and a one-element constant c, in either order."""
    for a, b in (node.inputs, node.inputs[::-1]):
        c = maps.g.constants.get(b)
        if c is not None and c.size == 1:
            return a, float(c.reshape(-1)[0])
    return None
