"""ONNX Runtime's own operators (domain com.microsoft, and two it adds to ONNX's domain), as its
graph optimizers write them into a saved model: a session's `optimized_model_filepath`, the
transformer optimizer (`onnxruntime.transformers.optimizer`, what Hugging Face optimum's O1-O4
run). Each is split into the primitives of the ONNX operators it fused (activations, a convolution
or matmul with its activation, skip-and-layer normalization, BERT's embedding layer, multi-head
attention), so such a model fuses as its original would. The semantics are ONNX Runtime's CPU
kernels (1.32), which tests/test_fission_contrib.py runs as the oracle."""

from __future__ import annotations

import numpy as np

from korch.errors import KorchError
from korch.frontend.lowering import Lowering, OnnxNode, fission
from korch.frontend.onnx.rules_attention import (
    allowed_bias,
    attend,
    band_bias,
    linear_attention,
    merge_heads,
    repeat_heads,
    rotary,
    split_heads,
)
from korch.frontend.onnx.rules_elementwise import clip_core, gelu_core, softplus_core
from korch.frontend.onnx.rules_layout import gather_elements_core
from korch.frontend.onnx.rules_linear import causal_conv_with_state, conv, gemm, matmul
from korch.frontend.onnx.rules_quant import blockwise, rounded_per_block, unpacked
from korch.frontend.onnx.rules_recurrent import activation
from korch.frontend.onnx.rules_reduce import layer_norm, normalize, rms_core, rms_norm, softmax
from korch.ir.prims import FLOAT_DTYPES, HALF_DTYPES, Prim

MS = "com.microsoft"

# ----------------------------------------------------------------- activations


@fission("Gelu", 1, domain=MS)
def gelu(ctx: Lowering, n: OnnxNode) -> list[str]:
    return [gelu_core(ctx, n.inputs[0], "none")]


@fission("BiasGelu", 1, domain=MS)
def bias_gelu(ctx: Lowering, n: OnnxNode) -> list[str]:
    return [gelu_core(ctx, ctx.elementwise(Prim.ADD, n.inputs[0], n.inputs[1]), "none")]


@fission("FastGelu", 1, domain=MS)
def fast_gelu(ctx: Lowering, n: OnnxNode) -> list[str]:
    """Gelu's tanh approximation, of x + bias when a bias is given."""
    x, bias = n.inputs[0], n.input(1)
    if bias is not None:
        x = ctx.elementwise(Prim.ADD, x, bias)
    return [gelu_core(ctx, x, "tanh")]


@fission("QuickGelu", 1, domain=MS)
def quick_gelu(ctx: Lowering, n: OnnxNode) -> list[str]:
    """x * sigmoid(alpha * x)."""
    x = n.inputs[0]
    scaled = ctx.elementwise(Prim.MUL, x, ctx.scalar(n.attr("alpha", 1.702), ctx.dtype(x)))
    return [ctx.elementwise(Prim.MUL, x, ctx.unary(Prim.SIGMOID, scaled))]


# ---------------------------------------------- linear operators with an activation

# FusedGemm's activations and the parameters each reads (activation_alpha, _beta, _gamma); ONNX
# Runtime requires every one of them
_GEMM_PARAMS = {
    "Relu": (),
    "Tanh": (),
    "Sigmoid": (),
    "Softsign": (),
    "Softplus": (),
    "LeakyRelu": ("alpha",),
    "ThresholdedRelu": ("alpha",),
    "Elu": ("alpha",),
    "HardSigmoid": ("alpha", "beta"),
    "ScaledTanh": ("alpha", "beta"),
    "ParametricSoftplus": ("alpha", "beta"),
    "Selu": ("alpha", "gamma"),
}


@fission("FusedGemm", 1, domain=MS)
def fused_gemm(ctx: Lowering, n: OnnxNode) -> list[str]:
    """Gemm, then an activation (its parameters in activation_alpha, _beta, _gamma)."""
    (y,) = gemm(ctx, n)
    name = n.attr("activation", "")
    given = {p: n.attr(f"activation_{p}", None) for p in ("alpha", "beta", "gamma")}
    if not name:
        return [y]
    if name not in _GEMM_PARAMS:
        ctx.unsupported(f"FusedGemm activation {name!r}")
    params = [given[p] for p in _GEMM_PARAMS[name]]
    if None in params:
        raise KorchError(f"FusedGemm activation {name} needs activation_{'/'.join(_GEMM_PARAMS[name])}")
    return [activation(name, *params)(ctx, y)]


@fission("FusedConv", 1, domain=MS)
def fused_conv(ctx: Lowering, n: OnnxNode) -> list[str]:
    """Conv (+ bias), plus Z when given, then one of MLAS's activations (activation_params: alpha
    for LeakyRelu, min and max for Clip, alpha and beta for HardSigmoid)."""
    x, w, bias, z = n.inputs[0], n.inputs[1], n.input(2), n.input(3)
    (y,) = conv(ctx, OnnxNode("Conv", n.name, n.opset, [x, w, bias], 1, n.attrs))
    if z is not None:
        y = ctx.elementwise(Prim.ADD, y, z)
    name, params = n.attr("activation", ""), list(n.attr("activation_params", None) or [])
    wanted = {"": 0, "Relu": 0, "Tanh": 0, "Sigmoid": 0, "LeakyRelu": 1, "Clip": 2, "HardSigmoid": 2}
    if name not in wanted:
        ctx.unsupported(f"FusedConv activation {name!r}")
    if len(params) != wanted[name]:
        raise KorchError(f"FusedConv activation {name} takes {wanted[name]} activation_params, not {params}")
    if name == "Clip":
        low, high = (ctx.scalar(p, ctx.dtype(y)) for p in params)
        return [clip_core(ctx, y, low, high)]
    return [activation(name, *params)(ctx, y) if name else y]


@fission("FusedMatMul", 1, domain=MS)
def fused_matmul(ctx: Lowering, n: OnnxNode) -> list[str]:
    """alpha * (A' @ B'), each operand transposed as asked: transBatch moves its first axis to
    just before the last (a stored [M, batch..., K] is [batch..., M, K]), then trans swaps the
    last two."""
    a, b = n.inputs[0], n.inputs[1]
    batched = n.attr("transBatchA", 0) or n.attr("transBatchB", 0)
    if batched and not (ctx.rank(a) == ctx.rank(b) >= 3):
        ranks = (ctx.rank(a), ctx.rank(b))
        raise KorchError(f"FusedMatMul transBatch needs two inputs of one rank >= 3, not ranks {ranks}")
    operands = []
    for v, side in ((a, "A"), (b, "B")):
        trans, trans_batch = n.attr(f"trans{side}", 0), n.attr(f"transBatch{side}", 0)
        rank = ctx.rank(v)
        if (trans or trans_batch) and rank < 2:
            raise KorchError(f"FusedMatMul cannot transpose a {rank}-D operand")
        if trans_batch:
            v = ctx.transpose(v, [*range(1, rank - 1), 0, rank - 1])
        if trans:
            v = ctx.transpose(v, [*range(rank - 2), rank - 1, rank - 2])
        operands.append(v)
    y = matmul(ctx, *operands)
    alpha = n.attr("alpha", 1.0)
    return [y if alpha == 1.0 else ctx.elementwise(Prim.MUL, y, ctx.scalar(alpha, ctx.dtype(y)))]


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


# ----------------------------------------------------------------- normalization


def _skip_sum(ctx: Lowering, n: OnnxNode, bias: str | None) -> str:
    """input + skip (+ bias): skip as input's shape, or its last two axes ([1, S, H] or [S, H])."""
    x, skip = n.inputs[0], n.inputs[1]
    shape, skip_shape = ctx.shape(x), ctx.shape(skip)
    if ctx.rank(x) not in (2, 3):
        raise KorchError(f"{n.op_type} input must be 2-D or 3-D, not {list(shape)}")
    if skip_shape != shape and not (len(shape) == 3 and skip_shape in ((1, *shape[1:]), shape[1:])):
        raise KorchError(f"{n.op_type} skip {list(skip_shape)} does not fit input {list(shape)}")
    total = ctx.elementwise(Prim.ADD, x, skip)
    return total if bias is None else ctx.elementwise(Prim.ADD, total, bias)


@fission("SkipLayerNormalization", 1, domain=MS)
def skip_layer_norm(ctx: Lowering, n: OnnxNode) -> list[str]:
    """LayerNorm(input + skip + bias) over the last axis, in float32 for half types; outputs the
    normalized value, the mean and 1/std (keeping the axis), and the sum."""
    gamma, beta = n.inputs[2], n.input(3)
    total = _skip_sum(ctx, n, n.input(4))
    dtype = ctx.dtype(total)
    wide = "float32" if dtype in HALF_DTYPES else dtype
    y, mean, inv_std = normalize(ctx, ctx.cast(total, wide), [ctx.rank(total) - 1], n.attr("epsilon", 1e-12))
    y = ctx.elementwise(Prim.MUL, ctx.cast(y, dtype), gamma)
    if beta is not None:
        y = ctx.elementwise(Prim.ADD, y, beta)
    return [y, mean, inv_std, total]


@fission("SkipSimplifiedLayerNormalization", 1, domain=MS)
def skip_simplified_layer_norm(ctx: Lowering, n: OnnxNode) -> list[str | None]:
    """RMSNorm(input + skip + bias) over the last axis; outputs as SkipLayerNormalization's but
    the mean, which ONNX Runtime leaves unwritten (refused when the model names it)."""
    total = _skip_sum(ctx, n, n.input(3))
    y, inv_rms = rms_core(ctx, total, n.inputs[2], ctx.rank(total) - 1, n.attr("epsilon", 1e-12))
    if n.wants(1):
        ctx.unsupported("SkipSimplifiedLayerNormalization's mean output (ONNX Runtime leaves it unwritten)")
    return [y, None, inv_rms, total]


# ONNX Runtime's LayerNormalization in ONNX's domain before opset 17 (the same operator), and its
# SimplifiedLayerNormalization there (RMSNormalization before opset 23; its second output 1/rms)
fission("LayerNormalization", 1)(layer_norm)
fission("SimplifiedLayerNormalization", 1)(rms_norm)


# ------------------------------------------------------------ BERT's embedding layer


@fission("EmbedLayerNormalization", 1, domain=MS)
def embed_layer_norm(ctx: Lowering, n: OnnxNode) -> list[str]:
    """LayerNorm(word[ids] + position[positions] + segment[segment ids]); the mask index is the
    number of ones in each row of the mask (zeros without one); the sum before the norm."""
    ids, segment_ids, words, positions, segments = n.inputs[:5]
    gamma, beta, mask, position_ids = n.inputs[5], n.inputs[6], n.input(7), n.input(8)
    n.attr("mask_index_type", 1)  # (says only whether output 1 exists)
    if ctx.rank(ids) != 2:
        raise KorchError(f"EmbedLayerNormalization input_ids {list(ctx.shape(ids))} is not [batch, seq]")
    batch, seq = ctx.shape(ids)
    if (segment_ids is None) != (segments is None):
        raise KorchError("EmbedLayerNormalization needs segment_ids and segment_embedding together")
    total = ctx.emit(Prim.GATHER, words, ids, axis=0)
    if position_ids is None:
        if ctx.shape(positions)[0] < seq:
            raise KorchError(f"{seq} tokens but {ctx.shape(positions)[0]} position embeddings")
        position_ids = ctx.const(np.arange(seq, dtype="int64").reshape(1, seq))
    total = ctx.elementwise(Prim.ADD, total, ctx.emit(Prim.GATHER, positions, position_ids, axis=0))
    if segments is not None:
        total = ctx.elementwise(Prim.ADD, total, ctx.emit(Prim.GATHER, segments, segment_ids, axis=0))
    y, _, _ = normalize(ctx, total, [2], n.attr("epsilon", 1e-12))
    y = ctx.elementwise(Prim.ADD, ctx.elementwise(Prim.MUL, y, gamma), beta)
    if mask is None:
        mask_index = ctx.const(np.zeros(batch, "int32"))
    else:
        ones = ctx.elementwise(Prim.EQ, mask, ctx.scalar(1, ctx.dtype(mask)))
        mask_index = ctx.reduce(Prim.REDUCE_SUM, ctx.cast(ones, "int32"), [1], keepdims=False)
    return [y, mask_index, total]


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
    q, k, v, past_k, past_v, seqlens, total, cos, sin = (n.input(i) for i in range(9))
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
    # per batch entry, [batch, 1, 1, 1]: tokens after this step, and where the new ones start
    lengths = ctx.elementwise(
        Prim.ADD, ctx.reshape(ctx.cast(seqlens, "int64"), (batch, 1, 1, 1)), ctx.scalar(1, "int64")
    )
    start = ctx.elementwise(
        Prim.MAX, ctx.elementwise(Prim.SUB, lengths, ctx.scalar(seq, "int64")), ctx.scalar(0, "int64")
    )
    interleaved = n.attr("rotary_interleaved", 0)
    if n.attr("do_rotary", 0):
        if cos is None:
            raise KorchError("GroupQueryAttention with do_rotary needs cos_cache and sin_cache")
        steps = ctx.const(np.arange(seq, dtype="int64").reshape(1, seq))
        positions = ctx.elementwise(Prim.ADD, ctx.reshape(start, (batch, 1)), steps)
        positions = _clamp(ctx, positions, ctx.shape(cos)[0] - 1)  # (garbage in, no crash)
        cos, sin = (ctx.emit(Prim.GATHER, c, positions, axis=0) for c in (cos, sin))
        dim = 2 * ctx.shape(cos)[-1]
        q, k = (
            rotary(ctx, q, cos, sin, heads, dim, interleaved),
            rotary(ctx, k, cos, sin, kv_heads, dim, interleaved),
        )
    news, pasts = [split_heads(ctx, k, kv_heads), split_heads(ctx, v, kv_heads)], [past_k, past_v]
    window, attention_bias = n.attr("local_window_size", -1), n.input(10)
    if n.attr("sliding_window_cache", 0):
        if attention_bias is not None:
            ctx.unsupported("GroupQueryAttention with sliding_window_cache and attention_bias")
        held, present, bias = _sliding_cache(ctx, news, pasts, lengths, window, dtype)
    else:  # (a window-sized cache's rows are its past's: total_sequence_length is read only here)
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


# ------------------------------------------------------------------ mixtures of experts


@fission("MoE", 1, domain=MS)
def ms_moe(ctx: Lowering, n: OnnxNode) -> list[str]:
    """A mixture of experts (as the model builder writes gpt-oss, Phi-3.5-MoE): per token the k
    experts with the largest router_probs (the higher index first among equals), weighted by the
    softmax over all experts (or, with normalize_routing_weights, over the k chosen), each expert
    fc2(activation(fc1(x) + b1)) + b2, its weights [experts, out, in]. Computed densely: every
    expert on every token, the unchosen weighted by 0 (one batched matmul per layer, which fuses;
    ONNX Runtime's own kernel, which gathers each expert's tokens, stays a candidate as the source
    model). Activations as ONNX Runtime's CPU kernel: relu, gelu (tanh approximation), silu,
    identity, and swiglu on interleaved gate/linear columns (swiglu_fusion 1)."""
    x, router, w1, b1, w2, b2 = (n.input(i) for i in range(6))
    if n.input(6) is not None or n.input(7) is not None or n.attr("use_sparse_mixer", 0):
        ctx.unsupported("MoE with fc3 weights or the sparse mixer (ONNX Runtime's CPU kernel runs neither)")
    k = n.attr("k", 1)
    _check_rows(ctx, n, x, router, k)
    chosen = _chosen(ctx, router, k)
    if n.attr("normalize_routing_weights", 0):
        hidden = ctx.elementwise(Prim.WHERE, chosen, router, ctx.scalar(-np.inf, ctx.dtype(router)))
        weights = softmax(ctx, hidden, 1, log=False)
    else:
        weights = softmax(ctx, router, 1, log=False)
        weights = ctx.elementwise(Prim.WHERE, chosen, weights, ctx.scalar(0, ctx.dtype(router)))
    return [_experts(ctx, n, x, weights, w1, b1, w2, b2)]


@fission("QMoE", 1, domain=MS)
def ms_qmoe(ctx: Lowering, n: OnnxNode) -> list[str]:
    """MoE with 2-, 4- or 8-bit expert weights (quant_type int; the model builder's int4 CPU
    build of Qwen3-MoE, LFM2-MoE, gpt-oss), as ONNX Runtime's CPU kernel computes it: fc1 and fc2
    [experts, out, in * bits / 8] uint8 as MatMulNBits packs a weight, scaled per output row
    (fc*_scales [experts, out]) or per block of block_size along `in` ([experts, out, blocks]),
    zero points packed likewise (per row: along `out`) or 2^(bits-1). Routing: the k largest
    router_probs (the higher index first among equals), weighted by the softmax over those k
    whatever normalize_routing_weights says (the CPU kernel's own rule); or, given router_weights,
    by those at the k chosen, divided by their sum with normalize_routing_weights; a weight of at
    most 1e-8 drops its expert. Blocked 8-bit weights, and blocked 4-bit ones at accuracy_level
    4, multiply activations rounded to 8 bits per block, as MatMulNBits. Computed in float32 (a
    float16 model's values are widened, as ONNX Runtime does), densely as MoE; the packed weights
    stay packed (ctx.keep_packed). Not lowered: fc3 (ONNX Runtime's CPU kernel refuses it),
    fp4/fp8 weights, prepacked layouts, the sparse mixer."""
    x, router, w1, s1, b1, w2, s2, b2 = (n.input(i) for i in range(8))
    if any(n.input(i) is not None for i in (8, 9, 10, 13)) or any(
        n.input(i) is not None for i in range(15, len(n.inputs))
    ):
        ctx.unsupported("QMoE with fc3, global or activation scales")
    kind = n.attr("quant_type", "int")
    if kind != "int" or n.attr("weights_prepacked", -1) == 1 or n.attr("use_sparse_mixer", 0):
        ctx.unsupported(f"QMoE quant_type {kind}, prepacked weights or the sparse mixer")
    if s1 is None or s2 is None:
        raise KorchError("QMoE of integer weights needs fc1_scales and fc2_scales")
    k, block = n.attr("k", 1), n.attr("block_size", 0) or 0
    normalize, accuracy = n.attr("normalize_routing_weights", 0), n.attr("accuracy_level", 0)
    bits = n.attr("expert_weight_bits", 4)
    widths = {bits} | {n.attr(f"fc{i}_expert_weight_bits", None) or bits for i in (1, 2)}
    if len(widths) > 1:
        ctx.unsupported(f"QMoE of mixed widths {sorted(widths)} (ONNX Runtime's CPU kernel runs none)")
    if bits not in (2, 4, 8) or block and (block < 16 or block & (block - 1)):
        ctx.unsupported(f"QMoE of {bits} bits in blocks of {block}")
    _check_rows(ctx, n, x, router, k)
    rows, dtype = ctx.widened(x)
    hidden = ctx.shape(x)[-1]
    experts = ctx.shape(router)[1]
    q1, q2 = (
        _expert_weights(ctx, w, s, n.input(11 + i), bits, block, inner)
        for i, (w, s, inner) in enumerate(((w1, s1, hidden), (w2, s2, ctx.shape(w1)[1] // _fused(n))))
    )
    if ctx.shape(q2)[1] != hidden or ctx.shape(q1)[0] != experts:
        raise KorchError(
            f"QMoE weights {list(ctx.shape(w1))} and {list(ctx.shape(w2))} do not fit {hidden} wide"
        )
    probs = ctx.cast(router, "float32")
    chosen = _chosen(ctx, probs, k)
    given = n.input(14)
    if given is None:
        weights = softmax(
            ctx, ctx.elementwise(Prim.WHERE, chosen, probs, ctx.scalar(-np.inf, "float32")), 1, log=False
        )
    else:
        weights = ctx.elementwise(Prim.WHERE, chosen, ctx.cast(given, "float32"), ctx.scalar(0, "float32"))
        if normalize:
            total = ctx.reduce(Prim.REDUCE_SUM, weights, [1])
            zero = ctx.elementwise(Prim.EQ, total, ctx.scalar(0, "float32"))
            inverse = ctx.elementwise(Prim.DIV, ctx.scalar(1, "float32"), total)
            inverse = ctx.elementwise(Prim.WHERE, zero, ctx.scalar(0, "float32"), inverse)
            weights = ctx.elementwise(Prim.MUL, weights, inverse)
    kept = ctx.elementwise(Prim.GT, weights, ctx.scalar(1e-8, "float32"))
    weights = ctx.elementwise(Prim.WHERE, kept, weights, ctx.scalar(0, "float32"))
    # ONNX Runtime's int8 kernels: blocked 8-bit weights always, 4-bit ones at accuracy_level 4
    rounded = block if block and (bits == 8 or bits == 4 and accuracy == 4) else 0
    biases = [None if b is None else ctx.cast(b, "float32") for b in (b1, b2)]
    y = _experts(ctx, n, rows, weights, q1, biases[0], q2, biases[1], rounded)
    return [ctx.cast(y, dtype)]


def _fused(n: OnnxNode) -> int:
    """How many of fc1's rows each inner column has: 2 for swiglu's gate and linear, else 1."""
    return 2 if n.attr("activation_type", "relu") == "swiglu" else 1


def _expert_weights(
    ctx: Lowering, w: str, scales: str, zeros: str | None, bits: int, block: int, k: int
) -> str:
    """QMoE's fc weight [experts, out, k] in float32 from its packed uint8 [experts, out, k * bits /
    8], scales [experts, out] or [experts, out, k / block], packed zero points or none."""
    experts, out, cols = ctx.shape(w)
    blocks = k // block if block else 1
    if cols * 8 // bits != k or (block and k % block) or ctx.type(scales).numel != experts * out * blocks:
        raise KorchError(
            f"QMoE weight uint8{list(ctx.shape(w))} and scales {list(ctx.shape(scales))} do not fit "
            f"{k} inputs of {bits} bits in blocks of {block or k}"
        )
    q = unpacked(ctx, ctx.reshape(ctx.keep_packed(w), (experts * out, cols)), bits)
    scales = ctx.cast(ctx.reshape(scales, (experts * out, blocks)), "float32")
    if zeros is not None and not block:  # per row: packed along `out`
        zeros = ctx.slice_axis(
            unpacked(ctx, ctx.reshape(zeros, (experts, ctx.type(zeros).numel // experts)), bits), 1, 0, out
        )
        zeros = ctx.reshape(zeros, (experts * out, 1))
    elif zeros is not None:
        zeros = ctx.reshape(zeros, (experts * out, ctx.type(zeros).numel // (experts * out)))
    return ctx.reshape(blockwise(ctx, q, scales, zeros, bits, block or k), (experts, out, k))


def _check_rows(ctx: Lowering, n: OnnxNode, x: str, router: str, k: int) -> None:
    tokens, experts = ctx.shape(router)
    if (
        ctx.dtype(x) not in FLOAT_DTYPES
        or ctx.type(x).numel != tokens * ctx.shape(x)[-1]
        or not 1 <= k <= experts
    ):
        raise KorchError(
            f"{n.op_type} input {list(ctx.shape(x))} and router_probs {[tokens, experts]} (k {k}) do not fit"
        )


def _experts(
    ctx: Lowering, n: OnnxNode, x: str, weights: str, w1: str, b1, w2: str, b2, rounded: int = 0
) -> str:
    """sum over experts of weights[token, e] * (fc2(activation(fc1(x) + b1)) + b2), weights
    [experts, out, in], every expert on every token; with `rounded`, each matmul's activations
    rounded to 8 bits per block of that many inputs."""
    kind, fusion = n.attr("activation_type", "relu"), n.attr("swiglu_fusion", 0)
    if kind not in ("relu", "gelu", "silu", "identity", "swiglu") or (kind == "swiglu") != (fusion == 1):
        ctx.unsupported(f"{n.op_type} activation {kind} with swiglu_fusion {fusion}")
    if n.attr("swiglu_limit_after_activation", 0):
        ctx.unsupported("swiglu_limit_after_activation (CUDA only)")
    shape, experts, tokens = ctx.shape(x), ctx.shape(w1)[0], ctx.shape(weights)[0]
    hidden = shape[-1]
    rows = ctx.reshape(x, (1, tokens, hidden))
    if rounded:
        rows = rounded_per_block(ctx, rows, rounded)
    h = matmul(ctx, rows, ctx.transpose(w1, (0, 2, 1)))  # [experts, tokens, width]
    if b1 is not None:
        h = ctx.elementwise(Prim.ADD, h, ctx.reshape(b1, (experts, 1, ctx.shape(b1)[-1])))
    limit = n.attr("swiglu_limit", None)
    h = _expert_activation(
        ctx, h, kind, n.attr("activation_alpha", 1.0), n.attr("activation_beta", 0.0), limit
    )
    if rounded:
        h = rounded_per_block(ctx, h, rounded)
    y = matmul(ctx, h, ctx.transpose(w2, (0, 2, 1)))  # [experts, tokens, hidden]
    if b2 is not None:
        y = ctx.elementwise(Prim.ADD, y, ctx.reshape(b2, (experts, 1, hidden)))
    mixed = ctx.elementwise(Prim.MUL, y, ctx.reshape(ctx.transpose(weights, (1, 0)), (experts, tokens, 1)))
    return ctx.reshape(ctx.reduce(Prim.REDUCE_SUM, mixed, [0], keepdims=False), shape)


def _chosen(ctx: Lowering, router: str, k: int) -> str:
    """[tokens, experts] bool: each token's k largest scores (an expert is chosen when fewer than
    k others score higher, or as high at a higher index: ONNX Runtime's order among equals)."""
    tokens, experts = ctx.shape(router)
    other = ctx.reshape(router, (tokens, 1, experts))
    this = ctx.reshape(router, (tokens, experts, 1))
    later = ctx.const(np.triu(np.ones((experts, experts), bool), 1))  # [e, e']: e' > e
    ahead = ctx.elementwise(
        Prim.OR,
        ctx.elementwise(Prim.GT, other, this),
        ctx.elementwise(Prim.AND, ctx.elementwise(Prim.EQ, other, this), later),
    )
    rank = ctx.reduce(Prim.REDUCE_SUM, ctx.cast(ahead, "int64"), [2], keepdims=False)
    return ctx.elementwise(Prim.LT, rank, ctx.scalar(k, "int64"))


def _expert_activation(ctx: Lowering, h: str, kind: str, alpha: float, beta: float, limit) -> str:
    """MoE's activation_type on fc1's output [experts, tokens, width]."""
    dtype = ctx.dtype(h)
    if kind == "relu":
        return ctx.elementwise(Prim.MAX, h, ctx.scalar(0, dtype))
    if kind == "gelu":
        return gelu_core(ctx, h, "tanh")
    if kind == "silu":
        return ctx.elementwise(Prim.MUL, h, ctx.unary(Prim.SIGMOID, h))
    if kind == "identity":
        return h
    width = ctx.shape(h)[-1] // 2  # swiglu: gate and linear columns interleaved
    gate, linear = ctx.slice_axis(h, 2, 0, width, 2), ctx.slice_axis(h, 2, 1, width, 2)
    if limit is not None:
        gate = clip_core(ctx, gate, None, ctx.scalar(limit, dtype))
        linear = clip_core(ctx, linear, ctx.scalar(-limit, dtype), ctx.scalar(limit, dtype))
    swish = ctx.elementwise(
        Prim.MUL, gate, ctx.unary(Prim.SIGMOID, ctx.elementwise(Prim.MUL, gate, ctx.scalar(alpha, dtype)))
    )
    return ctx.elementwise(Prim.MUL, swish, ctx.elementwise(Prim.ADD, linear, ctx.scalar(beta, dtype)))
