"""ONNX's Attention operator (opset 23 on; what torch.onnx exports scaled_dot_product_attention as)
split into matmuls, a mask, a softmax and elementwise work, so its pieces fuse like any other's.
The semantics are the spec's reference (onnx.reference.ops.op_attention); what a rule cannot know
at compile time (per-batch key lengths, nonpad_kv_seqlen) leaves the node whole."""

from __future__ import annotations

import math

import numpy as np

from korch.errors import KorchError
from korch.frontend.lowering import Lowering, OnnxNode, fission
from korch.frontend.onnx_types import onnx_dtype
from korch.frontend.rules_linear import matmul
from korch.frontend.rules_reduce import softmax
from korch.prims import FLOAT_DTYPES, Prim


def _heads(ctx: Lowering, x: str, heads: int) -> str:
    """[batch, seq, heads * size] -> [batch, heads, seq, size]."""
    b, s, hidden = ctx.shape(x)
    if hidden % heads:
        raise KorchError(f"hidden size {hidden} is not a multiple of {heads} heads")
    return ctx.transpose(ctx.reshape(x, (b, s, heads, hidden // heads)), (0, 2, 1, 3))


def repeat_heads(ctx: Lowering, x: str, times: int) -> str:
    """Each head (axis -3) `times` times in a row ([h0, h0, h1, h1, ...]: grouped-query
    attention)."""
    if times == 1:
        return x
    *lead, h, s, d = ctx.shape(x)
    wide = ctx.broadcast_to(ctx.reshape(x, (*lead, h, 1, s, d)), (*lead, h, times, s, d))
    return ctx.reshape(wide, (*lead, h * times, s, d))


def _mask_bias(ctx: Lowering, mask: str, kv_len: int, dtype: str) -> str:
    """An attention mask as an additive bias: booleans say where to attend (0) or not (-inf);
    a mask shorter than the keys is padded with 'do not attend'."""
    shape = ctx.shape(mask)
    boolean = ctx.dtype(mask) == "bool"
    if not boolean:
        mask = ctx.cast(mask, dtype)
    if shape[-1] < kv_len:
        pads = [0] * (2 * len(shape))
        pads[2 * len(shape) - 1] = kv_len - shape[-1]  # (begins for each axis, then ends)
        pads = pads[0::2] + pads[1::2]
        fill = False if boolean else -math.inf
        mask = ctx.emit(Prim.PAD, mask, pads=pads, mode="constant", value=fill)
    if boolean:
        mask = ctx.elementwise(Prim.WHERE, mask, ctx.scalar(0, dtype), ctx.scalar(-math.inf, dtype))
    return mask


@fission("Attention", 23)
def attention(ctx: Lowering, n: OnnxNode) -> list[str]:
    q, k, v = n.inputs[0], n.inputs[1], n.inputs[2]
    mask, past_k, past_v = n.input(3), n.input(4), n.input(5)
    dtype = ctx.dtype(q)
    if dtype not in FLOAT_DTYPES:
        raise KorchError(f"Attention on {dtype}")
    if n.input(6) is not None:
        ctx.unsupported("Attention with nonpad_kv_seqlen (key lengths known only at run time)")
    if n.attr("left_window_size", -1) != -1 or n.attr("right_window_size", -1) != -1:
        ctx.unsupported("Attention with a sliding window")
    if (past_k is None) != (past_v is None):
        raise KorchError("Attention needs past_key and past_value together")
    three_d = ctx.rank(q) == 3
    q_heads, kv_heads = n.attr("q_num_heads", None), n.attr("kv_num_heads", None)
    if three_d:
        if q_heads is None or kv_heads is None:
            raise KorchError("Attention on 3D inputs needs q_num_heads and kv_num_heads")
        q, k, v = _heads(ctx, q, q_heads), _heads(ctx, k, kv_heads), _heads(ctx, v, kv_heads)
    elif (q_heads, kv_heads) != (None, None) and (q_heads, kv_heads) != (ctx.shape(q)[1], ctx.shape(k)[1]):
        raise KorchError(f"q_num_heads and kv_num_heads {q_heads, kv_heads} disagree with the 4D inputs")
    if past_k is not None:
        k, v = ctx.concat([past_k, k], axis=2), ctx.concat([past_v, v], axis=2)
    present = [k, v]
    q_len, kv_len = ctx.shape(q)[2], ctx.shape(k)[2]

    # the additive bias: the mask, the causal frontier (bottom-right aligned after a cache)
    bias = None if mask is None else _mask_bias(ctx, mask, kv_len, dtype)
    if n.attr("is_causal", 0):
        offset = ctx.shape(past_k)[2] if past_k is not None else 0
        allowed = np.arange(kv_len)[None, :] <= np.arange(q_len)[:, None] + offset
        causal = ctx.const(np.where(allowed, 0, -np.inf).astype(dtype))
        bias = causal if bias is None else ctx.elementwise(Prim.ADD, bias, causal)

    q_count, kv_count = ctx.shape(q)[1], ctx.shape(k)[1]
    if q_count != kv_count:
        if q_count % kv_count:
            raise KorchError(f"{q_count} query heads do not share {kv_count} key/value heads evenly")
        k, v = repeat_heads(ctx, k, q_count // kv_count), repeat_heads(ctx, v, q_count // kv_count)
    mode = n.attr("qk_matmul_output_mode", 0)
    if mode not in (0, 1, 2, 3):
        raise KorchError(f"qk_matmul_output_mode {mode} is not 0, 1, 2 or 3")
    precision = n.attr("softmax_precision", None)
    precision = onnx_dtype(precision) if precision else None
    y, stages = attend(
        ctx, q, k, v, bias, mask is not None, n.attr("scale", None), n.attr("softcap", 0.0), precision
    )
    if three_d:
        b, h, s, d = ctx.shape(y)
        y = ctx.reshape(ctx.transpose(y, (0, 2, 1, 3)), (b, s, h * d))
    # the scaled scores (mode 0: the spec's text and ONNX Runtime; onnx's reference applies the
    # softcap first), after the softcap (1), with the bias too (2), the probabilities (3)
    return [y, *present, stages[mode]][: n.n_outputs]


def attend(
    ctx: Lowering,
    q: str,
    k: str,
    v: str,
    bias: str | None,
    masked: bool,
    scale: float | None = None,
    softcap: float = 0.0,
    precision: str | None = None,
) -> tuple[str, tuple[str, str, str, str]]:
    """softmax(q k^T * scale + bias) v over [..., seq, size] tensors (k and v with q's heads;
    scale 1/sqrt(size) by default), both sides scaled by sqrt(scale) in the inputs' type, as
    ONNX's function and torch's math path do. With `masked` (a bias from a mask that may hide
    every key from a query), such a query gets zeros, not 0/0. Returns y and the scores as
    scaled, capped and biased, and the probabilities."""
    dtype, rank = ctx.dtype(q), ctx.rank(q)
    root = ctx.scalar(math.sqrt(scale if scale is not None else 1 / math.sqrt(ctx.shape(q)[-1])), dtype)
    swap = list(range(rank - 2)) + [rank - 1, rank - 2]
    raw = matmul(
        ctx, ctx.elementwise(Prim.MUL, q, root), ctx.elementwise(Prim.MUL, ctx.transpose(k, swap), root)
    )
    capped = raw
    if softcap > 0:  # before the mask, so masked scores stay -inf
        cap = ctx.scalar(softcap, dtype)
        capped = ctx.elementwise(Prim.MUL, ctx.unary(Prim.TANH, ctx.elementwise(Prim.DIV, raw, cap)), cap)
    scores = capped if bias is None else ctx.elementwise(Prim.ADD, capped, bias)
    probs = softmax(ctx, ctx.cast(scores, precision or dtype), rank - 1, log=False)
    if masked:
        most = ctx.reduce(Prim.REDUCE_MAX, bias, [-1])
        attended = ctx.elementwise(Prim.GT, most, ctx.scalar(-math.inf, dtype))
        probs = ctx.elementwise(Prim.WHERE, attended, probs, ctx.scalar(0, ctx.dtype(probs)))
    probs = ctx.cast(probs, dtype)
    return matmul(ctx, probs, v), (raw, capped, scores, probs)
