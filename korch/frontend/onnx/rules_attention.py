"""ONNX's Attention operator (opset 23 on; what torch.onnx exports scaled_dot_product_attention as)
split into matmuls, a mask, a softmax and elementwise work, so its pieces fuse like any other's;
RotaryEmbedding (opset 23) as slices, products and a concatenation.
The semantics are the spec's reference (onnx.reference.ops.op_attention), sliding windows and
per-batch key lengths (nonpad_kv_seqlen, known at run time) among them."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from korch.config import CHUNKED_FROM
from korch.errors import KorchError
from korch.frontend.lowering import Lowering, OnnxNode, fission
from korch.frontend.onnx.tensor_types import onnx_dtype
from korch.frontend.ops.attention import allowed_bias, attend, band_bias, repeat_heads
from korch.frontend.ops.linear import matmul
from korch.ir.prims import FLOAT_DTYPES, Prim


def merge_heads(ctx: Lowering, y: str) -> str:
    """[batch, heads, seq, size] -> [batch, seq, heads * size]."""
    b, h, s, d = ctx.shape(y)
    return ctx.reshape(ctx.transpose(y, (0, 2, 1, 3)), (b, s, h * d))


def split_heads(ctx: Lowering, x: str, heads: int) -> str:
    """[batch, seq, heads * size] -> [batch, heads, seq, size]."""
    b, s, hidden = ctx.shape(x)
    if hidden % heads:
        raise KorchError(f"hidden size {hidden} is not a multiple of {heads} heads")
    return ctx.transpose(ctx.reshape(x, (b, s, heads, hidden // heads)), (0, 2, 1, 3))


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
        mask = allowed_bias(ctx, mask, dtype)
    return mask


@fission("Attention", 23)
def attention(ctx: Lowering, n: OnnxNode) -> list[str]:
    q, k, v = n.inputs[0], n.inputs[1], n.inputs[2]
    mask, past_k, past_v = n.input(3), n.input(4), n.input(5)
    dtype = ctx.dtype(q)
    if dtype not in FLOAT_DTYPES:
        raise KorchError(f"Attention on {dtype}")
    nonpad = n.input(6)  # (per batch entry, how many keys are real: an external cache)
    left, right = n.attr("left_window_size", -1), n.attr("right_window_size", -1)
    if (past_k is None) != (past_v is None):
        raise KorchError("Attention needs past_key and past_value together")
    if nonpad is not None and past_k is not None:
        raise KorchError("Attention takes nonpad_kv_seqlen or a past cache, not both")
    if min(left, right) < -1:
        raise KorchError(f"Attention window sizes {left, right} must be -1 or nonnegative")
    three_d = ctx.rank(q) == 3
    q_heads, kv_heads = n.attr("q_num_heads", None), n.attr("kv_num_heads", None)
    if three_d:
        if q_heads is None or kv_heads is None:
            raise KorchError("Attention on 3D inputs needs q_num_heads and kv_num_heads")
        q, k, v = split_heads(ctx, q, q_heads), split_heads(ctx, k, kv_heads), split_heads(ctx, v, kv_heads)
    elif (q_heads, kv_heads) != (None, None) and (q_heads, kv_heads) != (ctx.shape(q)[1], ctx.shape(k)[1]):
        raise KorchError(f"q_num_heads and kv_num_heads {q_heads, kv_heads} disagree with the 4D inputs")
    if past_k is not None:
        k, v = ctx.concat([past_k, k], axis=2), ctx.concat([past_v, v], axis=2)
    present = [k, v]
    q_len, kv_len = ctx.shape(q)[2], ctx.shape(k)[2]

    # the additive bias: the mask; the causal frontier and the sliding window, both aligned
    # bottom-right: query i sits at i + offset, offset the past's length or, per batch entry,
    # nonpad_kv_seqlen - q_len; the padding past nonpad_kv_seqlen
    bias = None if mask is None else _mask_bias(ctx, mask, kv_len, dtype)
    if nonpad is not None:
        lengths = ctx.reshape(ctx.cast(nonpad, "int64"), (ctx.shape(nonpad)[0], 1, 1, 1))
        offset = ctx.elementwise(Prim.SUB, lengths, ctx.scalar(q_len, "int64"))
    else:
        offset = ctx.shape(past_k)[2] if past_k is not None else 0
    bands = [(0, None)] if n.attr("is_causal", 0) else []  # (bounds of (i + offset) - j)
    windowed = left >= 0 or right >= 0
    if windowed:
        bands.append((-right if right >= 0 else None, left if left >= 0 else None))
    for low, high in bands:
        band = band_bias(ctx, q_len, kv_len, offset, low, high, dtype)
        bias = band if bias is None else ctx.elementwise(Prim.ADD, bias, band)
    if nonpad is not None:
        keys = ctx.const(np.arange(kv_len, dtype="int64").reshape(1, 1, 1, kv_len))
        real = ctx.elementwise(Prim.LT, keys, lengths)
        padding = allowed_bias(ctx, real, dtype)
        bias = padding if bias is None else ctx.elementwise(Prim.ADD, bias, padding)

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
    masked = mask is not None or nonpad is not None or windowed
    y, stages = attend(ctx, q, k, v, bias, masked, n.attr("scale", None), n.attr("softcap", 0.0), precision)
    if three_d:
        y = merge_heads(ctx, y)
    # the scaled scores (mode 0: the spec's text and ONNX Runtime; onnx's reference applies the
    # softcap first), after the softcap (1), with the bias too (2), the probabilities (3)
    return [y, *present, stages[mode]][: n.n_outputs]


@fission("RotaryEmbedding", 23)
def rotary_embedding(ctx: Lowering, n: OnnxNode) -> list[str]:
    """The spec's function (see rotary); the caches are [positions, dim / 2], read at
    position_ids, or [batch, seq, dim / 2] already read."""
    x, cos, sin = n.inputs[:3]
    positions = n.input(3)
    if ctx.rank(x) == 3 and not n.attr("num_heads", 0):
        raise KorchError("RotaryEmbedding on a 3D input needs num_heads")
    heads, dim = n.attr("num_heads", 0), n.attr("rotary_embedding_dim", 0)
    if positions is not None:
        cos, sin = (ctx.emit(Prim.GATHER, c, positions, axis=0) for c in (cos, sin))
    return [rotary(ctx, x, cos, sin, heads, dim, n.attr("interleaved", 0))]


def rotary(ctx: Lowering, x: str, cos: str, sin: str, heads: int, dim: int, interleaved: bool) -> str:
    """x's first `dim` features of each head (all when 0) rotated pairwise by the cached angles of
    their positions: a pair is the two halves of those features, or two neighbours (interleaved);
    the other features pass through. x is [batch, heads, seq, size], or [batch, seq, heads * size]
    with `heads`; cos and sin [batch or 1, seq, dim / 2]."""
    if ctx.rank(x) == 3:
        batch, seq, hidden = ctx.shape(x)
        rows = ctx.reshape(x, (batch, seq, heads, hidden // heads))
    elif ctx.rank(x) == 4:
        rows = ctx.transpose(x, (0, 2, 1, 3))
    else:
        raise KorchError(f"RotaryEmbedding on a rank-{ctx.rank(x)} input")
    batch, seq, heads, size = ctx.shape(rows)
    dim = dim or size
    half = dim // 2
    if ctx.shape(cos)[-1] != half or ctx.shape(sin)[-1] != half:
        raise KorchError(
            f"RotaryEmbedding caches of width {ctx.shape(cos)[-1]}, not rotary_embedding_dim / 2 = {half}"
        )
    cos, sin = (ctx.reshape(c, (*ctx.shape(c)[:2], 1, half)) for c in (cos, sin))
    rotated = ctx.slice_axis(rows, 3, 0, dim)
    if interleaved:
        x1, x2 = ctx.slice_axis(rotated, 3, 0, half, 2), ctx.slice_axis(rotated, 3, 1, half, 2)
    else:
        x1, x2 = ctx.slice_axis(rotated, 3, 0, half), ctx.slice_axis(rotated, 3, half, half)

    def mul(a: str, b: str) -> str:
        return ctx.elementwise(Prim.MUL, a, b)

    real = ctx.elementwise(Prim.SUB, mul(cos, x1), mul(sin, x2))
    imag = ctx.elementwise(Prim.ADD, mul(sin, x1), mul(cos, x2))
    if interleaved:
        pairs = [ctx.reshape(v, (batch, seq, heads, half, 1)) for v in (real, imag)]
        rotated = ctx.reshape(ctx.concat(pairs, 4), (batch, seq, heads, dim))
    else:
        rotated = ctx.concat([real, imag], 3)
    out = rotated if dim == size else ctx.concat([rotated, ctx.slice_axis(rows, 3, dim, size - dim)], 3)
    if ctx.rank(x) == 3:
        return ctx.reshape(out, ctx.shape(x))
    return ctx.transpose(out, (0, 2, 1, 3))


@fission("LinearAttention", 27)
def linear_attention(ctx: Lowering, n: OnnxNode, inverse: bool = False) -> list[str]:
    """Attention with a recurrent state S [B, H_kv, d_k, d_v] instead of a softmax, unrolled over
    the (static) sequence (from CHUNKED_FROM steps with decays per head, in chunks:
    _chunked_linear_attention): per step S decays by exp(decay) (gated rules), the value is corrected by
    what S already recalls for the key, times beta (delta rules), S gains key (x) value, and the
    query reads scale * q S (each key/value head serving q_num_heads / kv_num_heads query heads,
    or, with more key/value heads where `inverse` allows it, as ONNX Runtime's own operator, each
    query head kv_num_heads / q_num_heads of them). Computed in float32; the output and the
    present state in the inputs' dtypes."""
    query, key, value = n.inputs[:3]
    past, decay, beta = n.input(3), n.input(4), n.input(5)
    r = _recurrence(ctx, n, inverse)
    present_dtype = ctx.dtype(past) if past is not None else ctx.dtype(query)
    chunked = ctx.shape(query)[1] >= CHUNKED_FROM and (not r.gating or ctx.shape(decay)[2] == r.kv_heads)
    unrolled = _chunked_linear_attention if chunked else _stepped_linear_attention
    y, state = unrolled(ctx, (query, key, value), r, past, decay, beta)
    return [ctx.cast(y, ctx.dtype(query)), ctx.cast(state, present_dtype)]


@dataclass(frozen=True)
class _Recurrence:
    """A LinearAttention node's update rule and heads, checked against its inputs."""

    gating: bool  # (a decay input: the gated rules)
    delta: bool  # (a beta input: the delta rules)
    heads: int  # query heads
    key_heads: int  # kv_num_heads; in the inverse grouping as many as the query's too
    kv_heads: int  # value heads
    dk: int
    dv: int
    scale: float


def _recurrence(ctx: Lowering, n: OnnxNode, inverse: bool) -> _Recurrence:
    """The node's rule and head counts; unsupported or inconsistent ones refused."""
    query, key, value = n.inputs[:3]
    decay, beta = n.input(4), n.input(5)
    rule = n.attr("update_rule", "gated_delta")
    heads, kv_heads = n.attr("q_num_heads"), n.attr("kv_num_heads")
    n.attr("chunk_size", 0)  # (a tuning hint: no effect on the result)
    gating, delta = rule in ("gated", "gated_delta"), rule in ("delta", "gated_delta")
    if rule not in ("linear", "gated", "delta", "gated_delta") or gating != (decay is not None):
        ctx.unsupported(f"LinearAttention update_rule {rule} with{'out' * (decay is None)} decay")
    grouped = kv_heads % heads if inverse and kv_heads > heads else heads % kv_heads
    if delta != (beta is not None) or grouped:
        raise KorchError(f"LinearAttention {rule}: beta given {beta is not None}, heads {heads}/{kv_heads}")
    dk, dv = ctx.shape(query)[2] // heads, ctx.shape(value)[2] // kv_heads
    scale = n.attr("scale", 0.0) or 1 / math.sqrt(dk)
    key_heads = ctx.shape(key)[2] // dk  # kv_heads; in the inverse grouping heads too
    if key_heads not in (kv_heads, heads if kv_heads > heads else kv_heads):
        raise KorchError(f"LinearAttention key {list(ctx.shape(key))}: not {kv_heads} heads of {dk}")
    if gating and ctx.shape(decay)[2] not in (kv_heads, kv_heads * dk):
        raise KorchError(
            f"LinearAttention decay {list(ctx.shape(decay))}: a value per head or per key dimension"
        )
    if delta and ctx.shape(beta)[2] not in (kv_heads, 1):
        raise KorchError(f"LinearAttention beta {list(ctx.shape(beta))}: a value per head or one")
    return _Recurrence(gating, delta, heads, key_heads, kv_heads, dk, dv, scale)


def _initial_state(ctx: Lowering, past: str | None, shape: tuple[int, ...]) -> str:
    """The state the recurrence starts from, in float32: the past one, or zeros."""
    return ctx.cast(past, "float32") if past is not None else ctx.const(np.zeros(shape, "float32"))


def _mul(ctx: Lowering, x: str, y: str) -> str:
    return ctx.elementwise(Prim.MUL, x, y)


# ------------------------------------------------ linear attention a step at a time


def _stepped_linear_attention(
    ctx: Lowering, qkv: tuple[str, str, str], r: _Recurrence, past, decay, beta
) -> tuple[str, str]:
    """linear_attention's recurrence a step at a time (see _step and _read). The outputs
    [B, T, H * d_v] and the last state [B, H_kv, d_k, d_v], in float32."""
    query, key, value = qkv
    b, t, _ = ctx.shape(query)
    qs, ks, vs = (_steps(ctx, x, count, b, t) for x, count in zip(qkv, (r.heads, r.key_heads, r.kv_heads)))
    heads = r.heads
    if r.kv_heads > heads:  # (ONNX Runtime's inverse grouping: query head h, and key head h when
        # there are as many, serve the next kv_heads / heads value heads; an output per value head)
        qs = [_widened(ctx, q, r.kv_heads) for q in qs]
        ks = ks if r.key_heads == r.kv_heads else [_widened(ctx, k, r.kv_heads) for k in ks]
        heads = r.kv_heads
    decays = _steps(ctx, decay, r.kv_heads, b, t) if r.gating else [None] * t
    betas = _steps(ctx, beta, ctx.shape(beta)[2], b, t) if r.delta else [None] * t
    state = _initial_state(ctx, past, (b, r.kv_heads, r.dk, r.dv))
    outs = []
    for i in range(t):
        state = _step(ctx, state, ks[i], vs[i], decays[i], betas[i])
        outs.append(_read(ctx, state, qs[i], heads, r.scale))
    y = ctx.concat(outs, 2)  # [B, H, T, d_v]
    return ctx.reshape(ctx.transpose(y, (0, 2, 1, 3)), (b, t, heads * r.dv)), state


def _steps(ctx: Lowering, v: str, count: int, b: int, t: int) -> list[str]:
    """v [B, T, count * width] as T tensors [B, count, width] (float32)."""
    width = ctx.shape(v)[2] // count
    v = ctx.transpose(ctx.reshape(ctx.cast(v, "float32"), (b, t, count, width)), (0, 2, 1, 3))
    return [ctx.reshape(ctx.slice_axis(v, 2, i, 1), (b, count, width)) for i in range(t)]


def _widened(ctx: Lowering, x: str, kv_heads: int) -> str:
    """A step's heads [B, H, d_k], each repeated for the kv_heads / H value heads it serves."""
    b, heads, dk = ctx.shape(x)
    wide = (b, heads, kv_heads // heads, dk)
    return ctx.reshape(ctx.broadcast_to(ctx.reshape(x, (b, heads, 1, dk)), wide), (b, kv_heads, dk))


def _step(ctx: Lowering, state: str, k: str, v: str, decay: str | None, beta: str | None) -> str:
    """The state [B, H_kv, d_k, d_v] after one step: decayed by exp(decay) (a decay per head
    [B, H_kv, 1] or per key dimension [B, H_kv, d_k]), plus k (x) v, the value first corrected by
    what the state recalls for k, times beta (delta rules)."""
    b, kv_heads, dk, dv = ctx.shape(state)
    if decay is not None:
        g = ctx.unary(Prim.EXP, decay)
        state = _mul(ctx, state, ctx.reshape(g, (*ctx.shape(g), 1)))
    if beta is not None:
        recalled = ctx.reshape(matmul(ctx, ctx.reshape(k, (b, kv_heads, 1, dk)), state), (b, kv_heads, dv))
        v = _mul(ctx, beta, ctx.elementwise(Prim.SUB, v, recalled))
    outer = _mul(ctx, ctx.reshape(k, (b, kv_heads, dk, 1)), ctx.reshape(v, (b, kv_heads, 1, dv)))
    return ctx.elementwise(Prim.ADD, state, outer)


def _read(ctx: Lowering, state: str, q: str, heads: int, scale: float) -> str:
    """scale * q S for a step's query [B, heads, d_k]: [B, heads, 1, d_v] (each key/value head's
    state repeated for its group of query heads)."""
    b, kv_heads, dk, dv = ctx.shape(state)
    read = state
    if heads != kv_heads:
        grouped = ctx.broadcast_to(
            ctx.reshape(state, (b, kv_heads, 1, dk, dv)), (b, kv_heads, heads // kv_heads, dk, dv)
        )
        read = ctx.reshape(grouped, (b, heads, dk, dv))
    o = matmul(ctx, ctx.reshape(q, (b, heads, 1, dk)), read)  # [B, H, 1, d_v]
    return _mul(ctx, o, ctx.scalar(scale, "float32"))


# ------------------------------------------------------- linear attention in chunks


def _chunked_linear_attention(
    ctx: Lowering, qkv: tuple[str, str, str], r: _Recurrence, past, decay, beta
) -> tuple[str, str]:
    """linear_attention's recurrence over T steps in chunks of about sqrt(T) (the chunked form of
    DeltaNet and Gated DeltaNet, Yang et al. 2024: far fewer primitives than a step each, and
    matmuls). With g the cumulative log-decay within a chunk, position i sees j <= i through
    seen_ij = exp(g_i - g_j); the delta rule's corrected values u solve (I + A) u = beta (v -
    exp(g) k S0), A_ij = beta_i seen_ij k_i.k_j (j < i), by forward substitution (a step per
    position, every chunk at once), as P - R S0 with S0 the state the chunk starts from (without
    the delta rule u = v); then chunk by chunk o = scale (exp(g) q S0 + (seen * q k^T) u) and
    S = exp(g_last) S0 + (exp(g_last - g) k)^T u. Heads are spread to the larger
    of the query's and the values' counts (each key/value head's state computed once per query head
    it serves, or each query head read by each value head it serves). Decays per head only. The
    outputs [B, T, H * d_v] and the last state [B, H_kv, d_k, d_v], in float32."""
    b, t, _ = ctx.shape(qkv[0])
    cut = _Chunks(b, t, max(r.heads, r.kv_heads), max(4, math.ceil(math.sqrt(t))))
    q, k, v = (cut.spread(ctx, x, count) for x, count in zip(qkv, (r.heads, r.key_heads, r.kv_heads)))
    q, k, v = cut.split(ctx, q), cut.split(ctx, k), cut.split(ctx, v)
    k_t = _last_two_swapped(ctx, k)  # [.., dk, chunk]
    seen, grown, carried, last = _decays(ctx, cut, decay, r.kv_heads)
    p, to_subtract = _delta_values(ctx, cut, beta, k, k_t, v, seen, grown) if beta is not None else (v, None)
    reads = _mul(ctx, matmul(ctx, q, k_t), seen)  # [.., i, j]: q_i.k_j, j <= i
    kv_shape = (b, r.kv_heads, r.dk, r.dv)
    state = _initial_state(ctx, past, kv_shape)
    per_head = (b, r.kv_heads, cut.h // r.kv_heads, r.dk, r.dv)
    state = ctx.reshape(
        ctx.broadcast_to(ctx.reshape(state, (b, r.kv_heads, 1, r.dk, r.dv)), per_head), (b, cut.h, r.dk, r.dv)
    )
    outs = []
    for c in range(cut.count):
        u = cut.at(ctx, p, c)
        if to_subtract is not None:
            u = ctx.elementwise(Prim.SUB, u, matmul(ctx, cut.at(ctx, to_subtract, c), state))
        qc = cut.at(ctx, q, c) if grown is None else _mul(ctx, cut.at(ctx, grown, c), cut.at(ctx, q, c))
        outs.append(ctx.elementwise(Prim.ADD, matmul(ctx, qc, state), matmul(ctx, cut.at(ctx, reads, c), u)))
        kc = cut.at(ctx, k, c) if carried is None else _mul(ctx, cut.at(ctx, carried, c), cut.at(ctx, k, c))
        if last is not None:
            state = _mul(ctx, state, cut.at(ctx, last, c))
        state = ctx.elementwise(Prim.ADD, state, matmul(ctx, _last_two_swapped(ctx, kc), u))
    y = ctx.slice_axis(ctx.concat(outs, 2), 2, 0, t)  # [B, h, T, dv]
    y = _mul(ctx, y, ctx.scalar(r.scale, "float32"))
    y = ctx.reshape(ctx.transpose(y, (0, 2, 1, 3)), (b, t, cut.h * r.dv))
    return y, ctx.reshape(ctx.slice_axis(ctx.reshape(state, per_head), 2, 0, 1), kv_shape)


@dataclass(frozen=True)
class _Chunks:
    """T steps of B sequences over h heads, cut into chunks of `size` steps (the last padded)."""

    b: int
    t: int
    h: int
    size: int

    @property
    def count(self) -> int:
        return -(-self.t // self.size)

    def spread(self, ctx: Lowering, x: str, count: int) -> str:
        """x [B, T, count * w] as [B, h, T, w] in float32, each of its heads repeated for its run."""
        b, t, h = self.b, self.t, self.h
        w = ctx.shape(x)[2] // count
        x = ctx.transpose(ctx.reshape(ctx.cast(x, "float32"), (b, t, count, w)), (0, 2, 1, 3))
        wide = ctx.broadcast_to(ctx.reshape(x, (b, count, 1, t, w)), (b, count, h // count, t, w))
        return ctx.reshape(wide, (b, h, t, w))

    def split(self, ctx: Lowering, x: str) -> str:
        """[B, h, T, w] as [B, h, count, size, w], zeros after the last step (a zero key, value,
        beta and log-decay leave the state as it is)."""
        rank = ctx.rank(x)
        if self.count * self.size > self.t:
            pads = [0] * (2 * rank)
            pads[rank + 2] = self.count * self.size - self.t
            x = ctx.emit(Prim.PAD, x, pads=tuple(pads), mode="constant", value=0.0)
        return ctx.reshape(x, (self.b, self.h, self.count, self.size, ctx.shape(x)[3]))

    def at(self, ctx: Lowering, x: str, c: int) -> str:
        """Chunk c of x [B, h, count, ...]: [B, h, ...]."""
        return ctx.reshape(ctx.slice_axis(x, 2, c, 1), (self.b, self.h, *ctx.shape(x)[3:]))


def _last_two_swapped(ctx: Lowering, x: str) -> str:
    order = list(range(ctx.rank(x)))
    return ctx.transpose(x, (*order[:-2], order[-1], order[-2]))


def _decays(ctx: Lowering, cut: _Chunks, decay: str | None, kv_heads: int) -> tuple[str, ...]:
    """(seen, grown, carried, last) over each chunk [B, h, count, size, ..]: seen_ij = exp(g_i -
    g_j) for j <= i, else 0; exp(g_i); exp(g_last - g_j); exp(g_last), with g the cumulative
    log-decay within the chunk. Without decays seen is 1 for j <= i and the others None."""
    upto = np.tril(np.ones((cut.size, cut.size), bool))  # j <= i
    if decay is None:
        return ctx.const(upto.astype("float32")), None, None, None
    steps = _last_two_swapped(ctx, cut.split(ctx, cut.spread(ctx, decay, kv_heads)))
    g = matmul(ctx, steps, ctx.const(np.triu(np.ones((cut.size, cut.size), "float32"))))
    g = _last_two_swapped(ctx, g)  # [B, h, count, size, 1]: cumulative within each chunk
    apart = ctx.elementwise(Prim.SUB, g, _last_two_swapped(ctx, g))  # [.., i, j]: g_i - g_j
    seen = ctx.unary(
        Prim.EXP, ctx.elementwise(Prim.WHERE, ctx.const(upto), apart, ctx.scalar(-np.inf, "float32"))
    )
    grown = ctx.unary(Prim.EXP, g)  # exp(g_i)
    last = ctx.slice_axis(g, 3, cut.size - 1, 1)
    carried = ctx.unary(Prim.EXP, ctx.elementwise(Prim.SUB, last, g))  # exp(g_last - g_j)
    return seen, grown, carried, ctx.unary(Prim.EXP, last)


def _delta_values(
    ctx: Lowering, cut: _Chunks, beta: str, k: str, k_t: str, v: str, seen: str, grown: str | None
) -> tuple[str, str]:
    """(P, R), the delta rule's corrected values u = P - R S0 in each chunk: x_i = rhs_i -
    sum_{j<i} A_ij x_j solved by forward substitution, rhs = [beta v | beta exp(g) k]."""
    dk, dv = ctx.shape(k)[4], ctx.shape(v)[4]
    rate = cut.split(ctx, cut.spread(ctx, beta, ctx.shape(beta)[2]))  # (one for every head, or per head)
    lower = _mul(ctx, ctx.const(np.tril(np.ones((cut.size, cut.size), "float32"), -1)), seen)
    a = _mul(ctx, rate, _mul(ctx, matmul(ctx, k, k_t), lower))  # A_ij, j < i
    scaled_k = _mul(ctx, rate, k if grown is None else _mul(ctx, grown, k))
    rhs = ctx.concat([_mul(ctx, rate, v), scaled_k], 4)  # [.., size, dv + dk]
    rows = []
    for i in range(cut.size):
        row = ctx.slice_axis(rhs, 3, i, 1)
        if i:
            done = ctx.concat(rows, 3)
            earlier = matmul(ctx, ctx.slice_axis(ctx.slice_axis(a, 3, i, 1), 4, 0, i), done)
            row = ctx.elementwise(Prim.SUB, row, earlier)
        rows.append(row)
    solved = ctx.concat(rows, 3)
    return ctx.slice_axis(solved, 4, 0, dv), ctx.slice_axis(solved, 4, dv, dk)
