"""ATen rules for pooling (max, average, adaptive), resizing (nearest, linear, cubic,
antialiased) and grid sampling."""

from __future__ import annotations

import numpy as np

from korch.frontend.lowering import Lowering
from korch.frontend.ops.pool import avg_pool_core, max_pool_core, max_pool_indices
from korch.frontend.ops.sampling import GRID_PADDINGS, Sampling, grid_sample_core, resample
from korch.frontend.torch.aten import AtenNode, aten, int_list
from korch.ir.prims import Prim

# ------------------------------------------------------------------- pooling


def _pool_args(n: AtenNode, nd: int):
    kernel = int_list(n["kernel_size"], nd, 1)
    strides = int_list(n["stride"], nd, 0) if n["stride"] else kernel
    return kernel, strides, int_list(n["padding"], nd, 0) * 2


def _pool_rank(n: AtenNode) -> int:
    """How many trailing axes the pool slides over: 3 for the *3d overloads, else 2."""
    return 3 if "3d" in n.target else 2


@aten(
    "aten.max_pool2d_with_indices.default",
    "aten.max_pool2d.default",
    "aten.max_pool3d_with_indices.default",
)
def max_pool2d(ctx: Lowering, n: AtenNode) -> str | list[str]:
    nd = _pool_rank(n)
    kernel, strides, pads = _pool_args(n, nd)
    geometry = (kernel, strides, pads, int_list(n["dilation"], nd, 1), n["ceil_mode"])
    y = max_pool_core(ctx, n["self"], *geometry)
    if "with_indices" not in n.target:
        return y
    return [y, max_pool_indices(ctx, n["self"], *geometry)]  # (into each channel's plane)


@aten("aten.avg_pool2d.default", "aten.avg_pool3d.default")
def avg_pool2d(ctx: Lowering, n: AtenNode) -> str:
    nd = _pool_rank(n)
    kernel, strides, pads = _pool_args(n, nd)
    geometry = (kernel, strides, pads, [1] * nd, n["ceil_mode"], n["count_include_pad"])
    return avg_pool_core(ctx, n["self"], *geometry, divisor=n["divisor_override"])


def _adaptive_pool(ctx: Lowering, n: AtenNode, pool_axis) -> str:
    """Each of the last two (three) axes pooled from its size to the output's: pool_axis(x, axis,
    windows) with torch's windows, output j covering input [floor(j * size / out), ceil((j + 1) *
    size / out)), uneven and overlapping where out does not divide size."""
    x = n["self"]
    rank, nd = ctx.rank(x), _pool_rank(n)
    for axis, out in zip(range(rank - nd, rank), n.out.shape[-nd:]):
        size = ctx.shape(x)[axis]
        if out != size:
            x = pool_axis(x, axis, [((j * size) // out, -((-(j + 1) * size) // out)) for j in range(out)])
    return x


@aten(
    "aten._adaptive_avg_pool2d.default",
    "aten.adaptive_avg_pool2d.default",
    "aten._adaptive_avg_pool3d.default",
    "aten.adaptive_avg_pool3d.default",
)
def adaptive_avg_pool2d(ctx: Lowering, n: AtenNode) -> str:
    """A mean over a whole axis; otherwise a matmul with an averaging matrix per axis."""

    def pool_axis(x: str, axis: int, windows: list[tuple[int, int]]) -> str:
        if len(windows) == 1:
            return ctx.mean(x, [axis])
        rank = ctx.rank(x)
        weights = np.zeros((ctx.shape(x)[axis], len(windows)), ctx.dtype(x))
        for j, (lo, hi) in enumerate(windows):
            weights[lo:hi, j] = 1.0 / (hi - lo)
        perm = [a for a in range(rank) if a != axis] + [axis]
        y = ctx.emit(Prim.MATMUL, ctx.transpose(x, perm), ctx.const(weights))
        return ctx.transpose(y, np.argsort(perm))

    return _adaptive_pool(ctx, n, pool_axis)


@aten("aten.adaptive_max_pool2d.default", "aten.adaptive_max_pool3d.default")
def adaptive_max_pool2d(ctx: Lowering, n: AtenNode) -> list[str | None]:
    """A slice and a max per output position, joined (no indices: a graph that reads them is
    refused)."""

    def pool_axis(x: str, axis: int, windows: list[tuple[int, int]]) -> str:
        parts = [ctx.slice_axis(x, axis, lo, hi - lo) for lo, hi in windows]
        return ctx.concat([ctx.reduce(Prim.REDUCE_MAX, p, [axis]) for p in parts], axis)

    return [_adaptive_pool(ctx, n, pool_axis), None]


# ------------------------------------------------------------------ resizing


def _nearest_index(in_len: int, out_len: int, scale_factor: float | None) -> np.ndarray:
    """torch's nearest source index: floor(dst * scale) in float32, scale = 1/factor or in/out."""
    scale = np.float32(1.0 / scale_factor) if scale_factor else np.float32(in_len / out_len)
    index = np.floor(np.arange(out_len, dtype=np.float32) * scale).astype("int64")
    return np.minimum(index, in_len - 1)


def _scale_factors(n: AtenNode, nd: int) -> list[float | None]:
    """The .vec overloads' scale_factors, or the others' scales_h and scales_w."""
    if "scales_h" in n.params:
        return [n.get("scales_h"), n.get("scales_w")]
    factors = n.get("scale_factors")
    return list(factors) if factors else [None] * nd


@aten("aten.upsample_nearest2d.vec", "aten.upsample_nearest1d.vec", "aten.upsample_nearest3d.vec")
def upsample_nearest(ctx: Lowering, n: AtenNode) -> str:
    x = n["input"]
    rank = ctx.rank(x)
    nd = rank - 2
    for i, factor in enumerate(_scale_factors(n, nd)):
        axis = 2 + i
        size, out = ctx.shape(x)[axis], n.out.shape[axis]
        if size != out:
            x = ctx.emit(Prim.GATHER, x, ctx.const(_nearest_index(size, out, factor)), axis=axis)
    return x


@aten("aten.upsample_bilinear2d.vec", "aten.upsample_linear1d.vec")
def upsample_linear(ctx: Lowering, n: AtenNode) -> str:
    x = n["input"]
    mode = "align_corners" if n["align_corners"] else "pytorch_half_pixel"
    return resample(ctx, x, n.out.shape, _resize_scales(n, x, ctx), Sampling("linear", mode, "floor"))


def _resize_scales(n: AtenNode, x: str, ctx: Lowering) -> list[float]:
    in_shape, out_shape = ctx.shape(x), n.out.shape
    factors = [None, None] + _scale_factors(n, len(in_shape) - 2)
    return [f if f else o / i for f, i, o in zip(factors, in_shape, out_shape)]


@aten("aten.upsample_bicubic2d.vec")
def upsample_bicubic(ctx: Lowering, n: AtenNode) -> str:
    """torch's bicubic interpolation: cubic convolution with a = -0.75 over the four nearest
    pixels, their indices clamped to the input, at half-pixel source coordinates not clamped
    (unlike bilinear's) or at align_corners'."""
    x = n["input"]
    mode = "align_corners" if n["align_corners"] else "half_pixel"
    return resample(ctx, x, n.out.shape, _resize_scales(n, x, ctx), Sampling("cubic", mode))


@aten(
    "aten._upsample_bilinear2d_aa.vec",
    "aten._upsample_bicubic2d_aa.vec",
    "aten._upsample_bilinear2d_aa.default",
    "aten._upsample_bicubic2d_aa.default",
)
def upsample_antialiased(ctx: Lowering, n: AtenNode) -> str:
    """F.interpolate(..., antialias=True), PIL's filters: a triangle, or cubic with a = -0.5,
    stretched by the downsampling factor, taps outside the input dropped and the rest
    normalized (exclude_outside), at half-pixel coordinates."""
    if n["align_corners"]:
        ctx.unsupported("antialiased interpolation with align_corners")
    x = n.get("input") or n["self"]
    cubic = "bicubic" in n.target
    how = Sampling("cubic" if cubic else "linear", cubic_a=-0.5, exclude_outside=True, antialias=True)
    return resample(ctx, x, n.out.shape, _resize_scales(n, x, ctx), how)


@aten("aten.grid_sampler_2d.default", "aten.grid_sampler_3d.default")
def grid_sampler(ctx: Lowering, n: AtenNode) -> str:
    """F.grid_sample over 2-d or 3-d images: modes 0 (bilinear), 1 (nearest) and 2 (bicubic, 2-d)."""
    mode = {0: "linear", 1: "nearest", 2: "cubic"}[n["interpolation_mode"]]
    padding = GRID_PADDINGS[n["padding_mode"]]
    return grid_sample_core(ctx, n["input"], n["grid"], mode, padding, bool(n["align_corners"]))
