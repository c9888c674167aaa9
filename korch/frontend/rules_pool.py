"""Fission rules for windowed operators (MaxPool, AveragePool, LpPool) and resampling (Resize, Upsample)."""

from __future__ import annotations

import functools
import itertools
import math
from dataclasses import dataclass

import numpy as np

from korch.errors import KorchError
from korch.frontend.lowering import Lowering, OnnxNode, fission
from korch.frontend.rules_elementwise import clip_core
from korch.frontend.rules_linear import add_bias, spatial_attrs
from korch.prims import FLOAT_DTYPES, Prim, is_float

# ---------------------------------------------------------------------- pools


def _pool_geometry(ctx: Lowering, n: OnnxNode):
    sizes = ctx.shape(n.inputs[0])[2:]
    kernel = list(n.attr("kernel_shape"))
    strides, pads, dilations = spatial_attrs(n, sizes, kernel)
    return kernel, strides, pads, dilations, n.attr("ceil_mode", 0)


def _extra_pads(sizes, kernel, strides, pads, dilations, ceil_mode) -> list[int]:
    """The extra room at the end that ceil_mode needs for its last, partial window."""
    nd = len(kernel)
    extra = []
    for i in range(nd):
        extent = (kernel[i] - 1) * dilations[i] + 1
        span = sizes[i] + pads[i] + pads[nd + i] - extent
        out = (math.ceil(span / strides[i]) if ceil_mode else span // strides[i]) + 1
        if ceil_mode and (out - 1) * strides[i] >= sizes[i] + pads[i]:
            out -= 1  # a window may not start inside the end padding
        extra.append(max(0, (out - 1) * strides[i] + extent - (sizes[i] + pads[i] + pads[nd + i])))
    return extra


def _windows(ctx, x, kernel, strides, dilations, begins, ends, value):
    rank = ctx.rank(x)
    nd = len(kernel)
    if any(begins) or any(ends):
        pads = [0] * (rank - nd) + list(begins) + [0] * (rank - nd) + list(ends)
        x = ctx.emit(Prim.PAD, x, pads=pads, mode="constant", value=value)
    return ctx.emit(Prim.WINDOW, x, kernel=kernel, strides=strides, dilations=dilations)


def _max_windows(ctx: Lowering, x: str, kernel, strides, pads, dilations, ceil_mode) -> str:
    """x padded with its lowest value (and ceil_mode's extra room): [..., *out, *kernel] windows."""
    nd = len(kernel)
    extra = _extra_pads(ctx.shape(x)[-nd:], kernel, strides, pads, dilations, ceil_mode)
    ends = [e + x_ for e, x_ in zip(pads[nd:], extra)]
    lowest = float("-inf") if is_float(ctx.dtype(x)) else int(np.iinfo(ctx.dtype(x)).min)
    return _windows(ctx, x, kernel, strides, dilations, pads[:nd], ends, lowest)


def max_pool_core(ctx: Lowering, x: str, kernel, strides, pads, dilations, ceil_mode) -> str:
    """pad (with the lowest value) -> window -> reduce_max over the trailing spatial axes."""
    nd = len(kernel)
    win = _max_windows(ctx, x, kernel, strides, pads, dilations, ceil_mode)
    rank = ctx.rank(win)
    return ctx.reduce(Prim.REDUCE_MAX, win, range(rank - nd, rank), keepdims=False)


def max_pool_indices(ctx: Lowering, x: str, kernel, strides, pads, dilations, ceil_mode) -> str:
    """Where each window's maximum is (the first one; a NaN wins), as a flat index into its
    [*spatial] plane: argmax over the flattened window, its offset in the plane looked up from a
    constant table, plus the window's corner."""
    nd = len(kernel)
    sizes = ctx.shape(x)[-nd:]
    win = _max_windows(ctx, x, kernel, strides, pads, dilations, ceil_mode)
    outs = ctx.shape(win)[-2 * nd : -nd]
    flat = ctx.reshape(win, ctx.shape(win)[:-nd] + (math.prod(kernel),))
    best = ctx.reshape(ctx.emit(Prim.ARGMAX, flat, axis=ctx.rank(flat) - 1), ctx.shape(win)[:-nd])
    plane = [math.prod(sizes[i + 1 :]) for i in range(nd)]
    taps = np.indices(kernel).reshape(nd, -1)
    table = sum(t * d * p for t, d, p in zip(taps, dilations, plane))
    corner = sum(
        ((np.arange(o) * s - b) * p).reshape([o if j == i else 1 for j in range(nd)])
        for i, (o, s, b, p) in enumerate(zip(outs, strides, pads[:nd], plane))
    )
    offset = ctx.emit(Prim.GATHER, ctx.const(table.astype("int64")), best, axis=0)
    return ctx.elementwise(Prim.ADD, offset, ctx.const(np.asarray(corner, "int64")))


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


def _window_sum(ctx: Lowering, x: str, kernel, strides, pads, dilations, extra) -> str:
    """pad (zeros, plus ceil_mode's extra room) -> window -> reduce_sum over the window axes."""
    nd = len(kernel)
    ends = [e + x_ for e, x_ in zip(pads[nd:], extra)]
    win = _windows(ctx, x, kernel, strides, dilations, pads[:nd], ends, 0.0)
    rank = ctx.rank(win)
    return ctx.reduce(Prim.REDUCE_SUM, win, range(rank - nd, rank), keepdims=False)


def avg_pool_core(
    ctx: Lowering, x, kernel, strides, pads, dilations, ceil_mode, count_include_pad, divisor=None
) -> str:
    """pad (zeros) -> window -> reduce_sum, divided by how many window elements each output counts
    (or by torch's divisor_override)."""
    nd = len(kernel)
    sizes = ctx.shape(x)[-nd:]
    extra = _extra_pads(sizes, kernel, strides, pads, dilations, ceil_mode)
    begins, ends = pads[:nd], pads[nd:]
    total = _window_sum(ctx, x, kernel, strides, pads, dilations, extra)
    if divisor is not None:
        return ctx.elementwise(Prim.DIV, total, ctx.scalar(divisor, ctx.dtype(x)))
    # divisor per output position: how many window elements lie inside the counted region
    mask = np.pad(np.ones(sizes), list(zip(begins, ends)), constant_values=1.0 if count_include_pad else 0.0)
    mask = np.pad(mask, [(0, e) for e in extra])
    count = Prim.WINDOW.ref([mask], {"kernel": kernel, "strides": strides, "dilations": dilations})[0]
    count = count.sum(axis=tuple(range(nd, 2 * nd)))
    dtype = ctx.dtype(x)
    if dtype not in FLOAT_DTYPES:  # (torch's integer pools divide, truncating)
        return ctx.elementwise(Prim.DIV, total, ctx.const(count.astype(dtype)))
    if np.all(count == count.flat[0]):
        return ctx.elementwise(Prim.MUL, total, ctx.scalar(1.0 / count.flat[0], dtype))
    return ctx.elementwise(Prim.DIV, total, ctx.const(count.astype(dtype)))


@fission("AveragePool", 1)
def average_pool(ctx: Lowering, n: OnnxNode) -> list[str]:
    geometry = _pool_geometry(ctx, n)
    return [avg_pool_core(ctx, n.inputs[0], *geometry, n.attr("count_include_pad", 0))]


@fission("LpPool", 1, 2, 11, 18)
def lp_pool(ctx: Lowering, n: OnnxNode) -> list[str]:
    """(sum over the window of |x|^p)^(1/p): a sum pool of |x|^p (padding adds nothing)."""
    x, p = n.inputs[0], n.attr("p", 2)
    kernel, strides, pads, dilations, ceil_mode = _pool_geometry(ctx, n)
    extra = _extra_pads(ctx.shape(x)[2:], kernel, strides, pads, dilations, ceil_mode)
    if p == 2:
        powered = ctx.elementwise(Prim.MUL, x, x)
    elif p == 1:
        powered = ctx.unary(Prim.ABS, x)
    else:
        powered = ctx.elementwise(Prim.POW, ctx.unary(Prim.ABS, x), ctx.scalar(p, ctx.dtype(x)))
    total = _window_sum(ctx, powered, kernel, strides, pads, dilations, extra)
    if p == 1:
        return [total]
    if p == 2:
        return [ctx.unary(Prim.SQRT, total)]
    return [ctx.elementwise(Prim.POW, total, ctx.scalar(1.0 / p, ctx.dtype(x)))]


# ------------------------------------------------------------------- resizing


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
        a = how.cubic_a
        near, far = ((a + 2) * d - (a + 3)) * d * d + 1, ((a * d - 5 * a) * d + 8 * a) * d - 4 * a
        weight = np.where(d <= 1, near, np.where(d < 2, far, 0.0))
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


# ------------------------------------------------------------- grid sampling


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

    def poly(d: str, coefficients) -> str:  # Horner's rule in d
        acc = ctx.scalar(coefficients[0], dtype)
        for k in coefficients[1:]:
            acc = ctx.elementwise(Prim.ADD, ctx.elementwise(Prim.MUL, acc, d), ctx.scalar(k, dtype))
        return acc

    near, far = (a + 2, -(a + 3), 0.0, 1.0), (a, -5 * a, 8 * a, -4 * a)  # |d| <= 1, 1 < |d| < 2
    one, two = ctx.scalar(1, dtype), ctx.scalar(2, dtype)
    distances = [
        ctx.elementwise(Prim.ADD, t, one),
        t,
        ctx.elementwise(Prim.SUB, one, t),
        ctx.elementwise(Prim.SUB, two, t),
    ]
    return [poly(d, far if i in (0, 3) else near) for i, d in enumerate(distances)]


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
