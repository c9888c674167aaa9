"""Fission rules for separable resampling: Resize (nearest, linear, cubic, antialiased) and Upsample."""

from __future__ import annotations

import numpy as np

from korch.frontend.lowering import Lowering, OnnxNode, fission
from korch.frontend.ops.sampling import COORDINATE_MODES, Sampling, resample


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
