"""Convolutions over a space-to-depth, an algebraic rewrite of the primitive graph before
candidates are enumerated.

A space-to-depth (YOLOv5's and YOLOX's "Focus" stem: x[..., ::2, ::2], x[..., 1::2, ::2], ...
concatenated along channels) followed by a stride-1 convolution is one convolution on x itself,
with stride s and an s-times larger kernel: the piece of phase a along an axis holds
x[s*j + a], so the convolution's tap u on that piece reads x[s*(i + u - pad) + a], which is tap
s*u + a of a stride-s convolution padded by s*pad. Every tap of the large kernel belongs to
exactly one piece, so the FLOPs are the same; what goes is the copy of the whole input into
strided pieces and their concatenation. Applied where a timer on the target device finds it
faster."""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np

from korch.config import FASTER
from korch.ir.graph import Graph, Node
from korch.ir.prims import Prim
from korch.rewrite.common import Emitter, Timing, replace_node, rewrite_all, subgraph, unit_conv


@dataclass(frozen=True)
class _Match:
    x: str  # the input before space-to-depth, [N, C, *spatial]
    steps: tuple[int, ...]  # per spatial axis
    phases: tuple[tuple[int, ...], ...]  # per concatenated piece, its offset along each axis
    nodes: tuple[int, ...]  # the concatenation and the slices under it


def fold_space_to_depth(graph: Graph, timer: Timing) -> tuple[Graph, list[str]]:
    """The graph with every convolution over a space-to-depth that runs faster on the timer's
    device as one strided convolution; one line per rewrite."""
    rejected: set[Node] = set()

    def attempt(graph: Graph, i: int, node: Node) -> tuple[Graph, str] | None:
        match = _match(graph, node) if node not in rejected else None
        if match is None:
            return None
        region = subgraph(graph, [*match.nodes, i])
        ms = timer(region, _apply(region, len(region.nodes) - 1, _match(region, region.nodes[-1])))
        if ms[1] >= FASTER * ms[0]:
            rejected.add(node)
            return None
        steps = "x".join(map(str, match.steps))
        return _apply(graph, i, match), (
            f"{node.origin or 'conv'}: {steps} space-to-depth folded into a strided convolution "
            f"({ms[0]:.2f} -> {ms[1]:.2f} ms measured)"
        )

    return rewrite_all(graph, attempt)


def _strided_view(producers: dict, index: dict, v: str) -> tuple[str, list, list, list, list] | None:
    """(x, starts, steps, sizes, slice nodes) of a chain of slices from x to v (forward steps);
    `producers` and `index` map a value to its node and to that node's position."""
    starts, steps, nodes = None, None, []
    while (s := producers.get(v)) is not None and s.prim is Prim.SLICE:
        a = s.a
        if any(st <= 0 for st in a["steps"]):
            return None
        if starts is None:
            starts, steps, sizes = list(a["starts"]), list(a["steps"]), list(a["sizes"])
        else:  # v = s(v'): the outer view's start and step are in the inner one's coordinates
            starts = [s0 + st0 * s1 for s0, st0, s1 in zip(a["starts"], a["steps"], starts)]
            steps = [st0 * st1 for st0, st1 in zip(a["steps"], steps)]
        nodes.append(index[v])
        v = s.inputs[0]
    return None if starts is None else (v, starts, steps, sizes, nodes)


def _match(graph: Graph, node: Node) -> _Match | None:
    """The space-to-depth under a stride-1, ungrouped convolution with constant weights."""
    if not unit_conv(graph, node) or node.a["group"] != 1:
        return None
    cat_value = node.inputs[0]
    producers = graph.producers()
    cat = producers.get(cat_value)
    readers = graph.consumers().get(cat_value, [])
    if cat is None or cat.prim is not Prim.CONCAT or cat.a["axis"] != 1 or len(readers) != 1:
        return None
    if cat_value in graph.outputs:
        return None
    index = {n.outputs[0]: i for i, n in enumerate(graph.nodes)}
    views = [_strided_view(producers, index, v) for v in cat.inputs]
    if any(view is None for view in views) or len({view[0] for view in views}) != 1:
        return None
    x = views[0][0]
    shape = graph.types[x].shape
    nd = len(shape) - 2
    steps = tuple(views[0][2][2:])
    if nd < 1 or all(s == 1 for s in steps) or any(d % s for d, s in zip(shape[2:], steps)):
        return None
    phases = []
    for _, starts, view_steps, sizes, _ in views:
        whole = (
            list(starts[:2]) == [0, 0]
            and list(view_steps[:2]) == [1, 1]
            and list(sizes[:2]) == list(shape[:2])
        )
        if not whole or tuple(view_steps[2:]) != steps:
            return None
        phase = tuple(starts[2:])
        if any(not 0 <= p < s for p, s in zip(phase, steps)):
            return None
        if list(sizes[2:]) != [d // s for d, s in zip(shape[2:], steps)]:
            return None
        phases.append(phase)
    if sorted(phases) != sorted(itertools.product(*(range(s) for s in steps))):
        return None
    slices = sorted({i for view in views for i in view[4]})
    return _Match(x, steps, tuple(phases), (*slices, index[cat_value]))


def _apply(graph: Graph, i: int, match: _Match) -> Graph:
    node = graph.nodes[i]
    w = graph.constants[node.inputs[1]]
    channels = graph.types[match.x].shape[1]
    nd = w.ndim - 2
    big = np.zeros((w.shape[0], channels, *(s * k for s, k in zip(match.steps, w.shape[2:]))), w.dtype)
    for p, phase in enumerate(match.phases):
        taps = tuple(slice(a, None, s) for a, s in zip(phase, match.steps))
        big[(slice(None), slice(None), *taps)] = w[:, p * channels : (p + 1) * channels]
    em = Emitter(graph, node.origin)
    pads = tuple(p * match.steps[d % nd] for d, p in enumerate(node.a["pads"]))
    y = em.emit(
        Prim.CONV, [match.x, em.const(big)], strides=match.steps, pads=pads, dilations=(1,) * nd, group=1
    )
    return replace_node(graph, i, em, y)
