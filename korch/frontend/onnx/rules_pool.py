"""Fission rules for windowed operators: MaxPool, AveragePool, LpPool."""

from __future__ import annotations

import math

import numpy as np

from korch.frontend.lowering import Lowering, OnnxNode, fission
from korch.frontend.onnx.rules_linear import spatial_attrs
from korch.frontend.ops.pool import avg_pool_core, max_pool_core, max_pool_indices, reach, window_sum
from korch.ir.prims import Prim


def _pool_geometry(ctx: Lowering, n: OnnxNode):
    sizes = ctx.shape(n.inputs[0])[2:]
    kernel = list(n.attr("kernel_shape"))
    strides, pads, dilations = spatial_attrs(n, sizes, kernel)
    return kernel, strides, pads, dilations, n.attr("ceil_mode", 0)


@fission("MaxPool", 1)
def max_pool(ctx: Lowering, n: OnnxNode) -> list[str]:
    """With an Indices output: flat indices over the whole tensor (batch and channel counted), in
    row-major order (storage_order 0)."""
    x, geometry = n.inputs[0], _pool_geometry(ctx, n)
    y = max_pool_core(ctx, x, *geometry)
    if n.n_outputs == 1:
        return [y]
    if n.attr("storage_order", 0) != 0:
        ctx.unsupported("MaxPool indices in column-major order")
    shape = ctx.shape(x)
    planes = np.arange(math.prod(shape[:2]), dtype="int64") * math.prod(shape[2:])
    planes = ctx.const(planes.reshape(shape[:2] + (1,) * (len(shape) - 2)))
    return [y, ctx.elementwise(Prim.ADD, max_pool_indices(ctx, x, *geometry), planes)]


@fission("AveragePool", 1)
def average_pool(ctx: Lowering, n: OnnxNode) -> list[str]:
    geometry = _pool_geometry(ctx, n)
    return [avg_pool_core(ctx, n.inputs[0], *geometry, n.attr("count_include_pad", 0))]


@fission("LpPool", 1, 2, 11, 18)
def lp_pool(ctx: Lowering, n: OnnxNode) -> list[str]:
    """(sum over the window of |x|^p)^(1/p): a sum pool of |x|^p (padding adds nothing)."""
    x, p = n.inputs[0], n.attr("p", 2)
    kernel, strides, pads, dilations, ceil_mode = _pool_geometry(ctx, n)
    kernel, extra = reach(ctx.shape(x)[2:], kernel, strides, pads, dilations, ceil_mode)
    if p == 2:
        powered = ctx.elementwise(Prim.MUL, x, x)
    elif p == 1:
        powered = ctx.unary(Prim.ABS, x)
    else:
        powered = ctx.elementwise(Prim.POW, ctx.unary(Prim.ABS, x), ctx.scalar(p, ctx.dtype(x)))
    total = window_sum(ctx, powered, kernel, strides, pads, dilations, extra)
    if p == 1:
        return [total]
    if p == 2:
        return [ctx.unary(Prim.SQRT, total)]
    return [ctx.elementwise(Prim.POW, total, ctx.scalar(1.0 / p, ctx.dtype(x)))]
