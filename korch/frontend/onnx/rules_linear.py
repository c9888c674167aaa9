"""Fission rules for linear operators: MatMul, Gemm, Conv, ConvTranspose and Einsum."""

from __future__ import annotations

import math

import numpy as np

from korch.errors import KorchError
from korch.frontend.lowering import Lowering, OnnxNode, fission
from korch.frontend.ops.linear import add_bias, matmul
from korch.ir.prims import Prim


@fission("MatMul", 1)
def matmul_rule(ctx: Lowering, n: OnnxNode) -> list[str]:
    return [matmul(ctx, n.inputs[0], n.inputs[1])]


@fission("Gemm", 1)
def gemm(ctx: Lowering, n: OnnxNode) -> list[str]:
    a, b, c = n.inputs[0], n.inputs[1], n.input(2)
    if n.attr("transA", 0):
        a = ctx.transpose(a, (1, 0))
    if n.attr("transB", 0):
        b = ctx.transpose(b, (1, 0))
    y = ctx.emit(Prim.MATMUL, a, b)
    dtype = ctx.dtype(y)
    alpha, beta = n.attr("alpha", 1.0), n.attr("beta", 1.0)
    if alpha != 1.0:
        y = ctx.elementwise(Prim.MUL, y, ctx.scalar(alpha, dtype))
    if c is not None and beta != 0.0:
        if beta != 1.0:
            c = ctx.elementwise(Prim.MUL, c, ctx.scalar(beta, dtype))
        y = ctx.elementwise(Prim.ADD, y, c)
    return [y]


def auto_pads(auto_pad: str, sizes, kernel, strides, dilations) -> list[int]:
    """Explicit begin/end pads for Conv/Pool auto_pad modes SAME_UPPER, SAME_LOWER and VALID."""
    nd = len(sizes)
    if auto_pad == "VALID":
        return [0] * (2 * nd)
    begins, ends = [], []
    for size, k, s, d in zip(sizes, kernel, strides, dilations):
        out = math.ceil(size / s)
        total = max(0, (out - 1) * s + (k - 1) * d + 1 - size)
        small, large = total // 2, total - total // 2
        begins.append(small if auto_pad == "SAME_UPPER" else large)
        ends.append(large if auto_pad == "SAME_UPPER" else small)
    return begins + ends


def spatial_attrs(n: OnnxNode, sizes, kernel) -> tuple[list[int], list[int], list[int]]:
    """(strides, pads, dilations) with defaults filled in and auto_pad resolved."""
    nd = len(kernel)
    strides = list(n.attr("strides", [1] * nd))
    dilations = list(n.attr("dilations", [1] * nd))
    auto_pad = n.attr("auto_pad", "NOTSET")
    if auto_pad in ("", "NOTSET"):
        pads = list(n.attr("pads", [0] * (2 * nd)))
    else:
        pads = auto_pads(auto_pad, sizes, kernel, strides, dilations)
    return strides, pads, dilations


def weight_kernel(ctx: Lowering, n: OnnxNode, w: str) -> list[int]:
    """The kernel's spatial shape, from the weight; a kernel_shape attribute must agree with it."""
    kernel = list(ctx.shape(w)[2:])
    given = n.attr("kernel_shape", None)
    if given is not None and list(given) != kernel:
        raise KorchError(f"kernel_shape {list(given)} disagrees with the weight's {kernel}")
    return kernel


@fission("Conv", 1)
def conv(ctx: Lowering, n: OnnxNode) -> list[str]:
    x, w, bias = n.inputs[0], n.inputs[1], n.input(2)
    kernel = weight_kernel(ctx, n, w)
    strides, pads, dilations = spatial_attrs(n, ctx.shape(x)[2:], kernel)
    y = ctx.emit(Prim.CONV, x, w, strides=strides, pads=pads, dilations=dilations, group=n.attr("group", 1))
    return [add_bias(ctx, y, bias)]


@fission("ConvTranspose", 1)
def conv_transpose(ctx: Lowering, n: OnnxNode) -> list[str]:
    x, w, bias = n.inputs[0], n.inputs[1], n.input(2)
    sizes, kernel = ctx.shape(x)[2:], weight_kernel(ctx, n, w)
    nd = len(kernel)
    strides = list(n.attr("strides", [1] * nd))
    dilations = list(n.attr("dilations", [1] * nd))
    out_pad = list(n.attr("output_padding", [0] * nd))
    auto_pad = n.attr("auto_pad", "NOTSET")
    out_shape = n.attrs.get("output_shape")
    if out_shape is None and auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        out_shape = [s * st for s, st in zip(sizes, strides)]
    if out_shape is not None:
        out_shape = list(out_shape)[-nd:]
        begins, ends = [], []
        for i in range(nd):
            full = strides[i] * (sizes[i] - 1) + out_pad[i] + (kernel[i] - 1) * dilations[i] + 1
            total = full - out_shape[i]
            if total < 0:
                ctx.unsupported("output_shape larger than the full transposed convolution")
            small, large = total // 2, total - total // 2
            begins.append(small if auto_pad == "SAME_UPPER" else large)
            ends.append(large if auto_pad == "SAME_UPPER" else small)
        pads = begins + ends
    else:
        pads = list(n.attr("pads", [0] * (2 * nd)))
    y = ctx.emit(
        Prim.CONV_TRANSPOSE,
        x,
        w,
        strides=strides,
        pads=pads,
        dilations=dilations,
        group=n.attr("group", 1),
        output_padding=out_pad,
    )
    return [add_bias(ctx, y, bias)]


@fission("CausalConvWithState", 27)
def causal_conv_with_state(ctx: Lowering, n: OnnxNode) -> list[str]:
    """(ONNX's, opset 27; ONNX Runtime's com.microsoft one adds dilation and channels_last.)
    The short convolution of LFM2, Mamba and Gated DeltaNet layers: each channel of x [batch,
    channels, length] convolved with its own k taps (weight [channels, 1, k], bias [channels]),
    causally: over past_state [batch, channels, (k - 1) * dilation] (zeros when absent) followed
    by x. Outputs y (x's shape; activation silu or swish: y * sigmoid(y)) and present_state, the
    last (k - 1) * dilation positions of that sequence. channels_last: x [batch, length, d1, ...]
    and the states [batch, state, d1, ...], channels = d1 * ... Lowered: ndim 1 without a
    state_window, as ONNX Runtime's CPU kernel runs it (float16 in float32)."""
    x, w, bias, past = n.inputs[0], n.inputs[1], n.input(2), n.input(3)
    last, activation = n.attr("channels_last", 0), n.attr("activation", "none")
    if n.attr("ndim", 1) != 1 or n.attr("state_window", 0) or activation not in ("none", "silu", "swish"):
        ctx.unsupported(f"ndim {n.attr('ndim', 1)}, a state_window or activation {activation}")
    dilation, taps = n.attr("dilation", 1), ctx.shape(w)[-1]
    x, dtype = ctx.widened(x)
    shape, channels = ctx.shape(x), ctx.shape(w)[0]
    if len(shape) < 3 or len(shape) > 3 and not last:
        raise KorchError(f"CausalConvWithState input {list(shape)}: [batch, channels, length] expected")
    if last:  # [batch, length, d1, ...] -> [batch, channels, length]
        x = ctx.transpose(ctx.reshape(x, (shape[0], shape[1], channels)), (0, 2, 1))
    batch, _, length = ctx.shape(x)
    state = (taps - 1) * dilation
    if ctx.shape(w) != (channels, 1, taps) or ctx.shape(x)[1] != channels:
        raise KorchError(f"CausalConvWithState weight {list(ctx.shape(w))} does not fit input {list(shape)}")
    if past is None:
        past = ctx.const(np.zeros((batch, channels, state), "float32"))
    else:
        past = ctx.cast(past, "float32")
        if last:
            past = ctx.transpose(ctx.reshape(past, (batch, state, channels)), (0, 2, 1))
    if ctx.shape(past) != (batch, channels, state):
        raise KorchError(f"CausalConvWithState past_state does not fit {[batch, channels, state]}")
    whole = ctx.concat([past, x], 2) if state else x
    y = ctx.emit(
        Prim.CONV,
        whole,
        ctx.cast(w, "float32"),
        strides=(1,),
        pads=(0, 0),
        dilations=(dilation,),
        group=channels,
    )
    if bias is not None:
        y = ctx.elementwise(Prim.ADD, y, ctx.reshape(ctx.cast(bias, "float32"), (channels, 1)))
    if activation != "none":
        y = ctx.elementwise(Prim.MUL, y, ctx.unary(Prim.SIGMOID, y))
    present = ctx.slice_axis(whole, 2, length, state)
    if last:
        y = ctx.reshape(ctx.transpose(y, (0, 2, 1)), shape)
        present = ctx.reshape(ctx.transpose(present, (0, 2, 1)), (batch, state, *shape[2:]))
    return [ctx.cast(y, dtype), ctx.cast(present, dtype)]


@fission("Col2Im", 18)
def col2im(ctx: Lowering, n: OnnxNode) -> list[str]:
    """Blocks [N, C * prod(block), L] summed back into images [N, C, *image]: a transposed
    convolution, one group per channel, whose weight puts each block offset's channel at that
    offset (overlapping blocks add up, as Col2Im's do)."""
    x = n.inputs[0]
    if ctx.const_value(n.inputs[1]) is None or ctx.const_value(n.inputs[2]) is None:
        ctx.unsupported("Col2Im with shapes known only at run time")
    image, block = ctx.ints(n.inputs[1], "Col2Im image_shape"), ctx.ints(n.inputs[2], "Col2Im block_shape")
    nd = len(image)
    strides = list(n.attr("strides", [1] * nd))
    dilations = list(n.attr("dilations", [1] * nd))
    pads = list(n.attr("pads", [0] * (2 * nd)))
    batch, rows, length = ctx.shape(x)
    taps = math.prod(block)
    positions = [
        (image[i] + pads[i] + pads[nd + i] - dilations[i] * (block[i] - 1) - 1) // strides[i] + 1
        for i in range(nd)
    ]
    if rows % taps or math.prod(positions) != length:
        raise KorchError(f"Col2Im input {[batch, rows, length]} does not fit image {image} and block {block}")
    channels = rows // taps
    # (the rows a stride skips past the last block: output padding, up to the image's size)
    extra = [
        image[i]
        - ((positions[i] - 1) * strides[i] - pads[i] - pads[nd + i] + dilations[i] * (block[i] - 1) + 1)
        for i in range(nd)
    ]
    weight = np.zeros((rows, 1, *block), ctx.dtype(x))
    for c in range(channels):
        for k, offset in enumerate(np.ndindex(*block)):
            weight[(c * taps + k, 0, *offset)] = 1
    y = ctx.emit(
        Prim.CONV_TRANSPOSE,
        ctx.reshape(x, (batch, rows, *positions)),
        ctx.const(weight),
        strides=strides,
        pads=pads,
        dilations=dilations,
        group=channels,
        output_padding=extra,
    )
    return [y]


# --------------------------------------------------------------------- einsum


def _parse_einsum(equation: str, ranks: list[int]) -> tuple[list[str], str]:
    """Terms with '...' expanded into letters the equation does not use; the output made explicit."""
    equation = equation.replace(" ", "")
    lhs, _, rhs = equation.partition("->")
    terms = lhs.split(",")
    if len(terms) != len(ranks):
        raise KorchError(f"Einsum {equation!r} names {len(terms)} operands, got {len(ranks)}")
    ell = max((r - len(t.replace("...", "")) for t, r in zip(terms, ranks) if "..." in t), default=0)
    free = [c for c in "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz" if c not in equation]
    ell_letters = "".join(free[:ell])
    expanded = []
    for t, r in zip(terms, ranks):
        if "..." in t:
            t = t.replace("...", ell_letters[ell - (r - len(t.replace("...", ""))) :])
        if len(t) != r:
            raise KorchError(f"Einsum term {t!r} does not match an operand of rank {r}")
        expanded.append(t)
    if "->" in equation:
        out = rhs.replace("...", ell_letters)
    else:
        letters = "".join(expanded)
        once = [c for c in set(letters) if letters.count(c) == 1 and c not in ell_letters]
        out = ell_letters + "".join(sorted(once))
    return expanded, out


def _sum_out(ctx: Lowering, v: str, term: str, keep: str) -> tuple[str, str]:
    drop = [i for i, c in enumerate(term) if c not in keep]
    if not drop:
        return v, term
    v = ctx.reduce(Prim.REDUCE_SUM, v, drop, keepdims=False)
    return v, "".join(c for c in term if c in keep)


def _contract(ctx: Lowering, a: str, ta: str, b: str, tb: str, out: str) -> tuple[str, str]:
    """One pairwise contraction as transpose -> reshape -> batched matmul -> reshape."""
    batch = [c for c in ta if c in tb and c in out]
    contract = [c for c in ta if c in tb and c not in out]
    left = [c for c in ta if c not in tb]
    right = [c for c in tb if c not in ta]
    size = {}
    for c, d in [*zip(ta, ctx.shape(a)), *zip(tb, ctx.shape(b))]:
        size[c] = max(size.get(c, 1), d)
    a = ctx.transpose(a, [ta.index(c) for c in batch + left + contract])
    b = ctx.transpose(b, [tb.index(c) for c in batch + contract + right])
    # size-1 dimensions (from '...') broadcast against the other operand, summed ones included
    a = ctx.broadcast_to(a, [size[c] for c in batch + left + contract])
    b = ctx.broadcast_to(b, [size[c] for c in batch + contract + right])
    prod = math.prod
    bsz = prod(size[c] for c in batch)
    a = ctx.reshape(a, (bsz, prod(size[c] for c in left), prod(size[c] for c in contract)))
    b = ctx.reshape(b, (bsz, prod(size[c] for c in contract), prod(size[c] for c in right)))
    y = ctx.emit(Prim.MATMUL, a, b)
    term = "".join(batch + left + right)
    return ctx.reshape(y, [size[c] for c in term]), term


@fission("Einsum", 12)
def einsum(ctx: Lowering, n: OnnxNode) -> list[str]:
    terms, out = _parse_einsum(n.attr("equation"), [ctx.rank(v) for v in n.inputs])
    if any(len(set(t)) != len(t) for t in terms):
        ctx.unsupported("Einsum with repeated indices in one operand (diagonals)")
    values = list(n.inputs)
    acc, acc_term = values[0], terms[0]
    for i in range(1, len(values)):
        later = out + "".join(terms[i + 1 :])
        acc, acc_term = _sum_out(ctx, acc, acc_term, later + terms[i])
        v, t = _sum_out(ctx, values[i], terms[i], later + acc_term)
        acc, acc_term = _contract(ctx, acc, acc_term, v, t, later)
    acc, acc_term = _sum_out(ctx, acc, acc_term, out)
    return [ctx.transpose(acc, [acc_term.index(c) for c in out])]
