"""Fission rules for separable resampling: Resize (nearest, linear, cubic, antialiased) and Upsample."""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np

from korch.frontend.lowering import Lowering, OnnxNode, fission
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


def _scaled_size(dim: int, scale) -> int:
    """floor(dim * scale) in float32, as ONNX Runtime computes it."""
    return int(np.floor(np.float32(dim) * np.float32(scale)))


@fission("Resize", 10)
def resize(ctx: Lowering, n: OnnxNode) -> list[str]:
    x = n.inputs[0]
    shape = ctx.shape(x)
    rank = len(shape)
    mode = n.attr("mode", "nearest")
    roi_v = None
    if n.opset < 11:
        scales_v, sizes_v, ctm, nearest = n.input(1), None, "asymmetric", "simple"
    else:
        roi_v, scales_v, sizes_v = n.input(1), n.input(2), n.input(3)
        ctm = n.attr("coordinate_transformation_mode", "half_pixel")
        nearest = n.attr("nearest_mode", "round_prefer_floor")
    if mode not in ("nearest", "linear", "cubic"):
        ctx.unsupported(f"Resize mode {mode}")
    if ctm not in (*COORDINATE_MODES, "tf_crop_and_resize"):
        ctx.unsupported(f"Resize coordinate_transformation_mode {ctm}")
    needed = [sizes_v or scales_v, roi_v if ctm == "tf_crop_and_resize" else None]
    if any(v and ctx.const_value(v) is None for v in needed):  # (ONNX Runtime can run it whole)
        ctx.unsupported("Resize with scales, sizes or roi known only at run time")
    axes = n.attrs.get("axes")
    axes = list(range(rank)) if axes is None else [a + rank if a < 0 else a for a in axes]
    scales, out_sizes = [1.0] * rank, list(shape)
    sizes = ctx.ints(sizes_v, "Resize sizes")
    policy = n.attr("keep_aspect_ratio_policy", "stretch")
    if sizes and policy != "stretch":  # (one scale for every axis, the smallest or the largest)
        if policy not in ("not_larger", "not_smaller"):
            ctx.unsupported(f"Resize keep_aspect_ratio_policy {policy}")
        pick = min if policy == "not_larger" else max
        scale = pick(s / shape[a] for a, s in zip(axes, sizes))
        for a in axes:
            out_sizes[a], scales[a] = int(scale * shape[a] + 0.5), scale
    elif sizes:
        for a, s in zip(axes, sizes):
            out_sizes[a], scales[a] = s, s / shape[a]
    else:
        given = ctx.require_const(scales_v, "Resize scales").astype(np.float64).reshape(-1)
        for a, s in zip(axes, given):
            out_sizes[a], scales[a] = _scaled_size(shape[a], s), float(np.float32(s))
    roi = None
    if ctm == "tf_crop_and_resize":
        given = ctx.require_const(roi_v, "Resize roi").astype(np.float64).reshape(-1)
        bounds = [(0.0, 1.0)] * rank
        for i, a in enumerate(axes):
            bounds[a] = (float(given[i]), float(given[len(axes) + i]))
        roi = tuple(bounds)
    how = Sampling(
        mode,
        ctm,
        nearest,
        n.attr("cubic_coeff_a", -0.75),
        bool(n.attr("exclude_outside", 0)),
        roi,
        n.attr("extrapolation_value", 0.0),
        bool(n.attr("antialias", 0)) and mode != "nearest",
    )
    return [resample(ctx, x, out_sizes, scales, how)]


@fission("Upsample", 7)
def upsample(ctx: Lowering, n: OnnxNode) -> list[str]:
    x = n.inputs[0]
    mode = n.attr("mode", "nearest")
    if mode not in ("nearest", "linear", "bilinear"):
        ctx.unsupported(f"Upsample mode {mode}")
    if n.opset < 9:
        scales = [float(s) for s in n.attr("scales")]
    elif ctx.const_value(n.inputs[1]) is None:
        ctx.unsupported("Upsample with scales known only at run time")
    else:
        scales = [float(s) for s in ctx.require_const(n.inputs[1], "Upsample scales").reshape(-1)]
    out_sizes = [_scaled_size(d, s) for d, s in zip(ctx.shape(x), scales)]
    mode = "nearest" if mode == "nearest" else "linear"
    return [resample(ctx, x, out_sizes, scales, Sampling(mode, "asymmetric", "simple"))]
