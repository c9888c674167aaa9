"""Fission rules for signal processing: DFT and STFT as matmuls with constant cosine and sine
matrices (static lengths make every DFT a linear map), and the window functions as constants."""

from __future__ import annotations

import numpy as np

from korch.errors import KorchError
from korch.frontend.lowering import Lowering, OnnxNode, fission
from korch.frontend.onnx.tensor_types import onnx_dtype
from korch.frontend.ops.linear import matmul
from korch.ir.prims import Prim, is_float


def dft_core(ctx: Lowering, x: str, axis: int, length: int, inverse: bool, onesided: bool) -> str:
    """ONNX's DFT of x [..., 1 or 2] (real, or real and imaginary parts) along `axis` with
    `length` points (the signal cut or zero-padded to it): the complex result [..., K, 2], K =
    length (length // 2 + 1 one-sided); an inverse one-sided DFT (irfft) is real, [..., length, 1]."""
    rank = ctx.rank(x)
    if not 0 <= axis < rank - 1:
        raise KorchError(f"DFT axis {axis} is not a signal axis of a rank-{rank} input")
    complex_input = ctx.shape(x)[-1] == 2
    perm = [i for i in range(rank - 1) if i != axis] + [axis, rank - 1]
    xt = ctx.transpose(x, perm) if perm != list(range(rank)) else x
    used = min(ctx.shape(xt)[-2], length if not (inverse and onesided) else length // 2 + 1)
    parts = []
    for p in range(2 if complex_input else 1):
        part = ctx.slice_axis(ctx.slice_axis(xt, rank - 2, 0, used), rank - 1, p, 1)
        parts.append(ctx.reshape(part, ctx.shape(part)[:-1]))
    dtype = ctx.dtype(x)
    n = np.arange(used).reshape(-1, 1)
    if inverse and onesided:  # irfft: the half spectrum's conjugate symmetry made explicit
        k, t = n, np.arange(length).reshape(1, -1)
        twice = np.where((k == 0) | (2 * k == length), 1.0, 2.0)
        theta = 2 * np.pi * k * t / length
        terms = [(twice * np.cos(theta) / length), (-twice * np.sin(theta) / length)]
        real = _weighted_sum(ctx, parts, terms, dtype)
        out = [real]
    else:
        bins = length // 2 + 1 if onesided else length
        theta = 2 * np.pi * n * np.arange(bins).reshape(1, -1) / length
        sign, scale = (1.0, 1.0 / length) if inverse else (-1.0, 1.0)
        cos, sin = (
            np.cos(theta) * scale,
            sign * np.sin(theta) * scale,
        )  # e^{sign i theta} / (length if inverse)
        out = [
            _weighted_sum(ctx, parts, [cos, -sin], dtype),  # re cos - im sign sin
            _weighted_sum(ctx, parts, [sin, cos], dtype),  # re sign sin + im cos
        ]
    shape = (*ctx.shape(out[0]), 1)
    y = ctx.concat([ctx.reshape(o, shape) for o in out], rank - 1)
    back = [perm.index(i) for i in range(rank)]
    return ctx.transpose(y, back) if back != list(range(rank)) else y


def _weighted_sum(ctx: Lowering, parts: list[str], matrices: list[np.ndarray], dtype: str) -> str:
    """sum of part @ matrix over the real (and imaginary) parts given."""
    terms = [matmul(ctx, p, ctx.const(m.astype(dtype))) for p, m in zip(parts, matrices)]
    return terms[0] if len(terms) == 1 else ctx.elementwise(Prim.ADD, *terms)


def _scalar_input(ctx: Lowering, v: str | None, what: str) -> int | None:
    """A constant scalar input, None if omitted; one known only at run time leaves the operator
    whole (ONNX Runtime can run it)."""
    if v is not None and ctx.const_value(v) is None:
        ctx.unsupported(f"{what} known only at run time")
    values = ctx.ints(v, what)
    return None if values is None else values[0]


@fission("DFT", 17, 20)
def dft(ctx: Lowering, n: OnnxNode) -> list[str]:
    x = n.inputs[0]
    rank = ctx.rank(x)
    if n.opset >= 20:
        axis = _scalar_input(ctx, n.input(2), "DFT axis")
        axis = -2 if axis is None else axis
    else:
        axis = n.attr("axis", 1)
    axis = axis + rank if axis < 0 else axis
    inverse, onesided = bool(n.attr("inverse", 0)), bool(n.attr("onesided", 0))
    length = _scalar_input(ctx, n.input(1), "DFT dft_length")
    if length is None:
        length = 2 * (ctx.shape(x)[axis] - 1) if inverse and onesided else ctx.shape(x)[axis]
    return [dft_core(ctx, x, axis, length, inverse, onesided)]


@fission("STFT", 17)
def stft(ctx: Lowering, n: OnnxNode) -> list[str]:
    """Frames of the signal [batch, length, 1 or 2] (a gather of a constant index matrix), times
    the window, then their DFT: [batch, frames, bins, 2]."""
    signal, window = n.inputs[0], n.input(2)
    step = _scalar_input(ctx, n.inputs[1], "STFT frame_step")
    frame = _scalar_input(ctx, n.input(3), "STFT frame_length")
    if frame is None:
        if window is None:
            raise KorchError("STFT needs a window or a frame_length")
        frame = ctx.shape(window)[0]
    batch, length, parts = ctx.shape(signal)
    frames = (length - frame) // step + 1
    index = np.arange(frames).reshape(-1, 1) * step + np.arange(frame)  # [frames, frame]
    x = ctx.emit(Prim.GATHER, signal, ctx.const(index), axis=1)  # [batch, frames, frame, parts]
    if window is not None:
        x = ctx.elementwise(Prim.MUL, x, ctx.reshape(window, (frame, 1)))
    onesided = bool(n.attr("onesided", 1))
    return [dft_core(ctx, x, 2, frame, inverse=False, onesided=onesided)]


def _float_output(ctx: Lowering, n: OnnxNode) -> str:
    """The float dtype a constant generator's output_datatype names (others stay opaque)."""
    code = n.attr("output_datatype", 1)
    try:
        dtype = onnx_dtype(code)
    except KorchError:
        dtype = None
    if dtype is None or not is_float(dtype):
        ctx.unsupported(f"{n.op_type} output_datatype {code}")
    return dtype


def _window(formula):
    def rule(ctx: Lowering, n: OnnxNode) -> list[str]:
        """A constant: the window's formula at every point (periodic: over size points, else size - 1)."""
        size = _scalar_input(ctx, n.inputs[0], f"{n.op_type} size")
        points = size if n.attr("periodic", 1) else size - 1
        angle = 2 * np.pi * np.arange(size) / max(points, 1)
        return [ctx.const(formula(angle).astype(_float_output(ctx, n)))]

    return rule


fission("HannWindow", 17)(_window(lambda a: 0.5 - 0.5 * np.cos(a)))
fission("HammingWindow", 17)(_window(lambda a: 25 / 46 - 21 / 46 * np.cos(a)))
fission("BlackmanWindow", 17)(_window(lambda a: 0.42 - 0.5 * np.cos(a) + 0.08 * np.cos(2 * a)))


@fission("MelWeightMatrix", 17)
def mel_weight_matrix(ctx: Lowering, n: OnnxNode) -> list[str]:
    """A constant [dft_length // 2 + 1, num_mel_bins]: triangular filters between mel-spaced
    spectrogram bins (num_mel_bins + 2 points spaced 1 / (num_mel_bins + 2) of the mel range apart
    from the lower edge, as ONNX defines them), each rising from its left point to its centre and
    falling to its right one."""
    values = []
    for i, what in enumerate(
        ("num_mel_bins", "dft_length", "sample_rate", "lower_edge_hertz", "upper_edge_hertz")
    ):
        if ctx.const_value(n.inputs[i]) is None:
            ctx.unsupported(f"MelWeightMatrix {what} known only at run time")
        values.append(ctx.const_value(n.inputs[i]).reshape(-1)[0].item())
    mels, length, rate, low, high = values
    to_mel = lambda hz: 2595 * np.log10(1 + hz / 700)  # noqa: E731
    points = np.arange(mels + 2) * (to_mel(high) - to_mel(low)) / (mels + 2) + to_mel(low)
    bins = (((length + 1) * (700 * (10 ** (points / 2595) - 1))) // rate).astype(int)
    weights = np.zeros((length // 2 + 1, mels))
    for i in range(mels):
        left, centre, right = bins[i : i + 3]
        j = np.arange(length // 2 + 1)
        rising = (j - left) / (centre - left) if centre > left else (j == centre).astype(float)
        falling = (right - j) / (right - centre) if right > centre else np.zeros_like(rising)
        weights[:, i] = np.where((j >= left) & (j <= centre), rising, 0.0)
        weights[:, i] = np.where((j >= centre) & (j < right), falling, weights[:, i])
    return [ctx.const(weights.astype(_float_output(ctx, n)))]
