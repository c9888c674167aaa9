"""Fission rules for sampling at computed places: GridSample, AffineGrid, DeformConv."""

from __future__ import annotations

import numpy as np

from korch.errors import KorchError
from korch.frontend.lowering import Lowering, OnnxNode, fission
from korch.frontend.onnx.rules_linear import spatial_attrs
from korch.frontend.ops.linear import add_bias
from korch.frontend.ops.sampling import GRID_PADDINGS, grid_sample_core, sample_pixels
from korch.ir.prims import Prim


@fission("AffineGrid", 20)
def affine_grid(ctx: Lowering, n: OnnxNode) -> list[str]:
    """theta [N, nd, nd + 1] times every output position's homogeneous normalized coordinates
    (x first, then y, z; -1 and 1 the corner pixels' centres with align_corners, else their
    edges): the grid [N, (D,) H, W, nd] GridSample reads."""
    theta = n.inputs[0]
    if ctx.const_value(n.inputs[1]) is None:  # (ONNX Runtime can run it whole)
        ctx.unsupported("AffineGrid with a size known only at run time")
    size = ctx.ints(n.inputs[1], "AffineGrid size")
    spatial = size[2:]
    nd = len(spatial)
    if nd not in (2, 3) or ctx.shape(theta) != (size[0], nd, nd + 1):
        raise KorchError(f"AffineGrid theta {list(ctx.shape(theta))} does not fit size {size}")
    axes = [_normalized_positions(d, bool(n.attr("align_corners", 0))) for d in spatial]
    mesh = np.meshgrid(*axes, indexing="ij")  # (z,) y, x over the output
    homogeneous = np.stack([*mesh[::-1], np.ones(spatial)], axis=-1).reshape(-1, nd + 1)
    batch, positions = size[0], homogeneous.shape[0]
    points = ctx.const(homogeneous.T.astype(ctx.dtype(theta)))  # [nd + 1, positions]
    rows = ctx.reshape(theta, (batch * nd, nd + 1))
    grid = ctx.reshape(ctx.emit(Prim.MATMUL, rows, points), (batch, nd, positions))
    return [ctx.reshape(ctx.transpose(grid, (0, 2, 1)), (batch, *spatial, nd))]


def _normalized_positions(size: int, align_corners: bool) -> np.ndarray:
    if align_corners:
        return np.linspace(-1, 1, size) if size > 1 else np.array([-1.0])
    return (np.arange(size) * 2 + 1) / size - 1


@fission("DeformConv", 19)
def deform_conv(ctx: Lowering, n: OnnxNode) -> list[str]:
    """A convolution whose every tap reads x at its place moved by a learned offset (bilinear,
    zero outside x), optionally scaled by a mask: the taps sampled per offset group
    (sample_pixels), then a grouped matmul with the weights over channels and taps."""
    x, w, offset = n.inputs[:3]
    bias, mask = n.input(3), n.input(4)
    if ctx.rank(x) != 4:
        ctx.unsupported(f"DeformConv over rank {ctx.rank(x)}")
    batch, channels, _, _ = ctx.shape(x)
    out_channels, group_channels, kh, kw = ctx.shape(w)
    if list(n.attr("kernel_shape", [kh, kw])) != [kh, kw]:
        raise KorchError(f"DeformConv kernel_shape {n.attr('kernel_shape')} is not its weight's {[kh, kw]}")
    taps = kh * kw
    strides, pads, dilations = spatial_attrs(n, ctx.shape(x)[2:], (kh, kw))
    groups, offset_groups = n.attr("group", 1), n.attr("offset_group", 1)
    oh, ow = ctx.shape(offset)[2:]
    rows, cols = np.divmod(np.arange(taps), kw)  # each tap's place in the kernel
    base = [  # [1, taps, oh, ow] each: where a tap reads before its offset
        (np.arange(oh) * strides[0] - pads[0]).reshape(1, 1, oh, 1)
        + (rows * dilations[0]).reshape(1, taps, 1, 1),
        (np.arange(ow) * strides[1] - pads[1]).reshape(1, 1, 1, ow)
        + (cols * dilations[1]).reshape(1, taps, 1, 1),
    ]
    dtype = ctx.dtype(x)
    moves = ctx.reshape(offset, (batch, offset_groups, taps, 2, oh, ow))
    per_group = channels // offset_groups
    samples = []
    for g in range(offset_groups):
        coords = []
        for axis in (0, 1):  # (y, then x: ONNX's offsets interleave them per tap)
            move = ctx.reshape(
                ctx.slice_axis(ctx.slice_axis(moves, 1, g, 1), 3, axis, 1), (batch, taps, oh, ow)
            )
            place = np.broadcast_to(base[axis], (1, taps, oh, ow)).astype(dtype)
            coords.append(ctx.elementwise(Prim.ADD, move, ctx.const(place)))
        picked = sample_pixels(
            ctx, ctx.slice_axis(x, 1, g * per_group, per_group), coords, "linear", "zeros", True
        )
        if mask is not None:  # [batch, taps, oh, ow, per_group]
            scale = ctx.slice_axis(ctx.reshape(mask, (batch, offset_groups, taps, oh, ow)), 1, g, 1)
            picked = ctx.elementwise(Prim.MUL, picked, ctx.reshape(scale, (batch, taps, oh, ow, 1)))
        samples.append(picked)
    columns = samples[0] if len(samples) == 1 else ctx.concat(samples, 4)  # [batch, taps, oh, ow, channels]
    columns = ctx.reshape(
        ctx.transpose(columns, (0, 4, 1, 2, 3)), (batch, groups, group_channels * taps, oh * ow)
    )
    weights = ctx.reshape(w, (groups, out_channels // groups, group_channels * taps))
    y = ctx.reshape(ctx.emit(Prim.MATMUL, weights, columns), (batch, out_channels, oh, ow))
    return [add_bias(ctx, y, bias)]


@fission("GridSample", 16, 20)
def grid_sample(ctx: Lowering, n: OnnxNode) -> list[str]:
    x, grid = n.inputs[:2]
    modes = {
        "bilinear": "linear",
        "linear": "linear",
        "nearest": "nearest",
        "bicubic": "cubic",
        "cubic": "cubic",
    }
    mode = modes.get(n.attr("mode", "bilinear"))
    padding = n.attr("padding_mode", "zeros")
    if (
        mode is None
        or padding not in GRID_PADDINGS
        or ctx.rank(x) not in (4, 5)
        or (mode == "cubic" and ctx.rank(x) == 5)
    ):
        ctx.unsupported(f"GridSample {n.attr('mode', 'bilinear')} over rank {ctx.rank(x)}, {padding} padding")
    return [grid_sample_core(ctx, x, grid, mode, padding, bool(n.attr("align_corners", 0)))]
