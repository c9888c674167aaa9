"""ONNX Runtime's attention operators (domain com.microsoft), as its transformer optimizer and
onnxruntime-genai's model builder write them: multi-head attention from a packed projection or
separate ones, rotary embeddings, grouped-query attention with its KV cache, and linear attention
with its gates, norm and convolution (Qwen3.5, LFM2, Mamba). Each is split into matmuls, a mask, a
softmax and elementwise work. The semantics are ONNX Runtime's CPU kernels (1.32), which
tests/frontend/test_fission_contrib.py runs as the oracle."""

from __future__ import annotations

import numpy as np

from korch.errors import KorchError
from korch.frontend.lowering import Lowering, OnnxNode, fission
from korch.frontend.onnx.rules_attention import linear_attention, merge_heads, rotary, split_heads
from korch.frontend.onnx.rules_linear import causal_conv_with_state
from korch.frontend.onnx.rules_reduce import rms_core
from korch.frontend.ops.attention import allowed_bias, attend, band_bias, repeat_heads
from korch.frontend.ops.elementwise import clip_core, softplus_core
from korch.frontend.ops.layout import gather_elements_core
from korch.frontend.ops.linear import matmul
from korch.ir.prims import FLOAT_DTYPES, Prim

MS = "com.microsoft"

# ------------------------------------------------------------------ attention


def _masked_keys(ctx: Lowering, mask: str, batch: int, seq: int, total: int) -> str:
    """Where a query may not attend a key (booleans, [batch, 1, 1 or seq, total]), from any of the
    mask_index forms: per batch entry the length ([batch]: right padding) or the end then the
    start ([2 * batch]: left padding); raw 0/1 masks [batch, total] or [batch, seq, total]."""
    shape = ctx.shape(mask)
    keys = ctx.const(np.arange(total, dtype="int64").reshape(1, 1, 1, total))
    if len(shape) == 1 and shape[0] in (batch, 2 * batch):
        bounds = ctx.reshape(ctx.cast(mask, "int64"), (shape[0], 1, 1, 1))
        masked = ctx.unary(Prim.NOT, ctx.elementwise(Prim.LT, keys, ctx.slice_axis(bounds, 0, 0, batch)))
        if shape[0] == 2 * batch:
            before = ctx.elementwise(Prim.LT, keys, ctx.slice_axis(bounds, 0, batch, batch))
            masked = ctx.elementwise(Prim.OR, masked, before)
        return masked
    if shape in ((batch, total), (batch, seq, total)):
        kept = ctx.elementwise(Prim.GT, mask, ctx.scalar(0, ctx.dtype(mask)))
        return ctx.reshape(ctx.unary(Prim.NOT, kept), (batch, 1, 1 if len(shape) == 2 else seq, total))
    ctx.unsupported(f"Attention mask_index of shape {list(shape)}")
    raise AssertionError  # (unsupported raises)


def _scores_bias(
    ctx: Lowering, n: OnnxNode, mask: str | None, attention_bias: str | None, shape, dtype: str
) -> str | None:
    """What ONNX Runtime adds to the scaled scores [batch, heads, seq, total]: mask_filter_value (a
    finite -10000 by default) where the mask hides a key; -inf at a causal (unidirectional) model's
    future keys, aligned bottom-right (query i sits at i + total - seq): ONNX Runtime never reads
    them, so a query the mask hides every past key from still spreads over those past keys; and
    attention_bias."""
    batch, seq, total = shape
    terms = []
    if mask is not None:
        masked = _masked_keys(ctx, mask, batch, seq, total)
        fill = ctx.scalar(n.attr("mask_filter_value", -10000.0), dtype)
        terms.append(ctx.elementwise(Prim.WHERE, masked, fill, ctx.scalar(0, dtype)))
    if n.attr("unidirectional", 0):
        terms.append(ctx.const(np.triu(np.full((seq, total), -np.inf, dtype), 1 + total - seq)))
    if attention_bias is not None:
        terms.append(attention_bias)
    bias = None
    for term in terms:
        bias = term if bias is None else ctx.elementwise(Prim.ADD, bias, term)
    return bias


def _attend_heads(ctx: Lowering, n: OnnxNode, q: str, k: str, v: str, mask, attention_bias) -> str:
    """softmax(q k^T * scale + _scores_bias) v over [batch, heads, seq or keys, size] tensors, as
    [batch, seq, heads * size]; scale the node's, or (0 or none) 1/sqrt(size)."""
    batch, _, seq, _ = ctx.shape(q)
    bias = _scores_bias(ctx, n, mask, attention_bias, (batch, seq, ctx.shape(k)[2]), ctx.dtype(q))
    y, _ = attend(ctx, q, k, v, bias, False, n.attr("scale", 0.0) or None)
    return merge_heads(ctx, y)


@fission("Attention", 1, domain=MS)
def ms_attention(ctx: Lowering, n: OnnxNode) -> list[str | None]:
    """Multi-head self-attention from one packed projection: [q | k | v] = input @ weights + bias,
    softmax(q k^T * scale + mask + attention_bias) v per head (see _scores_bias), after a past
    state [2, batch, heads, past, size] if given; outputs y and the present state."""
    x, weights, bias, mask = n.inputs[0], n.inputs[1], n.input(2), n.input(3)
    past, attention_bias = n.input(4), n.input(5)
    if n.input(6) is not None:
        ctx.unsupported("Attention with past_sequence_length (a shared past buffer)")
    if n.attr("do_rotary", 0) or n.attr("past_present_share_buffer", 0):
        ctx.unsupported("Attention with do_rotary or past_present_share_buffer")
    n.attr("rotary_embedding_dim", 0)  # (do_rotary's)
    dtype = ctx.dtype(x)
    if dtype not in FLOAT_DTYPES or ctx.rank(x) != 3:
        raise KorchError(f"Attention input must be a 3-D float tensor, not {dtype} {list(ctx.shape(x))}")
    heads = n.attr("num_heads")
    width = ctx.shape(weights)[-1]
    sizes = list(n.attr("qkv_hidden_sizes", None) or [width // 3] * 3)
    if len(sizes) != 3 or sum(sizes) != width or sizes[0] != sizes[1] or any(s % heads for s in sizes):
        raise KorchError(f"Attention qkv sizes {sizes} do not split weights {width} wide into {heads} heads")
    if past is not None and len(set(sizes)) != 1:
        raise KorchError("Attention with a past state needs equal q, k and v sizes")
    packed = matmul(ctx, x, weights)
    if bias is not None:
        packed = ctx.elementwise(Prim.ADD, packed, bias)
    q, k, v = (split_heads(ctx, ctx.slice_axis(packed, 2, sum(sizes[:i]), sizes[i]), heads) for i in range(3))
    if past is not None:
        size = ctx.shape(past)[1:]
        k, v = (
            ctx.concat([ctx.reshape(ctx.slice_axis(past, 0, i, 1), size), t], 2) for i, t in enumerate((k, v))
        )
    y = _attend_heads(ctx, n, q, k, v, mask, attention_bias)
    if not n.wants(1):
        return [y, None]
    if len(set(sizes)) != 1:
        raise KorchError("Attention's present output needs equal q, k and v sizes")
    present = ctx.concat([ctx.reshape(t, (1, *ctx.shape(t))) for t in (k, v)], 0)
    return [y, present]


@fission("MultiHeadAttention", 1, domain=MS)
def ms_multi_head_attention(ctx: Lowering, n: OnnxNode) -> list[str | None]:
    """softmax(q k^T * scale + mask + attention_bias) v per head (see _scores_bias), from q
    [batch, seq, hidden], k and v [batch, kv, hidden] (each with its slice of bias) or already
    [batch, heads, kv, size], after past_key and past_value if given; outputs y, present_key and
    present_value. (ONNX Runtime's CPU kernel runs no packed QKV or KV, nor the qk output.)"""
    q, k, v, bias, mask, attention_bias, past_k, past_v = (n.input(i) for i in range(8))
    if n.input(8) is not None or n.input(9) is not None:
        ctx.unsupported("MultiHeadAttention with past_sequence_length or cache_indirection")
    if k is None or v is None or ctx.rank(q) != 3:
        ctx.unsupported("MultiHeadAttention with packed QKV or KV")
    if n.wants(3):
        ctx.unsupported("MultiHeadAttention's qk output")
    if (past_k is None) != (past_v is None):
        raise KorchError("MultiHeadAttention needs past_key and past_value together")
    dtype, heads = ctx.dtype(q), n.attr("num_heads")
    if dtype not in FLOAT_DTYPES:
        raise KorchError(f"MultiHeadAttention on {dtype}")
    hidden = ctx.shape(q)[2]
    sizes = [hidden, hidden, ctx.shape(v)[-1] * (1 if ctx.rank(v) == 3 else ctx.shape(v)[1])]
    if bias is not None and ctx.shape(bias) != (sum(sizes),):
        raise KorchError(f"MultiHeadAttention bias {list(ctx.shape(bias))} is not [{sum(sizes)}]")
    projected = []
    for i, t in enumerate((q, k, v)):
        if ctx.rank(t) == 4:  # [batch, heads, kv, size]: already split, no bias
            if bias is not None:
                ctx.unsupported("MultiHeadAttention with a bias and 4-D key or value")
            projected.append(t)
            continue
        if bias is not None:
            t = ctx.elementwise(Prim.ADD, t, ctx.slice_axis(bias, 0, sum(sizes[:i]), sizes[i]))
        projected.append(split_heads(ctx, t, heads))
    q, k, v = projected
    if past_k is not None:
        k, v = ctx.concat([past_k, k], 2), ctx.concat([past_v, v], 2)
    return [_attend_heads(ctx, n, q, k, v, mask, attention_bias), k, v, None]


@fission("RotaryEmbedding", 1, domain=MS)
def ms_rotary_embedding(ctx: Lowering, n: OnnxNode) -> list[str]:
    """ONNX's RotaryEmbedding with ONNX Runtime's inputs (x, position_ids, cos_cache, sin_cache):
    position_ids [batch, seq], or one offset (positions offset, offset + 1, ...); without num_heads
    a 3-D x's heads are as wide as the rotation. (scale: ONNX Runtime's CPU kernel ignores it.)"""
    x, positions, cos, sin = n.inputs[:4]
    if n.attr("is_packed_batching", 0):
        ctx.unsupported("RotaryEmbedding with is_packed_batching")
    n.attr("scale", 1.0)
    dim = n.attr("rotary_embedding_dim", 0)
    heads = n.attr("num_heads", 0)
    if ctx.rank(x) == 3 and not heads:
        heads = ctx.shape(x)[2] // (2 * ctx.shape(cos)[-1])
    seq = ctx.shape(x)[-2] if ctx.rank(x) == 4 else ctx.shape(x)[1]
    if ctx.type(positions).numel == 1 and ctx.shape(positions) != (ctx.shape(x)[0], seq):
        steps = ctx.const(np.arange(seq, dtype=ctx.dtype(positions)).reshape(1, seq))
        positions = ctx.elementwise(Prim.ADD, steps, ctx.reshape(positions, ()))
    cos, sin = (ctx.emit(Prim.GATHER, c, positions, axis=0) for c in (cos, sin))
    return [rotary(ctx, x, cos, sin, heads, dim, n.attr("interleaved", 0))]


@fission("MRotaryEmbedding", 1, domain=MS)
def ms_m_rotary_embedding(ctx: Lowering, n: OnnxNode) -> list[str]:
    """Multimodal RoPE (Qwen2-VL to Qwen3.5): position_ids [3, batch, seq] are three position
    streams (temporal, height, width) read from the same caches; each of the rotation's dim / 2
    angles takes its stream's: mrope_layout 0 in contiguous sections of mrope_section's sizes, 1
    from the temporal stream but every third from offset 1 (for 3 * section[1] angles) the height's
    and from offset 2 (3 * section[2]) the width's. Then RotaryEmbedding's rotation. (scale: ONNX
    Runtime's CPU kernel ignores it, as RotaryEmbedding's.)"""
    x, positions, cos, sin = n.inputs[:4]
    if n.attr("is_packed_batching", 0):
        ctx.unsupported("MRotaryEmbedding with is_packed_batching")
    n.attr("scale", 1.0)
    sections, layout = list(n.attr("mrope_section")), n.attr("mrope_layout", 0)
    half = ctx.shape(cos)[-1]
    if len(sections) != 3 or sum(sections) != half or layout not in (0, 1) or ctx.shape(positions)[0] != 3:
        raise KorchError(
            f"MRotaryEmbedding mrope_section {sections} (layout {layout}) for {half} angles and "
            f"position_ids {list(ctx.shape(positions))}"
        )
    angle = np.arange(half)
    if layout == 0:
        stream = np.searchsorted(np.cumsum(sections), angle, side="right")
    else:
        stream = np.zeros(half, int)
        for k in (1, 2):
            stream[(angle % 3 == k) & (angle < 3 * sections[k])] = k
    streams = [ctx.reshape(ctx.slice_axis(positions, 0, k, 1), ctx.shape(positions)[1:]) for k in range(3)]

    def combined(cache: str) -> str:
        read = [ctx.emit(Prim.GATHER, cache, p, axis=0) for p in streams]  # each [batch, seq, half]
        out = read[0]
        for k in (1, 2):
            out = ctx.elementwise(Prim.WHERE, ctx.const(stream == k), read[k], out)
        return out

    heads, dim = n.attr("num_heads", 0), n.attr("rotary_embedding_dim", 0)
    if ctx.rank(x) == 3 and not heads:
        raise KorchError("MRotaryEmbedding on a 3-D input needs num_heads")
    return [rotary(ctx, x, combined(cos), combined(sin), heads, dim, n.attr("interleaved", 0))]


@fission("GroupQueryAttention", 1, domain=MS)
def ms_group_query_attention(ctx: Lowering, n: OnnxNode) -> list[str | None]:
    """Causal attention of `num_heads` query heads over `kv_num_heads` key/value heads with a KV
    cache, as onnxruntime-genai's model builder writes LLaMA, Qwen, Phi, Mistral, ...: q, k and v
    [batch, seq, heads * size] (or packed in the query); past_key and past_value [batch, kv heads,
    past, size]; per batch entry T = seqlens_k + 1 tokens after this step, of which the last
    min(seq, T) are new (starting at start = max(T - seq, 0)). The new keys and values (rotated
    at positions start, start + 1, ... when do_rotary) go after the first `start` rows of the past
    into present [batch, kv heads, max(total_sequence_length, past), size] (zeros past T); query s
    attends keys start + s back to start + s - local_window_size + 1 (all, without a window), the
    scores scaled (1/sqrt(size) by default), soft-capped, plus attention_bias; head_sink (or
    smooth_softmax's 0) is one more score per head in the softmax. Window-sized caches:
    _sliding_cache. Cache rows past T and padding queries' outputs are unspecified in ONNX
    Runtime."""
    q, k, v = _gqa_qkv(ctx, n)
    past_k, past_v, seqlens, total = (n.input(i) for i in range(3, 7))
    heads, kv_heads = n.attr("num_heads"), n.attr("kv_num_heads")
    (batch, seq, _), dtype = ctx.shape(q), ctx.dtype(q)
    # per batch entry, [batch, 1, 1, 1]: tokens after this step, and where the new ones start
    lengths = ctx.elementwise(
        Prim.ADD, ctx.reshape(ctx.cast(seqlens, "int64"), (batch, 1, 1, 1)), ctx.scalar(1, "int64")
    )
    start = ctx.elementwise(
        Prim.MAX, ctx.elementwise(Prim.SUB, lengths, ctx.scalar(seq, "int64")), ctx.scalar(0, "int64")
    )
    q, k = _gqa_rotated(ctx, n, q, k, start)
    news, pasts = [split_heads(ctx, k, kv_heads), split_heads(ctx, v, kv_heads)], [past_k, past_v]
    window, attention_bias = n.attr("local_window_size", -1), n.input(10)
    if n.attr("sliding_window_cache", 0):
        if attention_bias is not None:
            ctx.unsupported("GroupQueryAttention with sliding_window_cache and attention_bias")
        held, present, bias = _sliding_cache(ctx, news, pasts, lengths, window, dtype)
    else:  # (a window-sized cache's rows are its past's: total_sequence_length is read only here)
        past = ctx.shape(past_k)[2] if past_k is not None else 0
        span = max(
            int(ctx.require_const(total, "GroupQueryAttention total_sequence_length").reshape(-1)[0]), past
        )
        present = [_kv_cache(ctx, t, p, lengths, start, span) for t, p in zip(news, pasts)]
        held = present
        bias = band_bias(ctx, seq, span, start, 0, window - 1 if window > 0 else None, dtype)
        if attention_bias is not None:
            bias = ctx.elementwise(Prim.ADD, bias, attention_bias)
    keys, values = (repeat_heads(ctx, t, heads // kv_heads) for t in held)
    sink = n.input(11)  # (a score per head that takes a share of the softmax: smooth_softmax's is 0)
    if n.attr("smooth_softmax", 0) == 1 and sink is None:
        sink = ctx.const(np.zeros(heads, dtype))
    scale, softcap = n.attr("scale", 0.0) or None, n.attr("softcap", 0.0)
    y, _ = attend(ctx, split_heads(ctx, q, heads), keys, values, bias, False, scale, softcap, sink=sink)
    return [merge_heads(ctx, y), *present, None]


def _gqa_qkv(ctx: Lowering, n: OnnxNode) -> tuple[str, str, str]:
    """GroupQueryAttention's query, key and value [batch, seq, heads * size] (the key and value
    unpacked from the query when packed), checked with the past against the head counts; what
    ONNX Runtime's CPU kernel does not run refused."""
    q, k, v, past_k, past_v = (n.input(i) for i in range(5))
    cos, sin = n.input(7), n.input(8)
    if any(n.input(i) is not None for i in (9, *range(12, 18))) or n.wants(3):
        ctx.unsupported(
            "GroupQueryAttention with position_ids, a quantized cache, q/k norms, query_seqlens "
            "or the qk output"
        )
    if n.attr("qk_output", 0):
        ctx.unsupported("GroupQueryAttention's qk_output")
    quantized = {n.attr("k_quant_type", "NONE"), n.attr("v_quant_type", "NONE")} != {"NONE"}
    if not n.attr("causal", 1) or quantized:
        ctx.unsupported("GroupQueryAttention without causal masking or with a quantized cache")
    heads, kv_heads = n.attr("num_heads"), n.attr("kv_num_heads")
    dtype = ctx.dtype(q)
    if dtype not in FLOAT_DTYPES or ctx.rank(q) != 3 or heads <= 0 or kv_heads <= 0 or heads % kv_heads:
        raise KorchError(
            f"GroupQueryAttention needs a 3-D float query and num_heads a multiple of kv_num_heads, not "
            f"{dtype} {list(ctx.shape(q))}, {heads} and {kv_heads} heads"
        )
    batch, seq, width = ctx.shape(q)
    if (k is None) != (v is None) or (past_k is None) != (past_v is None) or (cos is None) != (sin is None):
        raise KorchError(
            "GroupQueryAttention needs key and value, past_key and past_value, cos and sin in pairs"
        )
    size = width // (heads if k is not None else heads + 2 * kv_heads)
    if k is None:  # packed [q | k | v]
        starts, counts = (0, heads, heads + kv_heads), (heads, kv_heads, kv_heads)
        q, k, v = (ctx.slice_axis(q, 2, a * size, b * size) for a, b in zip(starts, counts))
    for t, h in ((q, heads), (k, kv_heads), (v, kv_heads)):
        if ctx.shape(t) != (batch, seq, h * size):
            raise KorchError(
                f"GroupQueryAttention input {list(ctx.shape(t))} is not [{batch}, {seq}, {h * size}]"
            )
    past = ctx.shape(past_k)[2] if past_k is not None else 0
    if past_k is not None and ctx.shape(past_k) != (batch, kv_heads, past, size):
        raise KorchError(
            f"GroupQueryAttention past {list(ctx.shape(past_k))} is not [{batch}, {kv_heads}, P, {size}]"
        )
    return q, k, v


def _gqa_rotated(ctx: Lowering, n: OnnxNode, q: str, k: str, start: str) -> tuple[str, str]:
    """GroupQueryAttention's query and new keys rotated at positions start, start + 1, ... (when
    do_rotary; else as they are)."""
    cos, sin = n.input(7), n.input(8)
    heads, kv_heads = n.attr("num_heads"), n.attr("kv_num_heads")
    interleaved = n.attr("rotary_interleaved", 0)
    if not n.attr("do_rotary", 0):
        return q, k
    if cos is None:
        raise KorchError("GroupQueryAttention with do_rotary needs cos_cache and sin_cache")
    batch, seq, _ = ctx.shape(q)
    steps = ctx.const(np.arange(seq, dtype="int64").reshape(1, seq))
    positions = ctx.elementwise(Prim.ADD, ctx.reshape(start, (batch, 1)), steps)
    positions = _clamp(ctx, positions, ctx.shape(cos)[0] - 1)  # (garbage in, no crash)
    cos, sin = (ctx.emit(Prim.GATHER, c, positions, axis=0) for c in (cos, sin))
    dim = 2 * ctx.shape(cos)[-1]
    return (
        rotary(ctx, q, cos, sin, heads, dim, interleaved),
        rotary(ctx, k, cos, sin, kv_heads, dim, interleaved),
    )


def _kv_cache(ctx: Lowering, new: str, past: str | None, lengths: str, start: str, span: int) -> str:
    """GroupQueryAttention's present [batch, kv heads, span, size]: per batch entry the past's
    first `start` rows, then the new rows up to `lengths`, then zeros. Known lengths that append
    every new row after the whole past make it a concatenation."""
    batch, kv_heads, seq, size = ctx.shape(new)
    rows = ctx.shape(past)[2] if past is not None else 0
    known = ctx.const_value(lengths)
    if known is not None and rows + seq == span and np.all(known == span):
        return new if past is None else ctx.concat([past, new], 2)
    t = ctx.const(np.arange(span, dtype="int64").reshape(1, 1, span, 1))
    offset = _clamp(ctx, ctx.elementwise(Prim.SUB, t, start), seq - 1)
    fresh = gather_elements_core(ctx, new, ctx.broadcast_to(offset, (batch, kv_heads, span, size)), 2)
    zero = ctx.scalar(0, ctx.dtype(new))
    cache = ctx.elementwise(Prim.WHERE, ctx.elementwise(Prim.LT, t, lengths), fresh, zero)
    if past is None:
        return cache
    if rows < span:
        past = ctx.emit(Prim.PAD, past, pads=[0, 0, 0, 0, 0, 0, span - rows, 0], mode="constant", value=0)
    return ctx.elementwise(Prim.WHERE, ctx.elementwise(Prim.LT, t, start), past, cache)


def _sliding_cache(
    ctx: Lowering, news: list[str], pasts: list[str | None], lengths: str, window: int, dtype: str
) -> tuple[list[str], list[str], str]:
    """GroupQueryAttention's window-sized caches (sliding_window_cache): past and present hold C
    rows (past's length), of which the first L(T) are the last L(T) positions in order, where
    L(T) = T up to C, else T - G * ceil((T - C) / G) with G = C - local_window_size + 1 (positions
    are evicted G at a time). Returns the keys and values a query reads (the past's rows, then the
    new ones), the present caches, and the bias that lets query s (at position start + s) see
    the positions start + s - local_window_size + 1 .. start + s among them. The lengths must be
    known (a pinned attention mask): they decide which rows are positions."""
    known = ctx.const_value(lengths)
    if known is None:
        ctx.unsupported("GroupQueryAttention's sliding_window_cache with lengths known only at run time")
    if pasts[0] is None or window <= 0 or ctx.shape(pasts[0])[2] < window:
        raise KorchError(
            "GroupQueryAttention's sliding_window_cache needs a past at least local_window_size long"
        )
    batch, kv_heads, seq, size = ctx.shape(news[0])
    capacity = ctx.shape(pasts[0])[2]
    group = capacity - window + 1

    def resident(total: int) -> int:
        return total if total <= capacity else total - group * -(-(total - capacity) // group)

    allowed = np.zeros((batch, 1, seq, capacity + seq), bool)
    rows = np.zeros((batch, 1, capacity, 1), "int64")  # which key row each present row holds
    kept = np.zeros((batch, 1, capacity, 1), bool)
    for b, total in enumerate(known.reshape(-1).tolist()):
        new = min(seq, total)
        before = total - new
        held = resident(before)
        unused = np.full(capacity - held, -(2**40))  # (no position: never attended)
        position = np.concatenate([np.arange(before - held, before), unused, np.arange(before, total)])
        position = np.concatenate([position, np.full(seq - new, -(2**40))])
        behind = (before + np.arange(seq))[:, None] - position[None, :]
        allowed[b, 0] = (behind >= 0) & (behind < window)
        allowed[b, 0, new:] = position >= 0  # (padding queries: unspecified, any real key)
        wanted = np.arange(total - resident(total), total)
        rows[b, 0, : len(wanted), 0] = np.where(
            wanted < before, wanted - before + held, capacity + wanted - before
        )
        kept[b, 0, : len(wanted), 0] = True
    keys = [ctx.concat([p, t], 2) for p, t in zip(pasts, news)]
    index = ctx.const(np.broadcast_to(rows, (batch, kv_heads, capacity, size)).copy())
    zero = ctx.scalar(0, dtype)
    present = [
        ctx.elementwise(Prim.WHERE, ctx.const(kept), gather_elements_core(ctx, t, index, 2), zero)
        for t in keys
    ]
    return keys, present, allowed_bias(ctx, ctx.const(allowed), dtype)


def _clamp(ctx: Lowering, index: str, last: int) -> str:
    """An int64 index held to 0 .. last."""
    return clip_core(ctx, index, ctx.scalar(0, "int64"), ctx.scalar(last, "int64"))


# -------------------------------- linear attention and its convolution (Qwen3.5, LFM2, Mamba)

# ONNX's CausalConvWithState (opset 27), with ONNX Runtime's further attributes: one rule for both
fission("CausalConvWithState", 1, domain=MS)(causal_conv_with_state)


@fission("LinearAttention", 1, domain=MS)
def ms_linear_attention(ctx: Lowering, n: OnnxNode) -> list[str]:
    return linear_attention(ctx, n, inverse=True)  # (more key/value heads than query heads too)


@fission("LinearAttentionGate", 1, domain=MS)
def linear_attention_gate(ctx: Lowering, n: OnnxNode) -> list[str | None]:
    """LinearAttention's gates from their projections: decay = decay_scale * softplus(a + dt_bias)
    (per head, in float32), beta = sigmoid(b)."""
    a, dt_bias, decay_scale, b = n.inputs[0], n.inputs[1], n.inputs[2], n.input(3)
    if n.wants(1) and b is None:
        raise KorchError("LinearAttentionGate's beta output needs its input b")
    x, dtype = ctx.widened(a)
    x = ctx.elementwise(Prim.ADD, x, ctx.cast(dt_bias, "float32"))
    decay = ctx.elementwise(Prim.MUL, ctx.cast(decay_scale, "float32"), softplus_core(ctx, x))
    beta = None if b is None else ctx.cast(ctx.unary(Prim.SIGMOID, ctx.cast(b, "float32")), ctx.dtype(b))
    return [ctx.cast(decay, dtype), beta]


@fission("GatedRMSNorm", 1, domain=MS)
def gated_rms_norm(ctx: Lowering, n: OnnxNode) -> list[str]:
    """The output norm of Mamba2 and Gated DeltaNet layers: RMSNorm over each run of C elements of
    x's last axis (C = scale's length: a norm per head of a packed [B, T, H * C]), times scale,
    times the gate's activation (silu or swish: z * sigmoid(z); sigmoid); in float32."""
    x, scale, gate = n.inputs[:3]
    activation, shape, width = n.attr("activation", "silu"), ctx.shape(n.inputs[0]), ctx.shape(scale)[0]
    if activation not in ("silu", "swish", "sigmoid"):
        ctx.unsupported(f"GatedRMSNorm activation {activation}")
    if shape[-1] % width or ctx.shape(gate) != shape:
        raise KorchError(f"GatedRMSNorm input {list(shape)}, scale [{width}], gate {list(ctx.shape(gate))}")
    x, dtype = ctx.widened(x)
    runs = ctx.reshape(x, (*shape[:-1], shape[-1] // width, width))
    y, _ = rms_core(ctx, runs, ctx.cast(scale, "float32"), len(shape), n.attr("epsilon", 1e-5))
    z = ctx.cast(gate, "float32")
    gated = ctx.unary(Prim.SIGMOID, z)
    if activation != "sigmoid":
        gated = ctx.elementwise(Prim.MUL, z, gated)
    return [ctx.cast(ctx.elementwise(Prim.MUL, ctx.reshape(y, shape), gated), dtype)]


@fission("GatedAdd", 1, domain=MS)
def gated_add(ctx: Lowering, n: OnnxNode) -> list[str]:
    """x + y * gate, gate [..., 1] per row (Qwen3.5-MoE's shared expert added to the routed ones),
    in x's type as separate Mul and Add would be. (With gate_weight, ONNX Runtime's CUDA kernel
    projects the gate first: not lowered.)"""
    x, y, gate = n.inputs[:3]
    if n.input(3) is not None:
        ctx.unsupported("GatedAdd with gate_weight (ONNX Runtime runs it on CUDA in bfloat16 only)")
    if ctx.shape(gate) != (*ctx.shape(x)[:-1], 1):
        raise KorchError(f"GatedAdd gate {list(ctx.shape(gate))} is not one per row of {list(ctx.shape(x))}")
    return [ctx.elementwise(Prim.ADD, x, ctx.elementwise(Prim.MUL, y, gate))]
