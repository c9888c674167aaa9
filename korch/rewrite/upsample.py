"""Resize-convolutions, an algebraic rewrite of the primitive graph before candidates are enumerated.

A convolution over a nearest-neighbour upsampling by an integer factor s reads every input pixel
s times along each upsampled axis. Output position s*i + phase only ever sees input positions
i + delta with delta = (phase + t - pad) // s for the kernel taps t, so each of the s^d output
phases is a smaller convolution on the input itself, with the taps that land on the same input
pixel summed into one: a 3x3 convolution after a 2x upsampling becomes four 2x2 convolutions
(4/9 of the FLOPs) whose outputs are interleaved. Padding of the upsampled image maps onto the
input: zeros stay zeros, edge stays edge, and a reflection narrower than s is the edge.

Candy's (Johnson et al.'s style transfer) two upsampling layers are the textbook case. A split is
applied when it leaves less than GAIN of the convolution's FLOPs and, given a timer, when
PyTorch there runs it in less than FASTER of the time (libraries that already run 3x3
convolutions by Winograd save much of the same work themselves)."""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np

from korch.config import FASTER, GAIN
from korch.ir.graph import Graph, Node
from korch.ir.prims import Prim, repeat_factor
from korch.ir.work import node_flops
from korch.rewrite.common import (
    Emitter,
    Timing,
    replace_node,
    rewrite_all,
    subgraph,
    unit_conv,
)


@dataclass(frozen=True)
class _Match:
    x: str  # the input before upsampling, [N, C, *spatial]
    scales: tuple[int, ...]  # per spatial axis (1: not upsampled)
    pads: tuple[tuple[int, int], ...]  # per spatial axis, on the upsampled image
    mode: str  # how the input is padded: "edge" or "constant" (zeros)
    nodes: tuple[int, ...]  # the gathers and the pad between x and the convolution


def split_upsampled_convs(graph: Graph, timer: Timing | None = None) -> tuple[Graph, list[str]]:
    """The graph with every profitable resize-convolution split into phases (by FLOPs and, given
    a timer (a RewriteTimer on the target device, korch.profile.rewrite_timing), by time); one
    line per split."""
    rejected: set[Node] = set()  # measured slower: not measured again after another split

    def attempt(graph: Graph, i: int, node: Node) -> tuple[Graph, str] | None:
        match = _match(graph, node) if node not in rejected else None
        if match is None:
            return None
        before, after = _flops(graph, node, match)
        if after >= GAIN * before:
            return None
        note = ""
        if timer is not None:
            region = subgraph(graph, [*match.nodes, i])
            ms = timer(region, _apply(region, len(region.nodes) - 1, _match(region, region.nodes[-1])))
            if ms[1] >= FASTER * ms[0]:
                rejected.add(node)
                return None
            note = f", {ms[0]:.2f} -> {ms[1]:.2f} ms measured"
        scales = "x".join(map(str, match.scales))
        return _apply(graph, i, match), (
            f"{node.origin or 'conv'}: {scales} upsampling split into {int(np.prod(match.scales))} "
            f"phase convolutions ({before / 1e9:.3f} -> {after / 1e9:.3f} GFLOP{note})"
        )

    return rewrite_all(graph, attempt)


def _match(graph: Graph, node: Node) -> _Match | None:
    """The upsampled input of a stride-1 convolution with constant weights, if there is one."""
    if not unit_conv(graph, node):
        return None
    a = node.a
    nd = graph.types[node.inputs[1]].rank - 2
    producers, readers = graph.producers(), graph.consumers()
    index = {n.outputs[0]: i for i, n in enumerate(graph.nodes)}
    chain: list[int] = []

    def private(v: str) -> bool:
        return len(readers.get(v, ())) == 1 and v not in graph.outputs

    v, mode, pads = node.inputs[0], "constant", [(a["pads"][d], a["pads"][nd + d]) for d in range(nd)]
    pad = producers.get(v)
    if pad is not None and pad.prim is Prim.PAD and private(v):
        rank, widths = nd + 2, pad.a["pads"]
        if any(p for pair in pads for p in pair) or any(widths[d] or widths[rank + d] for d in (0, 1)):
            return None  # padded twice, or padded along batch or channels
        if pad.a["mode"] == "constant" and pad.a["value"] != 0:
            return None
        mode, pads = pad.a["mode"], [(widths[2 + d], widths[rank + 2 + d]) for d in range(nd)]
        chain.append(index[v])
        v = pad.inputs[0]
    scales = [1] * nd
    while (g := producers.get(v)) is not None and g.prim is Prim.GATHER and private(v):
        d = g.a["axis"] - 2
        s = repeat_factor(graph.constants.get(g.inputs[1]), graph.types[g.inputs[0]].shape[g.a["axis"]])
        if d < 0 or scales[d] != 1 or s is None:
            break
        scales[d] = s
        chain.append(index[v])
        v = g.inputs[0]
    if all(s == 1 for s in scales):
        return None
    if mode == "reflect":  # narrower than s: the edge; along axes not upsampled: not expressible
        if any(max(p) >= s for s, p in zip(scales, pads)):
            return None
        mode = "edge"
    out = graph.types[node.outputs[0]].shape[2:]
    if any(o % s for o, s in zip(out, scales)):
        return None
    return _Match(v, tuple(scales), tuple(pads), mode, tuple(chain))


def _taps(s: int, k: int, pad: int, phase: int) -> tuple[int, np.ndarray]:
    """(first input offset, A) for one axis and phase: tap t reads input offset
    first + j where A[j, t] = 1."""
    deltas = [(phase + t - pad) // s for t in range(k)]
    first = min(deltas)
    a = np.zeros((max(deltas) - first + 1, k))
    a[[d - first for d in deltas], range(k)] = 1
    return first, a


def _flops(graph: Graph, node: Node, match: _Match) -> tuple[float, float]:
    """The convolution's FLOPs, and those of its phase convolutions together (each over the
    whole padded input, see _apply)."""
    before = node_flops(node, graph.types)
    kernel = graph.types[node.inputs[1]].shape[2:]
    out = graph.types[node.outputs[0]].shape[2:]
    padded = _padded(graph, node, match)[2]
    after = 0.0
    for phases in itertools.product(*(range(s) for s in match.scales)):
        axes = zip(match.scales, kernel, match.pads, phases)
        sizes = [_taps(s, k, lo, ph)[1].shape[0] for s, k, (lo, _), ph in axes]
        positions = np.prod([p - e + 1 for p, e in zip(padded, sizes)])
        after += before * positions / np.prod(out) * np.prod(sizes) / np.prod(kernel)
    return before, after


def _padded(graph: Graph, node: Node, match: _Match) -> tuple[list[int], list[int], list[int]]:
    """(pads before, pads after, padded spatial shape) of the input, padded once for every phase:
    offsets run from the first phase's first tap to the last phase's last one."""
    kernel = graph.types[node.inputs[1]].shape[2:]
    x_shape = graph.types[match.x].shape[2:]
    low = [o // s for o, s in zip(graph.types[node.outputs[0]].shape[2:], match.scales)]  # per phase
    lo, hi = [], []
    for d, (s, k, (p, _)) in enumerate(zip(match.scales, kernel, match.pads)):
        first = _taps(s, k, p, 0)[0]
        last_first, last_a = _taps(s, k, p, s - 1)
        lo.append(max(0, -first))
        hi.append(max(0, low[d] - 1 + last_first + last_a.shape[0] - 1 - (x_shape[d] - 1)))
    return lo, hi, [x + a + b for x, a, b in zip(x_shape, lo, hi)]


def _apply(graph: Graph, i: int, match: _Match) -> Graph:
    node = graph.nodes[i]
    em = Emitter(graph, node.origin)
    w = graph.constants[node.inputs[1]]
    nd = w.ndim - 2
    out_shape = graph.types[node.outputs[0]].shape
    low = [o // s for o, s in zip(out_shape[2:], match.scales)]  # outputs per phase
    lo, hi, _ = _padded(graph, node, match)
    xp = match.x
    if any(lo) or any(hi):
        xp = em.emit(Prim.PAD, [xp], pads=(0, 0, *lo, 0, 0, *hi), mode=match.mode, value=0.0)

    # each phase convolves the whole padded input and keeps the outputs from its first tap on,
    # for a few more FLOPs: a slice of the input for each phase would be a copy, as a convolution
    # library wants its input dense, and the copies cost more than those FLOPs
    outputs: dict[tuple[int, ...], str] = {}
    for phases in itertools.product(*(range(s) for s in match.scales)):
        kernel = w.astype(np.float64)
        starts = [0, 0]
        for d, (s, k, (p, _), ph) in enumerate(zip(match.scales, w.shape[2:], match.pads, phases)):
            first, a = _taps(s, k, p, ph)
            kernel = np.moveaxis(np.tensordot(kernel, a, axes=([2 + d], [1])), -1, 2 + d)
            starts.append(first + lo[d])
        y = em.conv(xp, kernel.astype(w.dtype), node.a["group"])
        sizes = (*out_shape[:2], *low)
        if tuple(em.types[y].shape) != sizes:
            y = em.emit(Prim.SLICE, [y], starts=tuple(starts), steps=(1,) * len(starts), sizes=sizes)
        split = [*out_shape[:2]] + [e for n in low for e in (n, 1)]
        outputs[phases] = em.emit(Prim.RESHAPE, [y], shape=tuple(split))

    def interleave(prefix: tuple[int, ...]) -> str:
        """[N, C, o1, s1, o2, s2, ...] for the phases under `prefix`."""
        d = len(prefix)
        if d == nd:
            return outputs[prefix]
        parts = [interleave((*prefix, ph)) for ph in range(match.scales[d])]
        return parts[0] if len(parts) == 1 else em.emit(Prim.CONCAT, parts, axis=3 + 2 * d)

    return replace_node(graph, i, em, em.emit(Prim.RESHAPE, [interleave(())], shape=out_shape))
