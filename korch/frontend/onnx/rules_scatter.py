"""Fission rules that write by index or order by value (ScatterElements, ScatterND, TopK), on the
cores the ATen rules share (korch.frontend.ops.layout)."""

from __future__ import annotations

from korch.errors import KorchError
from korch.frontend.lowering import Lowering, OnnxNode, fission
from korch.frontend.onnx.rules_layout import nd_rows
from korch.frontend.ops.layout import scatter_elements_core, scatter_rows, sort_core
from korch.ir.shapes import SCATTER_REDUCTIONS

# ------------------------------------------------------------------- scatter


def _reduction(n: OnnxNode) -> str:
    reduction = n.attr("reduction", "none")
    if reduction not in SCATTER_REDUCTIONS:
        raise KorchError(f"{n.op_type} reduction {reduction!r} is not supported")
    return reduction


@fission("Scatter", 9, 11)
@fission("ScatterElements", 11, 13, 16, 18)
def scatter_elements(ctx: Lowering, n: OnnxNode) -> list[str]:
    data, idx, updates = n.inputs[:3]
    return [scatter_elements_core(ctx, data, idx, updates, n.attr("axis", 0), _reduction(n))]


@fission("ScatterND", 11, 13, 16, 18)
def scatter_nd(ctx: Lowering, n: OnnxNode) -> list[str]:
    """Index tuples name rows of the data viewed as [indexed block, *rest] (as for GatherND); one
    scatter of the updates, viewed as [tuples, *rest], into them."""
    data, idx, updates = n.inputs[:3]
    rows, flat_shape = nd_rows(ctx, data, idx, 0, "ScatterND")
    m = ctx.type(rows).numel
    if ctx.shape(updates) != ctx.shape(rows) + flat_shape[1:]:
        raise KorchError(f"ScatterND updates {list(ctx.shape(updates))} do not fit its indices and data")
    flat = scatter_rows(
        ctx,
        ctx.reshape(data, flat_shape),
        0,
        ctx.reshape(rows, (m,)),
        ctx.reshape(updates, (m, *flat_shape[1:])),
        _reduction(n),
    )
    return [ctx.reshape(flat, ctx.shape(data))]


# ---------------------------------------------------------------------- sort


@fission("TopK", 1, 10, 11)
def top_k(ctx: Lowering, n: OnnxNode) -> list[str]:
    """The k largest (smallest) along axis, in order; equal values by index, as the spec asks."""
    x = n.inputs[0]
    k = n.attr("k") if n.opset < 10 else ctx.ints(n.inputs[1], "TopK's k")[0]
    largest = n.attr("largest", 1) if n.opset >= 11 else 1
    if n.opset >= 11:
        n.attr("sorted", 1)  # (unsorted may come in any order: sorted is one of them)
    values, order = sort_core(ctx, x, n.attr("axis", -1), bool(largest), k)
    return [values, order]
