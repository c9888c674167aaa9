"""Narrow convolutions, a measured rewrite of the primitive graph before candidates are enumerated.

Convolution libraries vectorize over output channels in blocks of 8 or 16, so a convolution with
a handful of output channels (an image-producing last layer: 3 channels, a 9x9 kernel in Candy)
wastes most of each vector. Folding each 2x2 block of output pixels into channels (space-to-depth
on the input, depth-to-space on the output) turns it into a convolution with 4x the output
channels, 4x the input channels and a kernel of k // 2 + 1 taps: about 23% more FLOPs for
a 9x9 kernel, but vectors four times fuller. Whether that pays depends on the library and the
device, so korch times both forms with PyTorch on the target device and rewrites only when the
folded one takes less than GAIN of the time (Candy's last layer on this CPU: 18.7 -> 8.8 ms)."""

from __future__ import annotations

import numpy as np

from korch.ir import Graph, Node
from korch.prims import Prim
from korch.rewrite import GAIN, Emitter, replace_node

NARROW = 4  # at most this many output channels (4 x 4 = 16, one vector of fp32 lanes)
BLOCK = 2  # output pixels folded per axis


def widen_narrow_convs(graph: Graph, device: str = "cpu") -> tuple[Graph, list[str]]:
    """The graph with each narrow convolution folded where that was measured faster."""
    notes: list[str] = []
    done: set[str] = set()  # convolutions already measured (by output value)
    while True:
        for i, node in enumerate(graph.nodes):
            if node.outputs[0] in done or not _narrow(graph, node):
                continue
            done.add(node.outputs[0])
            direct_ms, folded_ms = _measure(graph, node, device)
            if folded_ms < GAIN * direct_ms:
                channels = graph.types[node.inputs[1]].shape[0]
                graph = _apply(graph, i)
                notes.append(
                    f"{node.origin or 'conv'}: {channels} output channels, "
                    f"2x2 output pixels folded into channels ({direct_ms:.2f} -> {folded_ms:.2f} ms measured)"
                )
                break
        else:
            return graph, notes


def _narrow(graph: Graph, node: Node) -> bool:
    if node.prim is not Prim.CONV or node.inputs[1] not in graph.constants:
        return False
    w, a = graph.constants[node.inputs[1]], node.a
    out = graph.types[node.outputs[0]].shape
    return (
        w.ndim == 4
        and a["group"] == 1
        and w.shape[0] <= NARROW
        and min(w.shape[2:]) >= 3
        and set(a["strides"]) == {1}
        and set(a["dilations"]) == {1}
        and all(o % BLOCK == 0 for o in out[2:])
    )


def _folded_weight(w: np.ndarray) -> np.ndarray:
    """[O, C, kh, kw] -> [O*4, C*4, Kh, Kw]: out[o, 2i+a, 2j+c] reads x[ch, 2(i+m)+p, 2(j+n)+q]."""
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


def _emit_folded(em: Emitter, x: str, w: np.ndarray, pads, out_shape) -> str:
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
    y = em.emit(
        Prim.CONV, [x, em.const(folded)], strides=(1, 1), pads=(0, 0, 0, 0), dilations=(1, 1), group=1
    )
    low_h, low_w = out_shape[2] // BLOCK, out_shape[3] // BLOCK
    y = em.emit(Prim.RESHAPE, [y], shape=(n, o, BLOCK, BLOCK, low_h, low_w))
    y = em.emit(Prim.TRANSPOSE, [y], perm=(0, 1, 4, 2, 5, 3))
    return em.emit(Prim.RESHAPE, [y], shape=tuple(out_shape))


def _apply(graph: Graph, i: int) -> Graph:
    node = graph.nodes[i]
    em = Emitter(graph, node.origin)
    pads = node.a["pads"]
    w = graph.constants[node.inputs[1]]
    y = _emit_folded(em, node.inputs[0], w, (pads[0], pads[1]), graph.types[node.outputs[0]].shape)
    return replace_node(graph, i, em, y)


def _measure(graph: Graph, node: Node, device: str) -> tuple[float, float]:
    """Milliseconds of the convolution as it is and folded, each the fastest of interleaved runs
    (PyTorch's convolution: what Inductor and the vendor backend call)."""
    import time

    import torch

    from korch.backends import synchronize
    from korch.backends.torch_ops import graph_function
    from korch.ir import GraphBuilder

    b = GraphBuilder()
    x = b.input("x", graph.types[node.inputs[0]])
    w = b.const(graph.constants[node.inputs[1]])
    direct = b.emit(Prim.CONV, [x, w], **node.a)[0]
    plain = b.build([direct], ["y"])
    em = Emitter(plain, node.origin)
    folded = _emit_folded(em, "x", plain.constants[w], node.a["pads"][:2], plain.types[direct].shape)
    other = replace_node(plain, 0, em, folded)
    fns = [graph_function(g, device) for g in (plain, other)]
    shape = graph.types[node.inputs[0]].shape
    xs = torch.randn(shape, dtype=getattr(torch, graph.types[node.inputs[0]].dtype), device=device)
    best = [float("inf"), float("inf")]
    with torch.no_grad():
        for _ in range(5):
            for k, fn in enumerate(fns):
                fn(xs)
                synchronize(device)
                started = time.perf_counter()
                fn(xs)
                synchronize(device)
                best[k] = min(best[k], (time.perf_counter() - started) * 1e3)
    return best[0], best[1]
