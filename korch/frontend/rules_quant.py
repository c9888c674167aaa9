"""Fission rules for quantized operators: QuantizeLinear, DequantizeLinear, DynamicQuantizeLinear,
MatMulInteger, ConvInteger, QLinearMatMul and QLinearConv, over 8- and 16-bit integers.

Sums of integer products are taken in float64: ONNX sums them in int32, and every such sum of
8-bit products fits float64's 53 bits exactly (torch has float64 matmuls and convolutions on CPU
and CUDA, but no integer matmul on CUDA). Requantization follows ONNX Runtime: the int32 sum as
float32, times (scale_a * scale_b) / scale_y, rounded half to even, plus the zero point, clamped.
Quantizing divides (as ONNX Runtime does; a reciprocal would round differently)."""

from __future__ import annotations

from korch.errors import KorchError
from korch.frontend.lowering import Lowering, OnnxNode, fission, normalize_axes
from korch.frontend.onnx_types import onnx_dtype
from korch.frontend.rules_elementwise import clip_core
from korch.frontend.rules_linear import add_bias, matmul, spatial_attrs, weight_kernel
from korch.prims import Prim

RANGES = {"int8": (-128, 127), "uint8": (0, 255), "int16": (-32768, 32767)}


def _dtype_attr(ctx: Lowering, n: OnnxNode, key: str) -> str | None:
    code = n.attr(key, 0)
    if not code:
        return None
    try:
        return onnx_dtype(code)
    except KorchError as e:
        ctx.unsupported(f"{key}: {e}")


def _integer(ctx: Lowering, dtype: str) -> str:
    if dtype not in RANGES:
        ctx.unsupported(f"quantized type {dtype} is not lowered (int8, uint8 and int16 are)")
    return dtype


def _spread(ctx: Lowering, s: str, x: str, axis: int, block: int) -> str:
    """A scale or zero point shaped to broadcast against x: per tensor (one element), per axis (one
    per element of x's axis) or per block (x's rank, each element covering `block` along axis)."""
    shape, rank = ctx.shape(x), ctx.rank(x)
    if ctx.type(s).numel == 1 and not block:
        return ctx.reshape(s, ())
    (axis,) = normalize_axes([axis], rank)
    if block:
        blocks = -(-shape[axis] // block)
        sshape = list(ctx.shape(s))
        want = shape[:axis] + (blocks,) + shape[axis + 1 :]
        if tuple(sshape) != want:
            raise KorchError(f"blocked scale {sshape} does not fit input {list(shape)}, block {block}")
        spread = ctx.broadcast_to(
            ctx.reshape(s, sshape[: axis + 1] + [1] + sshape[axis + 1 :]),
            sshape[: axis + 1] + [block] + sshape[axis + 1 :],
        )
        spread = ctx.reshape(spread, sshape[:axis] + [blocks * block] + sshape[axis + 1 :])
        return ctx.slice_axis(spread, axis, 0, shape[axis])
    if ctx.shape(s) != (shape[axis],):
        raise KorchError(f"per-axis scale {list(ctx.shape(s))} does not fit axis {axis} of {list(shape)}")
    return ctx.reshape(s, [shape[axis] if i == axis else 1 for i in range(rank)])


def dequantize(ctx: Lowering, x: str, scale: str, zero: str | None, axis: int = 1, block: int = 0) -> str:
    """(x - zero) * scale in float32; the caller casts to the output type."""
    y = ctx.cast(x, "float32")
    if zero is not None:
        y = ctx.elementwise(Prim.SUB, y, ctx.cast(_spread(ctx, zero, x, axis, block), "float32"))
    return ctx.elementwise(Prim.MUL, y, ctx.cast(_spread(ctx, scale, x, axis, block), "float32"))


def saturate(ctx: Lowering, v: str, zero: str | None, dtype: str) -> str:
    """round(v) + zero, clamped to dtype's range, as dtype (v and zero already spread, float32)."""
    v = ctx.unary(Prim.ROUND, v)
    if zero is not None:
        v = ctx.elementwise(Prim.ADD, v, ctx.cast(zero, "float32"))
    lo, hi = RANGES[dtype]
    return ctx.cast(clip_core(ctx, v, ctx.scalar(lo, "float32"), ctx.scalar(hi, "float32")), dtype)


def quantize(
    ctx: Lowering,
    x: str,
    scale: str,
    zero: str | None,
    dtype: str,
    *,
    axis=1,
    block=0,
    precision: str | None = None,
) -> str:
    """saturate(round(x / scale) + zero), the division in `precision` (the scale's type)."""
    precision = precision or ctx.dtype(scale)
    s = ctx.cast(_spread(ctx, scale, x, axis, block), precision)
    q = ctx.cast(ctx.elementwise(Prim.DIV, ctx.cast(x, precision), s), "float32")
    return saturate(ctx, q, None if zero is None else _spread(ctx, zero, x, axis, block), dtype)


@fission("DequantizeLinear", 10)
def dequantize_linear(ctx: Lowering, n: OnnxNode) -> list[str]:
    x, scale, zero = n.inputs[0], n.inputs[1], n.input(2)
    if ctx.dtype(x) != "int32":
        _integer(ctx, ctx.dtype(x))
    out = _dtype_attr(ctx, n, "output_dtype") or ctx.dtype(scale)
    y = dequantize(ctx, x, scale, zero, n.attr("axis", 1), n.attr("block_size", 0))
    return [ctx.cast(y, out)]


@fission("QuantizeLinear", 10)
def quantize_linear(ctx: Lowering, n: OnnxNode) -> list[str]:
    x, scale, zero = n.inputs[0], n.inputs[1], n.input(2)
    given = _dtype_attr(ctx, n, "output_dtype")
    dtype = _integer(ctx, ctx.dtype(zero) if zero is not None else given or "uint8")
    if given and given != dtype:
        raise KorchError(f"output_dtype {given} disagrees with the zero point's {dtype}")
    n.attr("saturate", 1)  # (float 8 only)
    if ctx.dtype(scale) not in ("float32", "float16", "bfloat16"):
        ctx.unsupported(f"scale of type {ctx.dtype(scale)}")
    precision = _dtype_attr(ctx, n, "precision")
    y = quantize(
        ctx, x, scale, zero, dtype, axis=n.attr("axis", 1), block=n.attr("block_size", 0), precision=precision
    )
    return [y]


@fission("DynamicQuantizeLinear", 11)
def dynamic_quantize_linear(ctx: Lowering, n: OnnxNode) -> list[str]:
    """ONNX's function body: the range of x widened to hold 0, mapped onto 0..255."""
    x = n.inputs[0]
    axes = range(ctx.rank(x))
    zero = ctx.scalar(0.0, "float32")
    lo = ctx.elementwise(Prim.MIN, ctx.reduce(Prim.REDUCE_MIN, x, axes, keepdims=False), zero)
    hi = ctx.elementwise(Prim.MAX, ctx.reduce(Prim.REDUCE_MAX, x, axes, keepdims=False), zero)
    scale = ctx.elementwise(Prim.DIV, ctx.elementwise(Prim.SUB, hi, lo), ctx.scalar(255.0, "float32"))
    # an all-zero x: scale 1, as ONNX Runtime has it (the function body's 0 / 0 is no zero point)
    flat = ctx.elementwise(Prim.EQ, scale, zero)
    scale = ctx.elementwise(Prim.WHERE, flat, ctx.scalar(1.0, "float32"), scale)
    point = ctx.elementwise(Prim.SUB, zero, ctx.elementwise(Prim.DIV, lo, scale))
    point = clip_core(ctx, point, zero, ctx.scalar(255.0, "float32"))
    point = ctx.cast(ctx.unary(Prim.ROUND, point), "uint8")
    return [quantize(ctx, x, scale, point, "uint8"), scale, point]


def _shaped(ctx: Lowering, s: str, shape) -> str:
    """A scale or zero point: one element as a scalar, a 1-D one reshaped by `shape`(its length)."""
    if ctx.type(s).numel == 1:
        return ctx.reshape(s, ())
    return ctx.reshape(s, shape(ctx.shape(s)[0])) if ctx.rank(s) == 1 else s


def _centered(ctx: Lowering, v: str, zero: str | None, zero_shape) -> str:
    """v - zero in float64 (exact), the zero point reshaped to broadcast as `zero_shape` says."""
    _integer(ctx, ctx.dtype(v))
    v = ctx.cast(v, "float64")
    if zero is None:
        return v
    return ctx.elementwise(Prim.SUB, v, ctx.cast(_shaped(ctx, zero, zero_shape), "float64"))


def _per_row(rank: int):
    return lambda m: (m, 1) if rank > 1 else (m,)


@fission("MatMulInteger", 10)
def matmul_integer(ctx: Lowering, n: OnnxNode) -> list[str]:
    a = _centered(ctx, n.inputs[0], n.input(2), _per_row(ctx.rank(n.inputs[0])))
    b = _centered(ctx, n.inputs[1], n.input(3), lambda k: (k,))
    return [ctx.cast(matmul(ctx, a, b), "int32")]


def _conv64(ctx: Lowering, n: OnnxNode, x: str, w: str, xz: str | None, wz: str | None) -> str:
    kernel = weight_kernel(ctx, n, w)
    strides, pads, dilations = spatial_attrs(n, ctx.shape(x)[2:], kernel)
    nd = len(kernel)
    xc = _centered(ctx, x, xz, lambda c: (1, c) + (1,) * nd)
    wc = _centered(ctx, w, wz, lambda m: (m,) + (1,) * (nd + 1))
    return ctx.emit(
        Prim.CONV, xc, wc, strides=strides, pads=pads, dilations=dilations, group=n.attr("group", 1)
    )


@fission("ConvInteger", 10)
def conv_integer(ctx: Lowering, n: OnnxNode) -> list[str]:
    x, w = n.inputs[0], n.inputs[1]
    return [ctx.cast(_conv64(ctx, n, x, w, n.input(2), n.input(3)), "int32")]


def _requantize(ctx: Lowering, acc: str, a_scale: str, b_scale: str, y_scale: str, y_zero: str) -> str:
    """acc (float64, exact) as float32 times (a_scale * b_scale) / y_scale, rounded, shifted by
    y_zero and clamped (the scales and zero point already shaped to broadcast against acc)."""
    f32 = [ctx.cast(s, "float32") for s in (a_scale, b_scale, y_scale)]
    mult = ctx.elementwise(Prim.DIV, ctx.elementwise(Prim.MUL, f32[0], f32[1]), f32[2])
    v = ctx.elementwise(Prim.MUL, ctx.cast(acc, "float32"), mult)
    return saturate(ctx, v, y_zero, _integer(ctx, ctx.dtype(y_zero)))


@fission("QLinearMatMul", 10)
def qlinear_matmul(ctx: Lowering, n: OnnxNode) -> list[str]:
    """a's scale and zero point per tensor or per row, b's and y's per tensor or per column."""
    a, a_scale, a_zero, b, b_scale, b_zero, y_scale, y_zero = (n.inputs[i] for i in range(8))
    row, column = _per_row(ctx.rank(a)), (lambda k: (k,))
    acc = matmul(ctx, _centered(ctx, a, a_zero, row), _centered(ctx, b, b_zero, column))
    scales = _shaped(ctx, a_scale, row), _shaped(ctx, b_scale, column), _shaped(ctx, y_scale, column)
    return [_requantize(ctx, acc, *scales, _shaped(ctx, y_zero, column))]


@fission("QLinearConv", 10)
def qlinear_conv(ctx: Lowering, n: OnnxNode) -> list[str]:
    """w's scale and zero point per tensor or per output channel; the int32 bias added exactly."""
    x, x_scale, x_zero, w, w_scale, w_zero, y_scale, y_zero = (n.inputs[i] for i in range(8))
    acc = _conv64(ctx, n, x, w, x_zero, w_zero)
    bias = n.input(8)
    acc = add_bias(ctx, acc, None if bias is None else ctx.cast(bias, "float64"))

    def channel(m: int) -> tuple[int, ...]:
        return (m,) + (1,) * (ctx.rank(x) - 2)

    scales = (_shaped(ctx, s, channel) for s in (x_scale, w_scale, y_scale))
    return [_requantize(ctx, acc, *scales, _shaped(ctx, y_zero, channel))]
