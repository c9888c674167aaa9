"""Resampling builders: separable resizing (nearest, linear, cubic, antialiased) at ONNX Runtime's
and torch's source coordinates, and sampling at computed places (grid sampling, with its paddings
and interpolations)."""

from __future__ import annotations

import functools
import itertools
import math
from dataclasses import dataclass

import numpy as np

from korch.frontend.lowering import Lowering
from korch.frontend.ops.elementwise import clip_core, horner
from korch.ir.prims import FLOAT_DTYPES, Prim

COORDINATE_MODES = (
    "half_pixel",
    "pytorch_half_pixel",
    "align_corners",
    "asymmetric",
    "half_pixel_symmetric",
    "tf_half_pixel_for_nn",
)


def source_coords(mode: str, out_len: int, in_len: int, scale: float) -> np.ndarray:
    """Source coordinate of every output index, in float32 like ONNX Runtime (ties must agree)."""
    f = np.float32
    x, scale, one, half = np.arange(out_len, dtype=f), f(scale), f(1), f(0.5)
    if mode == "half_pixel":
        return (x + half) / scale - half
    if mode == "pytorch_half_pixel":
        return (x + half) / scale - half if out_len > 1 else np.zeros(out_len, f)
    if mode == "align_corners":
        return x * f(in_len - 1) / f(out_len - 1) if out_len > 1 else np.zeros(out_len, f)
    if mode == "asymmetric":
        return x / scale
    if mode == "tf_half_pixel_for_nn":
        return (x + half) / scale
    if mode == "half_pixel_symmetric":
        adjustment = f(out_len) / (scale * f(in_len))
        offset = f(in_len) / f(2) * (one - adjustment)
        return offset + (x + half) / scale - half
    raise ValueError(mode)


def _nearest_index(coords: np.ndarray, nearest_mode: str, in_len: int, scale: float) -> np.ndarray:
    if nearest_mode == "simple":  # ONNX Runtime before opset 11: ceil when shrinking, else floor
        nearest_mode = "ceil" if scale < 1 else "floor"
    rounding = {
        "round_prefer_floor": lambda c: np.ceil(c - 0.5),
        "round_prefer_ceil": lambda c: np.floor(c + 0.5),
        "floor": np.floor,
        "ceil": np.ceil,
    }[nearest_mode]
    return np.clip(rounding(coords), 0, in_len - 1).astype("int64")


def linear_taps(coords: np.ndarray, in_len: int, dtype: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(lower index, upper index, weight of the upper) of linear interpolation at each source
    coordinate, clamped to the input as ONNX Runtime does."""
    coords = np.clip(coords, 0, in_len - 1)
    lo = np.floor(coords).astype("int64")
    return lo, np.minimum(lo + 1, in_len - 1), (coords - lo).astype(dtype)


def cubic_polynomials(a: float) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Cubic convolution's kernel (coefficient a) as polynomials in the distance d, highest power
    first: one for d <= 1, one for 1 < d < 2 (0 beyond)."""
    return (a + 2, -(a + 3), 0.0, 1.0), (a, -5 * a, 8 * a, -4 * a)


def filter_taps(
    coords: np.ndarray, in_len: int, how: Sampling, scale: float, dtype: str
) -> tuple[np.ndarray, np.ndarray]:
    """(indices [n, out], weights [n, out]) of a linear (triangle) or cubic (coefficient a) filter
    at each source coordinate c: the n taps around floor(c), their indices clamped to the input
    (its edge repeated, as ONNX Runtime and torch do), or with exclude_outside the taps outside it
    weighted 0 and the others renormalized. Antialiased downsampling by `scale` < 1 stretches the
    filter by 1 / scale (more taps, each weighed at its distance times scale) and normalizes it."""
    support = 2 if how.mode == "cubic" else 1
    stretch = 1 / min(scale, 1.0) if how.antialias else 1.0
    n = 2 * math.ceil(support * stretch)
    base = np.floor(coords.astype(np.float64))
    offsets = np.arange(1 - n // 2, n // 2 + 1).reshape(n, 1)
    index = base.astype("int64").reshape(1, -1) + offsets
    d = np.abs(offsets - (coords - base).reshape(1, -1)) / stretch  # (each tap's scaled distance from c)
    if how.mode == "cubic":
        near, far = cubic_polynomials(how.cubic_a)
        weight = np.where(d <= 1, np.polyval(near, d), np.where(d < 2, np.polyval(far, d), 0.0))
    else:
        weight = np.clip(1 - d, 0, None)
    if how.exclude_outside:
        weight = np.where((index >= 0) & (index < in_len), weight, 0.0)
    if how.exclude_outside or stretch != 1:
        weight = weight / weight.sum(0, keepdims=True)
    return np.clip(index, 0, in_len - 1), weight.astype(dtype)


@dataclass(frozen=True)
class Sampling:
    """How Resize reads its input: the mode (nearest, linear, cubic), the coordinate transformation
    and nearest rounding, cubic's coefficient and exclude_outside, tf_crop_and_resize's region of
    interest (per axis (start, end), as fractions of the input) and extrapolation value, and
    whether linear and cubic downsampling is antialiased."""

    mode: str
    ctm: str = "half_pixel"
    nearest: str = "round_prefer_floor"
    cubic_a: float = -0.75
    exclude_outside: bool = False
    roi: tuple[tuple[float, float], ...] | None = None
    extrapolation: float = 0.0
    antialias: bool = False


def resample(ctx: Lowering, x: str, out_sizes, scales, how: Sampling) -> str:
    """Separable resampling: per axis one gather (nearest), two gathers and a lerp (linear), or
    gathers weighted and summed (cubic's four taps, an antialiased filter's more);
    tf_crop_and_resize's coordinates outside the input take the extrapolation value."""
    dtype = ctx.dtype(x)
    for axis, (in_len, out_len, scale) in enumerate(zip(ctx.shape(x), out_sizes, scales)):
        roi = how.roi[axis] if how.roi else (0.0, 1.0)
        if (scale == 1.0 or (how.mode == "nearest" and in_len == out_len)) and roi == (0.0, 1.0):
            # ONNX Runtime (1.32) copies these axes; for a linear resize it honours any other scale
            continue
        if how.ctm == "tf_crop_and_resize":
            coords = _crop_coords(out_len, in_len, *roi)
        else:
            coords = source_coords(how.ctm, out_len, in_len, scale)
        along = [out_len] + [1] * (ctx.rank(x) - axis - 1)  # (a value per output index)
        if how.mode == "nearest":
            index = _nearest_index(coords, how.nearest, in_len, scale)
            x = ctx.emit(Prim.GATHER, x, ctx.const(index), axis=axis)
        else:
            work = dtype if dtype in FLOAT_DTYPES else "float32"  # integers interpolate in float
            if how.mode == "cubic" or (how.antialias and scale < 1):
                index, weight = filter_taps(coords, in_len, how, scale, work)
                taps = [ctx.cast(ctx.emit(Prim.GATHER, x, ctx.const(i), axis=axis), work) for i in index]
                terms = [
                    ctx.elementwise(Prim.MUL, t, ctx.const(w.reshape(along))) for t, w in zip(taps, weight)
                ]
                x = functools.reduce(lambda p, q: ctx.elementwise(Prim.ADD, p, q), terms)
            else:
                lo, hi, weight = linear_taps(coords, in_len, work)
                g0 = ctx.cast(ctx.emit(Prim.GATHER, x, ctx.const(lo), axis=axis), work)
                g1 = ctx.cast(ctx.emit(Prim.GATHER, x, ctx.const(hi), axis=axis), work)
                lerp = ctx.elementwise(
                    Prim.MUL, ctx.elementwise(Prim.SUB, g1, g0), ctx.const(weight.reshape(along))
                )
                x = ctx.elementwise(Prim.ADD, g0, lerp)
            if work != dtype:
                x = ctx.cast(ctx.unary(Prim.ROUND, x), dtype)
        outside = (coords < 0) | (coords > in_len - 1)
        if how.ctm == "tf_crop_and_resize" and outside.any():
            fill = ctx.scalar(how.extrapolation, dtype)
            x = ctx.elementwise(Prim.WHERE, ctx.const(outside.reshape(along)), fill, x)
    return x


def _crop_coords(out_len: int, in_len: int, start: float, end: float) -> np.ndarray:
    """tf_crop_and_resize's source coordinates: the region [start, end] of the input (fractions of
    its last index) spread over the output, its centre for an output of one."""
    f = np.float32
    if out_len == 1:
        return np.full(1, f(end - start) * f(in_len - 1) / f(2) + f(start) * f(in_len - 1), f)
    step = f(end - start) * f(in_len - 1) / f(out_len - 1)
    return np.arange(out_len, dtype=f) * step + f(start) * f(in_len - 1)


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
