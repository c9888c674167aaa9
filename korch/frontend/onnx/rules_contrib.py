"""ONNX Runtime's own operators (domain com.microsoft, and two it adds to ONNX's domain), as its
graph optimizers write them into a saved model: a session's `optimized_model_filepath`, the
transformer optimizer (`onnxruntime.transformers.optimizer`, what Hugging Face optimum's O1-O4
run). Each is split into the primitives of the ONNX operators it fused (activations, a convolution
or matmul with its activation, skip-and-layer normalization, BERT's embedding layer, mixtures of
experts; the attention operators: rules_contrib_attention), so such a model fuses as its original
would. The semantics are ONNX Runtime's CPU
kernels (1.32), which tests/frontend/test_fission_contrib.py runs as the oracle."""

from __future__ import annotations

import numpy as np

from korch.errors import KorchError
from korch.frontend.lowering import Lowering, OnnxNode, fission
from korch.frontend.onnx.rules_linear import conv, gemm
from korch.frontend.onnx.rules_quant import blockwise, rounded_per_block, unpacked
from korch.frontend.onnx.rules_recurrent import activation
from korch.frontend.onnx.rules_reduce import layer_norm, rms_core, rms_norm
from korch.frontend.ops.elementwise import clip_core, gelu_core
from korch.frontend.ops.linear import matmul
from korch.frontend.ops.reduce import normalize, softmax
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
