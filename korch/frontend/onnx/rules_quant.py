"""Fission rules for quantized operators: QuantizeLinear, DequantizeLinear, DynamicQuantizeLinear,
MatMulInteger, ConvInteger, QLinearMatMul and QLinearConv, over 8- and 16-bit integers; and ONNX
Runtime's own (com.microsoft: QLinearAdd, QLinearMul, QLinearSigmoid, QLinearLeakyRelu,
QLinearConcat, QLinearSoftmax, QLinearAveragePool, QLinearGlobalAveragePool, QGemm,
MatMulIntegerToFloat, DynamicQuantizeMatMul, and MatMulNBits: 2-, 4- and 8-bit weights).

Sums of integer products are taken in float64: ONNX sums them in int32, and every such sum of
8-bit products fits float64's 53 bits exactly (torch has float64 matmuls and convolutions on CPU
and CUDA, but no integer matmul on CUDA). Requantization follows ONNX Runtime: the int32 sum as
float32, times (scale_a * scale_b) / scale_y, rounded half to even, plus the zero point, clamped.
Quantizing divides (as ONNX Runtime does; a reciprocal would round differently)."""

from __future__ import annotations

import math

from korch.errors import KorchError
from korch.frontend.lowering import Lowering, OnnxNode, fission, normalize_axes
from korch.frontend.onnx.rules_linear import spatial_attrs, weight_kernel
from korch.frontend.onnx.rules_pool import average_pool
from korch.frontend.onnx.rules_reduce import softmax_as_of
from korch.frontend.onnx.tensor_types import onnx_dtype
from korch.frontend.ops.elementwise import clip_core, leaky_relu_core
from korch.frontend.ops.linear import add_bias, matmul
from korch.ir.prims import Prim

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
    return list(dynamic_quantize(ctx, n.inputs[0]))


def dynamic_quantize(ctx: Lowering, x: str) -> tuple[str, str, str]:
    """ONNX's function body: the range of x widened to hold 0, mapped onto 0..255; (y, scale,
    zero point)."""
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
    return quantize(ctx, x, scale, point, "uint8"), scale, point


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


def _per_column(k: int) -> tuple[int, ...]:
    return (k,)


def _centered_product(ctx: Lowering, a: str, a_zero: str | None, b: str, b_zero: str | None) -> str:
    """(a - a_zero) @ (b - b_zero), exact in float64; a's zero point per tensor or per row, b's per
    tensor or per column."""
    a_centered = _centered(ctx, a, a_zero, _per_row(ctx.rank(a)))
    return matmul(ctx, a_centered, _centered(ctx, b, b_zero, _per_column))


@fission("MatMulInteger", 10)
def matmul_integer(ctx: Lowering, n: OnnxNode) -> list[str]:
    product = _centered_product(ctx, n.inputs[0], n.input(2), n.inputs[1], n.input(3))
    return [ctx.cast(product, "int32")]


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
    acc = _centered_product(ctx, a, a_zero, b, b_zero)
    scales = (
        _shaped(ctx, a_scale, _per_row(ctx.rank(a))),
        _shaped(ctx, b_scale, _per_column),
        _shaped(ctx, y_scale, _per_column),
    )
    return [_requantize(ctx, acc, *scales, _shaped(ctx, y_zero, _per_column))]


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


# ------------------------------------------------ ONNX Runtime's quantized operators (com.microsoft)
# what its quantizer writes in the QOperator format, and its session optimizer makes of QDQ groups.
# Each is the float operator between a dequantization and a quantization, per tensor, unless
# ONNX Runtime computes otherwise (QLinearAdd); tests/frontend/test_fission_quant.py checks each against
# ONNX Runtime to the integer.

MS = "com.microsoft"


def _tensor_scale(ctx: Lowering, s: str | None, what: str) -> str | None:
    """A per-tensor scale or zero point as a scalar (these operators take no other)."""
    if s is not None and ctx.type(s).numel != 1:
        ctx.unsupported(f"{what} of shape {list(ctx.shape(s))} (per tensor only)")
    return None if s is None else ctx.reshape(s, ())


def _dq(ctx: Lowering, x: str, scale: str, zero: str | None) -> str:
    _integer(ctx, ctx.dtype(x))
    return dequantize(ctx, x, _tensor_scale(ctx, scale, "scale"), _tensor_scale(ctx, zero, "zero point"))


def _q(ctx: Lowering, v: str, scale: str, zero: str | None, like: str) -> str:
    """v quantized per tensor to the zero point's type (the input `like`'s without one)."""
    dtype = _integer(ctx, ctx.dtype(zero) if zero is not None else ctx.dtype(like))
    return quantize(ctx, v, _tensor_scale(ctx, scale, "scale"), _tensor_scale(ctx, zero, "zero point"), dtype)


def _unary_q(body):
    """Rules for X, X_scale, X_zero_point, Y_scale, Y_zero_point: quantize(body(dequantize(X)))."""

    def rule(ctx: Lowering, n: OnnxNode) -> list[str]:
        x = n.inputs[0]
        v = body(ctx, n, _dq(ctx, x, n.inputs[1], n.input(2)))
        return [_q(ctx, v, n.inputs[3], n.input(4), x)]

    return rule


fission("QLinearSigmoid", 1, domain=MS)(_unary_q(lambda ctx, n, v: ctx.unary(Prim.SIGMOID, v)))
fission("QLinearLeakyRelu", 1, domain=MS)(
    _unary_q(lambda ctx, n, v: leaky_relu_core(ctx, v, n.attr("alpha", 0.01)))
)


def _channels_first(ctx: Lowering, n: OnnxNode, v: str, back: bool = False) -> str:
    """channels_last=1 inputs ([N, *spatial, C]) moved to [N, C, *spatial] (back: and back)."""
    if not n.attr("channels_last", 0):
        return v
    rank = ctx.rank(v)
    perm = [0, rank - 1, *range(1, rank - 1)]
    return ctx.transpose(v, [perm.index(i) for i in range(rank)] if back else perm)


@fission("QLinearGlobalAveragePool", 1, domain=MS)
def qlinear_global_average_pool(ctx: Lowering, n: OnnxNode) -> list[str]:
    x = n.inputs[0]
    v = _channels_first(ctx, n, _dq(ctx, x, n.inputs[1], n.input(2)))
    v = ctx.mean(v, range(2, ctx.rank(v)))
    return [_channels_first(ctx, n, _q(ctx, v, n.inputs[3], n.input(4), x), back=True)]


@fission("QLinearAveragePool", 1, domain=MS)
def qlinear_average_pool(ctx: Lowering, n: OnnxNode) -> list[str]:
    x = n.inputs[0]
    v = _channels_first(ctx, n, _dq(ctx, x, n.inputs[1], n.input(2)))
    (v,) = average_pool(ctx, OnnxNode("AveragePool", n.name, n.opset, [v], 1, n.attrs))
    return [_channels_first(ctx, n, _q(ctx, v, n.inputs[3], n.input(4), x), back=True)]


@fission("QLinearSoftmax", 1, domain=MS)
def qlinear_softmax(ctx: Lowering, n: OnnxNode) -> list[str]:
    """Softmax as of the `opset` attribute: before 13 over the input flattened to 2-D at axis."""
    x = n.inputs[0]
    v = _dq(ctx, x, n.inputs[1], n.input(2))
    v = softmax_as_of(ctx, n, v, log=False, coerce_2d=n.attr("opset") < 13)
    return [_q(ctx, v, n.inputs[3], n.input(4), x)]


@fission("QLinearConcat", 1, domain=MS)
def qlinear_concat(ctx: Lowering, n: OnnxNode) -> list[str]:
    """Y_scale, Y_zero_point, then (X, X_scale, X_zero_point) per input: each requantized to Y's."""
    y_scale, y_zero, rest = n.inputs[0], n.inputs[1], n.inputs[2:]
    if len(rest) % 3 or not rest:
        raise KorchError(f"QLinearConcat takes (tensor, scale, zero point) triples, not {len(rest)} inputs")
    parts = [
        _q(ctx, _dq(ctx, x, scale, zero), y_scale, y_zero, x)
        for x, scale, zero in zip(rest[0::3], rest[1::3], rest[2::3])
    ]
    (axis,) = normalize_axes([n.attr("axis")], ctx.rank(parts[0]))
    return [ctx.concat(parts, axis)]


@fission("QLinearMul", 1, domain=MS)
def qlinear_mul(ctx: Lowering, n: OnnxNode) -> list[str]:
    a, b = n.inputs[0], n.inputs[3]
    product = ctx.elementwise(
        Prim.MUL, _dq(ctx, a, n.inputs[1], n.input(2)), _dq(ctx, b, n.inputs[4], n.input(5))
    )
    return [_q(ctx, product, n.inputs[6], n.input(7), a)]


@fission("QLinearAdd", 1, domain=MS)
def qlinear_add(ctx: Lowering, n: OnnxNode) -> list[str]:
    """As ONNX Runtime's kernel (MLAS, x86-64) computes it: with ratios rA = sA / sC, rB = sB / sC
    and fixed = zC - (rA zA + rB zB) in float32, fma(rA, A, fma(rB, B, fixed)), rounded to even
    and clamped; each fused multiply-add exact in float64, rounded once to float32 (the spec's
    (sA (A - zA) + sB (B - zB)) / sC + zC rounds differently in about 0.5% of elements)."""
    a, a_scale, a_zero, b, b_scale, b_zero, c_scale, c_zero = (n.input(i) for i in range(8))
    dtype = _integer(ctx, ctx.dtype(c_zero) if c_zero is not None else ctx.dtype(a))
    for v in (a, b):
        _integer(ctx, ctx.dtype(v))
    sa, sb, sc = (ctx.cast(_tensor_scale(ctx, s, "scale"), "float32") for s in (a_scale, b_scale, c_scale))
    ratio_a, ratio_b = ctx.elementwise(Prim.DIV, sa, sc), ctx.elementwise(Prim.DIV, sb, sc)

    def point(z: str | None) -> str:
        return (
            ctx.scalar(0.0, "float32")
            if z is None
            else ctx.cast(_tensor_scale(ctx, z, "zero point"), "float32")
        )

    shift = ctx.elementwise(
        Prim.ADD,
        ctx.elementwise(Prim.MUL, ratio_a, point(a_zero)),
        ctx.elementwise(Prim.MUL, ratio_b, point(b_zero)),
    )
    fixed = ctx.elementwise(Prim.SUB, point(c_zero), shift)

    def fma(ratio: str, v: str, addend: str) -> str:
        wide = ctx.elementwise(Prim.MUL, ctx.cast(ratio, "float64"), ctx.cast(v, "float64"))
        return ctx.cast(ctx.elementwise(Prim.ADD, wide, ctx.cast(addend, "float64")), "float32")

    return [saturate(ctx, fma(ratio_a, a, fma(ratio_b, b, fixed)), None, dtype)]


@fission("QGemm", 1, domain=MS)
def qgemm(ctx: Lowering, n: OnnxNode) -> list[str]:
    """alpha (A - zA)(B - zB) + C (int32, added exactly) requantized to Y's scale and zero point, or
    without them, in float32 ((acc + C) * alpha * sA * sB). B's scale and zero point per tensor or
    per column."""
    a, a_scale, a_zero, b, b_scale, b_zero = (n.inputs[i] for i in range(6))
    c, y_scale, y_zero = n.input(6), n.input(7), n.input(8)
    if n.attr("transA", 0):
        a = ctx.transpose(a, (1, 0))
    if n.attr("transB", 0):
        b = ctx.transpose(b, (1, 0))
    acc = _centered_product(ctx, a, _tensor_scale(ctx, a_zero, "zero point"), b, b_zero)
    if c is not None:
        acc = ctx.elementwise(Prim.ADD, acc, ctx.cast(c, "float64"))
    alpha = n.attr("alpha", 1.0)
    sa = ctx.cast(_tensor_scale(ctx, a_scale, "scale"), "float32")
    if alpha != 1.0:
        sa = ctx.elementwise(Prim.MUL, ctx.scalar(alpha, "float32"), sa)
    sb = _shaped(ctx, b_scale, _per_column)
    if y_scale is not None and y_zero is None:
        ctx.unsupported("QGemm with y_scale but no y_zero_point")
    if y_scale is None:
        scale = ctx.elementwise(Prim.MUL, sa, ctx.cast(sb, "float32"))
        return [ctx.elementwise(Prim.MUL, ctx.cast(acc, "float32"), scale)]
    return [
        _requantize(ctx, acc, sa, sb, _tensor_scale(ctx, y_scale, "scale"), _shaped(ctx, y_zero, _per_column))
    ]


def _integer_to_float(ctx, a, a_scale, a_zero, b, b_scale, b_zero, bias) -> str:
    """(A - zA)(B - zB) * (sA * sB) + bias in float32; A per tensor, B per tensor or per column."""
    acc = _centered_product(ctx, a, _tensor_scale(ctx, a_zero, "zero point"), b, b_zero)
    scale = ctx.elementwise(
        Prim.MUL,
        ctx.cast(_tensor_scale(ctx, a_scale, "scale"), "float32"),
        ctx.cast(_shaped(ctx, b_scale, _per_column), "float32"),
    )
    y = ctx.elementwise(Prim.MUL, ctx.cast(acc, "float32"), scale)
    return y if bias is None else ctx.elementwise(Prim.ADD, y, bias)


@fission("MatMulIntegerToFloat", 1, domain=MS)
def matmul_integer_to_float(ctx: Lowering, n: OnnxNode) -> list[str]:
    a, b, a_scale, b_scale, a_zero, b_zero, bias = (n.input(i) for i in range(7))
    return [_integer_to_float(ctx, a, a_scale, a_zero, b, b_scale, b_zero, bias)]


@fission("DynamicQuantizeMatMul", 1, domain=MS)
def dynamic_quantize_matmul(ctx: Lowering, n: OnnxNode) -> list[str]:
    """A quantized as DynamicQuantizeLinear does, then MatMulIntegerToFloat."""
    a, b, b_scale, b_zero, bias = (n.input(i) for i in range(5))
    if ctx.dtype(a) != "float32":
        ctx.unsupported(f"DynamicQuantizeMatMul of {ctx.dtype(a)}")
    qa, a_scale, a_zero = dynamic_quantize(ctx, a)
    return [_integer_to_float(ctx, qa, a_scale, a_zero, b, b_scale, b_zero, bias)]


@fission("MatMulNBits", 1, domain=MS)
def matmul_nbits(ctx: Lowering, n: OnnxNode) -> list[str]:
    """A @ W^T (+ bias), W [N, K] stored as `bits`-bit integers (2, 4 or 8) in blocks of
    block_size along K: B [N, blocks, block_size * bits / 8] uint8, each byte's values from its low
    bits up, the last block padded; W = (q - zero point) * scale per row and block. Zero points:
    none (2^(bits-1)), packed like B (each row's padded to whole bytes), or in A's type.
    accuracy_level 4: ONNX Runtime's CPU kernel rounds A to 8 bits per block (scale max|a| / 127)
    unless the zero points are floats, and so does the rule. B stays packed (ctx.keep_packed):
    unpacked in the kernel that reads it, as a float32 constant it would be 8 times its size (a 7B
    model: 28 GB)."""
    a, b, scales, zero, g_idx, bias = (n.input(i) for i in range(6))
    k, rows, bits, block = n.attr("K"), n.attr("N"), n.attr("bits", 4), n.attr("block_size")
    if g_idx is not None:
        ctx.unsupported("g_idx (a permuted order of K)")
    if bits not in (2, 4, 8) or block < 16 or block & (block - 1):
        ctx.unsupported(f"bits={bits}, block_size={block}")
    blocks, per = -(-k // block), 8 // bits
    if ctx.shape(b) != (rows, blocks, block // per) or ctx.dtype(b) != "uint8" or ctx.shape(a)[-1] != k:
        raise KorchError(
            f"MatMulNBits weight uint8{list(ctx.shape(b))} and input {list(ctx.shape(a))} do not fit "
            f"K={k}, N={rows}, {bits} bits in blocks of {block}"
        )
    x, dtype = ctx.widened(a)
    q = unpacked(ctx, ctx.reshape(ctx.keep_packed(b), (rows, blocks * block // per)), bits)
    floats = zero is not None and ctx.dtype(zero) != "uint8"
    if zero is not None:
        zero = ctx.reshape(zero, (rows, blocks if floats else ctx.type(zero).numel // rows))
    w = blockwise(ctx, ctx.slice_axis(q, 1, 0, k), ctx.reshape(scales, (rows, blocks)), zero, bits, block)
    if n.attr("accuracy_level", 0) == 4 and not floats:
        x = rounded_per_block(ctx, x, block)
    y = matmul(ctx, x, ctx.transpose(w, (1, 0)))
    if bias is not None:
        y = ctx.elementwise(Prim.ADD, y, ctx.cast(bias, "float32"))
    return [ctx.cast(y, dtype)]


def blockwise(ctx: Lowering, q: str, scales: str, zeros: str | None, bits: int, block: int) -> str:
    """(q - zero point) * scale in float32: q [R, K] `bits`-bit values as floats, scales [R, blocks]
    each over `block` of K; zero points none (2^(bits-1)), packed uint8 [R, bytes] or floats
    [R, blocks]."""
    if zeros is None:
        q = ctx.elementwise(Prim.SUB, q, ctx.scalar(2.0 ** (bits - 1), "float32"))
    elif ctx.dtype(zeros) == "uint8":
        zeros = ctx.slice_axis(unpacked(ctx, zeros, bits), 1, 0, ctx.shape(scales)[1])
    return dequantize(ctx, q, scales, zeros, axis=1, block=block)


def unpacked(ctx: Lowering, packed: str, bits: int) -> str:
    """uint8 [R, C] holding 8 / bits values per byte, low bits first, as float32 [R, C * 8 / bits]
    (in float32, where every step on 0..255 is exact: x mod 2^bits = x - 2^bits floor(x / 2^bits))."""
    rows, cols = ctx.shape(packed)
    rest, parts = ctx.cast(packed, "float32"), []
    for _ in range(8 // bits - 1):
        higher = ctx.unary(Prim.FLOOR, ctx.elementwise(Prim.MUL, rest, ctx.scalar(2.0**-bits, "float32")))
        low = ctx.elementwise(
            Prim.SUB, rest, ctx.elementwise(Prim.MUL, higher, ctx.scalar(2.0**bits, "float32"))
        )
        parts.append(ctx.reshape(low, (rows, cols, 1)))
        rest = higher
    parts.append(ctx.reshape(rest, (rows, cols, 1)))
    return ctx.reshape(ctx.concat(parts, 2), (rows, cols * len(parts)))


def rounded_per_block(ctx: Lowering, x: str, block: int) -> str:
    """x as ONNX Runtime's 8-bit path sees it: per block of `block` along the last axis, rounded
    (half to even) to a multiple of max|x| / 127 (an all-zero block stays 0)."""
    shape = ctx.shape(x)
    k = shape[-1]
    blocks = -(-k // block)
    if blocks * block != k:
        pads = [0] * (2 * len(shape))
        pads[2 * len(shape) - 1] = blocks * block - k
        x = ctx.emit(Prim.PAD, x, pads=tuple(pads), mode="constant", value=0.0)
    xb = ctx.reshape(x, (*shape[:-1], blocks, block))
    amax = ctx.reduce(Prim.REDUCE_MAX, ctx.unary(Prim.ABS, xb), [-1])
    scale = ctx.elementwise(Prim.DIV, amax, ctx.scalar(127.0, "float32"))
    flat = ctx.elementwise(Prim.EQ, amax, ctx.scalar(0.0, "float32"))
    safe = ctx.elementwise(Prim.WHERE, flat, ctx.scalar(1.0, "float32"), amax)
    # x times 127 / max|x|, as ONNX Runtime has it: x / scale or x times 1 / scale round the other
    # way in some elements, where x is a multiple of a unit that the maximum is too (a 4-bit
    # embedding's values, Gemma's int4 build): 0.3-0.7% off after one layer
    q = ctx.unary(
        Prim.ROUND,
        ctx.elementwise(Prim.MUL, xb, ctx.elementwise(Prim.DIV, ctx.scalar(127.0, "float32"), safe)),
    )
    # as 8-bit integers (exact: -127..127): what marks the graph as quantizing (korch.measure.tolerance),
    # as ONNX Runtime's results themselves move by a step where a value sits on a rounding tie
    q = ctx.cast(ctx.cast(q, "int8"), "float32")
    y = ctx.reshape(ctx.elementwise(Prim.MUL, q, scale), (*shape[:-1], blocks * block))
    return ctx.slice_axis(y, len(shape) - 1, 0, k)


@fission("GatherBlockQuantized", 1, domain=MS)
def gather_block_quantized(ctx: Lowering, n: OnnxNode) -> list[str]:
    """Rows of a table stored as MatMulNBits stores a weight (a tied embedding reads the output
    layer's weight so): uint8 data [rows, K * bits / 8], values packed low bits first, blocks of
    block_size along K; scales [rows, blocks] (the output's type) and zero points packed like the
    data (default 2^(bits-1)). The picked rows are gathered packed and unpacked after. An index
    outside [-rows, rows) gives a row of zeros, as ONNX Runtime has it (ONNX's Gather fails)."""
    data, indices, scales, zero = n.inputs[0], n.inputs[1], n.inputs[2], n.input(3)
    bits, block = n.attr("bits", 4), n.attr("block_size", 128)
    if ctx.dtype(data) != "uint8" or ctx.rank(data) != 2 or bits not in (2, 4, 8):
        ctx.unsupported(
            f"{bits}-bit data {ctx.dtype(data)}{list(ctx.shape(data))} (uint8 tables of 2, 4 or 8 bits are)"
        )
    axes = [
        normalize_axes([n.attr(name, default)], 2)[0]
        for name, default in (("gather_axis", 0), ("quantize_axis", 1))
    ]
    if axes != [0, 1]:
        ctx.unsupported("a gather along the quantized axis")
    rows, cols = ctx.shape(data)
    k, blocks = cols * 8 // bits, -(-cols * 8 // bits // block)
    if ctx.shape(scales) != (rows, blocks):
        raise KorchError(f"GatherBlockQuantized scales {list(ctx.shape(scales))} do not fit data {[rows, k]}")
    shape = ctx.shape(indices)
    picked = math.prod(shape)
    i = ctx.reshape(ctx.cast(indices, "int64"), (picked,))
    size = ctx.scalar(rows, "int64")
    inside = ctx.elementwise(
        Prim.AND,
        ctx.unary(Prim.NOT, ctx.elementwise(Prim.LT, i, ctx.scalar(-rows, "int64"))),
        ctx.elementwise(Prim.LT, i, size),
    )
    i = ctx.elementwise(
        Prim.WHERE, ctx.elementwise(Prim.LT, i, ctx.scalar(0, "int64")), ctx.elementwise(Prim.ADD, i, size), i
    )
    i = ctx.elementwise(Prim.WHERE, inside, i, ctx.scalar(0, "int64"))

    def rows_of(table: str) -> str:
        return ctx.emit(Prim.GATHER, table, i, axis=0)

    zeros = None if zero is None else rows_of(ctx.reshape(zero, (rows, ctx.type(zero).numel // rows)))
    y = blockwise(ctx, unpacked(ctx, rows_of(data), bits), rows_of(scales), zeros, bits, block)
    y = ctx.elementwise(Prim.WHERE, ctx.reshape(inside, (picked, 1)), y, ctx.scalar(0.0, "float32"))
    return [ctx.cast(ctx.reshape(y, (*shape, k)), ctx.dtype(scales))]
