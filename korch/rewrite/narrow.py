"""Narrow convolutions, a measured rewrite of the primitive graph before candidates are enumerated.

Convolution libraries vectorize over output channels in blocks of 8 or 16, so a convolution with
a handful of output channels (an image-producing last layer: 3 channels, a 9x9 kernel in Candy)
wastes most of each vector. Folding each 2x2 block of output pixels into channels (space-to-depth
on the input, depth-to-space on the output) turns it into a convolution with 4x the output
channels, 4x the input channels and a kernel of k // 2 + 1 taps: about 23% more FLOPs for
a 9x9 kernel, but vectors four times fuller. Whether that pays depends on the library and the
device, so korch times both forms with PyTorch on the target device and rewrites only when the
folded one takes less than FASTER of the time."""

from __future__ import annotations

import numpy as np

from korch.config import BLOCK, FASTER, NARROW
from korch.ir.graph import Graph, Node
from korch.ir.prims import Prim
from korch.rewrite.common import Emitter, Timing, replace_node, rewrite_all, subgraph, unit_conv


def widen_narrow_convs(graph: Graph, timer: Timing) -> tuple[Graph, list[str]]:
    """The graph with each narrow convolution folded where `timer` (a RewriteTimer on the target
    device, korch.profile.rewrite_timing) measured that faster."""
    rejected: set[Node] = set()  # measured slower: not measured again after another fold
    folded: set[str] = set()  # weights this rewrite made (a 1-channel fold has 4: not again)

    def attempt(graph: Graph, i: int, node: Node) -> tuple[Graph, str] | None:
        if node in rejected or not _narrow(graph, node) or node.inputs[1] in folded:
            return None
        region = subgraph(graph, [i])
        direct_ms, folded_ms = timer(region, _apply(region, 0)[0])
        if folded_ms >= FASTER * direct_ms:
            rejected.add(node)
            return None
        result, weight = _apply(graph, i)
        folded.add(weight)
        channels = graph.types[node.inputs[1]].shape[0]
        return result, (
            f"{node.origin or 'conv'}: {channels} output channels, 2x2 output pixels folded into "
            f"channels ({direct_ms:.2f} -> {folded_ms:.2f} ms measured)"
        )

    return rewrite_all(graph, attempt)


def _narrow(graph: Graph, node: Node) -> bool:
    if not unit_conv(graph, node):
        return False
    w = graph.constants[node.inputs[1]]
    out = graph.types[node.outputs[0]].shape
    return (
        w.ndim == 4
        and node.a["group"] == 1
        and w.shape[0] <= NARROW
        and min(w.shape[2:]) >= 3
        and all(o % BLOCK == 0 for o in out[2:])
    )


def _folded_weight(w: np.ndarray) -> np.ndarray:
    """[O, C, kh, kw] -> [O*4, C*4, Kh, Kw]: out[o, 2i+a, 2j+b] reads x[ch, 2(i+m)+p, 2(j+n)+q]."""
    o, c, kh, kw = w.shape
    big_h, big_w = (kh + BLOCK - 2) // BLOCK + 1, (kw + BLOCK - 2) // BLOCK + 1  # offsets m = (a + t) // 2
    folded = np.zeros((o, BLOCK, BLOCK, c, BLOCK, BLOCK, big_h, big_w), dtype=np.float64)
    for a in range(BLOCK):
        for t in range(kh):
            m, p = divmod(a + t, BLOCK)
            for b in range(BLOCK):
                for u in range(kw):
                    n, q = divmod(b + u, BLOCK)
                    folded[:, a, b, :, p, q, m, n] += w[:, :, t, u]
    return folded.reshape(o * BLOCK * BLOCK, c * BLOCK * BLOCK, big_h, big_w).astype(w.dtype)


def _emit_folded(em: Emitter, x: str, w: np.ndarray, pads, out_shape) -> tuple[str, str]:
    """The folded convolution of x (top/left `pads`): its output and its weight's name."""
    n, c = em.types[x].shape[:2]
    o = w.shape[0]
    folded = _folded_weight(w)
    big_h, big_w = folded.shape[2:]
    rows, cols = out_shape[2] // BLOCK + big_h - 1, out_shape[3] // BLOCK + big_w - 1
    h, wd = em.types[x].shape[2:]
    pad_h, pad_w = rows * BLOCK - h - pads[0], cols * BLOCK - wd - pads[1]  # bottom/right fill
    if any(pads) or pad_h or pad_w:  # never negative: the bottom/right pad plus the taps' reach
        x = em.emit(
            Prim.PAD, [x], pads=(0, 0, pads[0], pads[1], 0, 0, pad_h, pad_w), mode="constant", value=0.0
        )
    x = em.emit(Prim.RESHAPE, [x], shape=(n, c, rows, BLOCK, cols, BLOCK))
    x = em.emit(Prim.TRANSPOSE, [x], perm=(0, 1, 3, 5, 2, 4))
    x = em.emit(Prim.RESHAPE, [x], shape=(n, c * BLOCK * BLOCK, rows, cols))
    y = em.conv(x, folded)
    weight = em.nodes[-1].inputs[1]
    low_h, low_w = out_shape[2] // BLOCK, out_shape[3] // BLOCK
    y = em.emit(Prim.RESHAPE, [y], shape=(n, o, BLOCK, BLOCK, low_h, low_w))
    y = em.emit(Prim.TRANSPOSE, [y], perm=(0, 1, 4, 2, 5, 3))
    return em.emit(Prim.RESHAPE, [y], shape=tuple(out_shape)), weight


def _apply(graph: Graph, i: int) -> tuple[Graph, str]:
    """The graph with convolution i folded, and the folded weight's name."""
    node = graph.nodes[i]
    em = Emitter(graph, node.origin)
    pads = node.a["pads"]
    w = graph.constants[node.inputs[1]]
    y, weight = _emit_folded(em, node.inputs[0], w, (pads[0], pads[1]), graph.types[node.outputs[0]].shape)
    return replace_node(graph, i, em, y), weight
