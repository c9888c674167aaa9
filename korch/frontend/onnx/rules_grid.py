"""Fission rules for sampling at computed places: GridSample, AffineGrid, DeformConv."""

from __future__ import annotations

import functools
import itertools
import math

import numpy as np

from korch.errors import KorchError
from korch.frontend.lowering import Lowering, OnnxNode, fission
from korch.frontend.onnx.rules_elementwise import clip_core, horner
from korch.frontend.onnx.rules_linear import add_bias, spatial_attrs
from korch.frontend.onnx.rules_resize import cubic_polynomials
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


GRID_PADDINGS = ("zeros", "border", "reflection")


def grid_sample_core(ctx: Lowering, x: str, grid: str, mode: str, padding: str, align_corners: bool) -> str:
    """x [N, C, (D,) H, W] read at grid [N, (Do,) Ho, Wo, nd] ((x, y, z) in [-1, 1]) -> [N, C,
    (Do,) Ho, Wo]: the neighbouring pixels' rows of x viewed as [N * (D *) H * W, C] are gathered
    (zero outside x with zeros padding) and weighted: (bi/tri)linearly, bicubically (2-d; a =
    -0.75, torch's and ONNX Runtime's) or nearest (half to even, as torch and ONNX Runtime)."""
    n, c, *spatial = ctx.shape(x)
    out = ctx.shape(grid)[1:-1]
    nd = len(spatial)
    raw = []  # unnormalized coordinates in x's axis order (the grid holds x first, then y, z)
    for k in reversed(range(nd)):
        g = ctx.reshape(ctx.slice_axis(grid, nd + 1, k, 1), (n, *out))
        raw.append(_unnormalize(ctx, g, spatial[nd - 1 - k], align_corners))
    y = sample_pixels(ctx, x, raw, mode, padding, align_corners)
    return ctx.transpose(y, (0, nd + 1, *range(1, nd + 1)))


def sample_pixels(ctx: Lowering, x: str, raw: list[str], mode: str, padding: str, align_corners: bool) -> str:
    """x [N, C, *spatial] read at pixel coordinates `raw` (one [N, *out] tensor per spatial axis,
    unpadded) -> [N, *out, C]."""
    n, c, *spatial = ctx.shape(x)
    out = ctx.shape(raw[0])[1:]
    nd = len(spatial)
    padded = [_pad_coords(ctx, v, size, padding, align_corners) for v, size in zip(raw, spatial)]
    rows = ctx.reshape(ctx.transpose(x, (0, *range(2, nd + 2), 1)), (n * math.prod(spatial), c))
    base = ctx.const((np.arange(n, dtype="int64") * math.prod(spatial)).reshape(n, *[1] * len(out)))
    strides = [math.prod(spatial[i + 1 :]) for i in range(nd)]

    def tap(coords: list[str], weight: str | None) -> str:
        """The pixel at integral coordinates (one per axis), times weight, and zero outside x."""
        inside, flat = None, base
        for v, size, stride in zip(coords, spatial, strides):
            ok = ctx.elementwise(
                Prim.AND,
                ctx.unary(Prim.NOT, ctx.elementwise(Prim.LT, v, ctx.scalar(0, ctx.dtype(v)))),
                ctx.elementwise(Prim.LT, v, ctx.scalar(size, ctx.dtype(v))),
            )
            inside = ok if inside is None else ctx.elementwise(Prim.AND, inside, ok)
            index = ctx.cast(_clip(ctx, v, 0, size - 1), "int64")
            flat = ctx.elementwise(
                Prim.ADD, flat, ctx.elementwise(Prim.MUL, index, ctx.scalar(stride, "int64"))
            )
        picked = ctx.emit(Prim.GATHER, rows, flat, axis=0)  # [N, *out, C]
        scale = ctx.cast(inside, ctx.dtype(x))
        if weight is not None:
            scale = ctx.elementwise(Prim.MUL, scale, weight)
        return ctx.elementwise(Prim.MUL, picked, ctx.reshape(scale, (n, *out, 1)))

    def combine(taps) -> str:
        """The sum of tap(coords, weight) over (coords, per-axis weights) pairs."""
        total = None
        for coords, weights in taps:
            term = tap(list(coords), functools.reduce(lambda p, q: ctx.elementwise(Prim.MUL, p, q), weights))
            total = term if total is None else ctx.elementwise(Prim.ADD, total, term)
        return total

    if mode == "nearest":
        y = tap([ctx.unary(Prim.ROUND, v) for v in padded], None)
    elif mode == "cubic":  # (4 taps an axis around the unpadded coordinates, each tap padded on its own)
        corner = [ctx.unary(Prim.FLOOR, v) for v in raw]
        per_axis = []
        for v, v0, size in zip(raw, corner, spatial):
            weights = _cubic_weights(ctx, ctx.elementwise(Prim.SUB, v, v0))
            shifted = [ctx.elementwise(Prim.ADD, v0, ctx.scalar(d, ctx.dtype(v0))) for d in range(-1, 3)]
            per_axis.append(
                [(_pad_coords(ctx, t, size, padding, align_corners), w) for t, w in zip(shifted, weights)]
            )
        y = combine(zip(*pair) for pair in itertools.product(*per_axis))
    else:
        one = ctx.scalar(1, ctx.dtype(padded[0]))
        per_axis = []
        for v in padded:
            v0 = ctx.unary(Prim.FLOOR, v)
            f = ctx.elementwise(Prim.SUB, v, v0)
            per_axis.append(
                [(v0, ctx.elementwise(Prim.SUB, one, f)), (ctx.elementwise(Prim.ADD, v0, one), f)]
            )
        y = combine(zip(*pair) for pair in itertools.product(*per_axis))
    return y


def _clip(ctx: Lowering, v: str, low: float, high: float) -> str:
    """clip_core with constant bounds."""
    return clip_core(ctx, v, ctx.scalar(low, ctx.dtype(v)), ctx.scalar(high, ctx.dtype(v)))


def _unnormalize(ctx: Lowering, g: str, size: int, align_corners: bool) -> str:
    """Pixel coordinates of normalized ones: -1 and 1 are the corner pixels' centres with
    align_corners, else their outer edges."""
    dtype = ctx.dtype(g)
    one = ctx.scalar(1, dtype)
    if align_corners:
        return ctx.elementwise(Prim.MUL, ctx.elementwise(Prim.ADD, g, one), ctx.scalar((size - 1) / 2, dtype))
    scaled = ctx.elementwise(Prim.MUL, ctx.elementwise(Prim.ADD, g, one), ctx.scalar(size, dtype))
    return ctx.elementwise(Prim.MUL, ctx.elementwise(Prim.SUB, scaled, one), ctx.scalar(0.5, dtype))


def _pad_coords(ctx: Lowering, coords: str, size: int, padding: str, align_corners: bool) -> str:
    """Border clamps pixel coordinates into x, reflection mirrors them at the extremes (then
    clamps, as torch); zeros leaves them (a read outside x is zero)."""
    if padding == "reflection":
        low, high = (0.0, size - 1.0) if align_corners else (-0.5, size - 0.5)
        coords = _reflect(ctx, coords, low, high)
    if padding in ("border", "reflection"):
        coords = _clip(ctx, coords, 0, size - 1)
    return coords


def _cubic_weights(ctx: Lowering, t: str, a: float = -0.75) -> list[str]:
    """Cubic convolution's weights of the taps at -1, 0, 1 and 2 from a point t in [0, 1) past tap 0."""
    dtype = ctx.dtype(t)

    near, far = cubic_polynomials(a)  # (|d| <= 1, 1 < |d| < 2)
    one, two = ctx.scalar(1, dtype), ctx.scalar(2, dtype)
    distances = [
        ctx.elementwise(Prim.ADD, t, one),
        t,
        ctx.elementwise(Prim.SUB, one, t),
        ctx.elementwise(Prim.SUB, two, t),
    ]
    return [horner(ctx, d, far if i in (0, 3) else near) for i, d in enumerate(distances)]


def _reflect(ctx: Lowering, v: str, low: float, high: float) -> str:
    """v mirrored into [low, high] at both ends, as often as it takes."""
    dtype = ctx.dtype(v)
    span = high - low
    if span <= 0:
        return ctx.elementwise(Prim.MUL, v, ctx.scalar(0, dtype))
    dist = ctx.unary(Prim.ABS, ctx.elementwise(Prim.SUB, v, ctx.scalar(low, dtype)))
    flips = ctx.unary(Prim.FLOOR, ctx.elementwise(Prim.DIV, dist, ctx.scalar(span, dtype)))
    extra = ctx.elementwise(Prim.SUB, dist, ctx.elementwise(Prim.MUL, flips, ctx.scalar(span, dtype)))
    half = ctx.elementwise(Prim.MUL, flips, ctx.scalar(0.5, dtype))
    even = ctx.elementwise(Prim.EQ, ctx.unary(Prim.FLOOR, half), half)
    forward = ctx.elementwise(Prim.ADD, extra, ctx.scalar(low, dtype))
    backward = ctx.elementwise(Prim.SUB, ctx.scalar(high, dtype), extra)
    return ctx.elementwise(Prim.WHERE, even, forward, backward)


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
