"""Rewrites of the primitive graph before candidates are enumerated: the same function (up to
float rounding) in less work. Each is applied only where it pays: by FLOPs (folding, phase
splits), by elements moved (transpose pulls), by transcendental functions (Mish) and, given a
timer on the target device, by time there (phase splits, narrow convolutions, space-to-depth
stems). The timer is handed in (korch.pipeline makes it: korch.profile.rewrite_timing), so the
rewrites import nothing past the graph."""

from __future__ import annotations

from korch.ir.graph import Graph
from korch.rewrite.common import Timing
from korch.rewrite.linear import fold_linear_maps
from korch.rewrite.mish import cheaper_mish
from korch.rewrite.narrow import widen_narrow_convs
from korch.rewrite.space_to_depth import fold_space_to_depth
from korch.rewrite.transpose import pull_transposes
from korch.rewrite.upsample import split_upsampled_convs


def rewrite(graph: Graph, timer: Timing | None = None) -> tuple[Graph, list[str]]:
    """The rewritten graph and one line per rewrite: resize-convolutions split into phases,
    mixing maps folded, transposes pulled or sunk, Mish made cheaper, then (given a timer) narrow
    convolutions widened and convolutions over a space-to-depth made strided."""
    graph, split = split_upsampled_convs(graph, timer)
    graph, folded = fold_linear_maps(graph)
    graph, pulled = pull_transposes(graph)
    graph, mish = cheaper_mish(graph)
    graph, widened = widen_narrow_convs(graph, timer) if timer else (graph, [])
    graph, strided = fold_space_to_depth(graph, timer) if timer else (graph, [])
    return graph, split + folded + pulled + mish + widened + strided


__all__ = [
    "Timing",
    "cheaper_mish",
    "fold_linear_maps",
    "fold_space_to_depth",
    "pull_transposes",
    "rewrite",
    "split_upsampled_convs",
    "widen_narrow_convs",
]
