"""Fission rules for ONNX Runtime's own operators (com.microsoft, and the two it adds to ONNX's
domain), checked against ONNX Runtime's CPU kernels; and whole models as ONNX Runtime's optimizers
save them (every operator lowered, outputs as ONNX Runtime's)."""

import numpy as np
import onnxruntime as ort
import pytest
from helpers import (
    Const,
    check_contrib_op,
    check_model,
    check_op,
    linear_attention_case,
    one_node_model,
    onnx_model,
    rand,
)

import korch
from korch.ir import reference
from korch.measure import check

MS = "com.microsoft"


# ----------------------------------------------------------------- activations


def test_gelu_bias_gelu_fast_gelu_quick_gelu():
    x, bias = rand(2, 5, 16) * 3, rand(16, seed=1)
    check_contrib_op("Gelu", [x])
    check_contrib_op("BiasGelu", [x, Const(bias)])
    check_contrib_op("FastGelu", [x])
    check_contrib_op("FastGelu", [x, Const(bias)])
    check_contrib_op("QuickGelu", [x])
    check_contrib_op("QuickGelu", [x], {"alpha": 1.3})


# ------------------------------------------------- linear operators with an activation

GEMM_ACTIVATIONS = {
    "Relu": {},
    "Tanh": {},
    "Sigmoid": {},
    "Softsign": {},
    "Softplus": {},
    "LeakyRelu": {"activation_alpha": 0.3},
    "ThresholdedRelu": {"activation_alpha": 0.4},
    "Elu": {"activation_alpha": 0.7},
    "HardSigmoid": {"activation_alpha": 0.3, "activation_beta": 0.4},
    "ScaledTanh": {"activation_alpha": 0.8, "activation_beta": 0.6},
    "ParametricSoftplus": {"activation_alpha": 0.8, "activation_beta": 0.6},
    "Selu": {"activation_alpha": 1.3, "activation_gamma": 0.9},
}


@pytest.mark.parametrize("name", sorted(GEMM_ACTIVATIONS))
def test_fused_gemm(name):
    a, b, c = rand(6, 4) * 2, rand(5, 4, seed=1), rand(5, seed=2)
    attrs = {"activation": name, "transB": 1, "alpha": 0.9, "beta": 1.1, **GEMM_ACTIVATIONS[name]}
    check_contrib_op("FusedGemm", [a, Const(b), Const(c)], attrs)


def test_fused_gemm_without_its_activation_parameter_is_refused():
    with pytest.raises(korch.KorchError, match="needs activation_alpha"):
        check_contrib_op("FusedGemm", [rand(3, 4), Const(rand(4, 5))], {"activation": "LeakyRelu"})


@pytest.mark.parametrize(
    "name,params",
    [("", []), ("Relu", []), ("Tanh", []), ("Sigmoid", []), ("LeakyRelu", [0.2]), ("Clip", [-0.5, 0.7]),
     ("HardSigmoid", [0.3, 0.4])],
)  # fmt: skip
@pytest.mark.parametrize("with_sum", [False, True])
def test_fused_conv(name, params, with_sum):
    x, w, b = rand(2, 4, 9, 9), rand(6, 2, 3, 3, seed=1), rand(6, seed=2)
    attrs = {"strides": [2, 1], "pads": [1, 0, 1, 2], "group": 2}
    if name:
        attrs["activation"] = name
    if params:
        attrs["activation_params"] = params
    z = [rand(2, 6, 5, 9, seed=3)] if with_sum else []
    check_contrib_op("FusedConv", [x, Const(w), Const(b), *z], attrs)


@pytest.mark.parametrize(
    "a_layout,b_layout,attrs",
    [
        ((2, 3, 4, 5), (2, 3, 5, 6), {}),
        ((2, 3, 5, 4), (2, 3, 6, 5), {"transA": 1, "transB": 1, "alpha": 0.5}),
        ((4, 2, 3, 5), (2, 3, 5, 6), {"transBatchA": 1}),  # [M, batch..., K]
        ((5, 2, 3, 4), (2, 3, 5, 6), {"transBatchA": 1, "transA": 1}),  # [K, batch..., M]
        ((2, 3, 4, 5), (5, 2, 3, 6), {"transBatchB": 1}),
        ((2, 3, 4, 5), (6, 2, 3, 5), {"transBatchB": 1, "transB": 1, "alpha": 2.0}),
        ((3, 4, 5), (5, 6), {"alpha": 0.125}),  # broadcast batch
    ],
)
def test_fused_matmul(a_layout, b_layout, attrs):
    check_contrib_op("FusedMatMul", [rand(*a_layout), rand(*b_layout, seed=1)], attrs)


def test_fused_matmul_trans_batch_needs_equal_ranks():
    with pytest.raises(korch.KorchError, match="one rank >= 3"):
        check_contrib_op("FusedMatMul", [rand(4, 3, 5), rand(5, 6, seed=1)], {"transBatchA": 1})


# ----------------------------------------------------------------- normalization


def test_skip_layer_norm_with_every_output():
    x, skip = rand(2, 5, 16), rand(2, 5, 16, seed=1)
    gamma, beta, bias = rand(16, seed=2), rand(16, seed=3), rand(16, seed=4)
    check_contrib_op(
        "SkipLayerNormalization",
        [x, skip, Const(gamma), Const(beta), Const(bias)],
        {"epsilon": 1e-5},
        n_outputs=4,
    )


@pytest.mark.parametrize(
    "x_shape,skip_shape", [((2, 5, 16), (5, 16)), ((2, 5, 16), (1, 5, 16)), ((10, 16), (10, 16))]
)
def test_skip_layer_norm_broadcast_skip_no_beta(x_shape, skip_shape):
    check_contrib_op(
        "SkipLayerNormalization", [rand(*x_shape), rand(*skip_shape, seed=1), Const(rand(16, seed=2))]
    )


def test_skip_layer_norm_refuses_a_skip_that_does_not_fit():
    with pytest.raises(korch.KorchError, match="does not fit"):
        check_contrib_op(
            "SkipLayerNormalization", [rand(2, 5, 16), rand(16, seed=1), Const(rand(16, seed=2))]
        )


def test_skip_simplified_layer_norm_outputs():
    x, skip, gamma, bias = rand(2, 5, 16), rand(2, 5, 16, seed=1), rand(16, seed=2), rand(16, seed=3)
    inputs = [x, skip, Const(gamma), Const(bias)]
    check_contrib_op("SkipSimplifiedLayerNormalization", inputs, {"epsilon": 1e-5})
    check_contrib_op(
        "SkipSimplifiedLayerNormalization", inputs, n_outputs=4, outputs=[True, False, True, True]
    )


def test_skip_simplified_layer_norm_mean_is_refused():
    """ONNX Runtime leaves the mean output unwritten: korch keeps the node whole."""
    x, skip, gamma = rand(2, 5, 16), rand(2, 5, 16, seed=1), rand(16, seed=2)
    model, _ = one_node_model(
        "SkipSimplifiedLayerNormalization", [x, skip, Const(gamma)], n_outputs=2, domain=MS
    )
    result = korch.fission(model)
    assert [op for op, _ in result.opaque] == ["SkipSimplifiedLayerNormalization"]
    assert "mean output" in result.opaque[0][1]


@pytest.mark.parametrize("axis,scale_shape", [(-1, (16,)), (1, (5, 16))])
def test_simplified_layer_norm_in_onnx_domain(axis, scale_shape):
    model, feeds = one_node_model(
        "SimplifiedLayerNormalization",
        [rand(2, 5, 16), Const(rand(*scale_shape, seed=1))],
        {"axis": axis, "epsilon": 1e-5},
        opset=13,
        n_outputs=2,
    )
    model.graph.output[1].type.tensor_type.ClearField("shape")
    check_model(model, feeds)


def test_layer_norm_before_opset_17_as_onnx_runtime_reads_it():
    inputs = [rand(2, 5, 16), Const(rand(16, seed=1)), Const(rand(16, seed=2))]
    model, feeds = one_node_model("LayerNormalization", inputs, {"epsilon": 1e-5}, opset=13, n_outputs=3)
    check_model(model, feeds)


# ------------------------------------------------------------ BERT's embedding layer


def _embed_inputs(batch=2, seq=5, hidden=16, vocab=11, segment=True, mask=None, position_ids=None):
    rng = np.random.default_rng(0)
    ids = rng.integers(0, vocab, (batch, seq)).astype("int32")
    inputs = [
        ids,
        rng.integers(0, 2, (batch, seq)).astype("int32") if segment else None,
        Const(rand(vocab, hidden)),
        Const(rand(16, hidden, seed=1)),
        Const(rand(2, hidden, seed=2)) if segment else None,
        Const(rand(hidden, seed=3)),
        Const(rand(hidden, seed=4)),
        mask,
        position_ids,
    ]
    while inputs[-1] is None:
        inputs.pop()
    return inputs


def test_embed_layer_norm_counts_the_ones_in_the_mask():
    mask = np.array([[1, 1, 0, 1, 0], [2, 1, 0, -1, 1]], "int32")  # (2 and -1 are not ones)
    check_contrib_op(
        "EmbedLayerNormalization",
        _embed_inputs(mask=mask),
        {"epsilon": 1e-5},
        n_outputs=3,
        out_dtypes=["float32", "int32", "float32"],
    )


@pytest.mark.parametrize(
    "position_ids", [np.array([[3, 1, 0, 2, 4]]), np.array([[3, 1, 0, 2, 4], [4, 3, 2, 1, 0]])]
)
def test_embed_layer_norm_positions_no_segments_no_mask(position_ids):
    inputs = _embed_inputs(segment=False, position_ids=position_ids.astype("int32"))
    check_contrib_op("EmbedLayerNormalization", inputs, n_outputs=2, out_dtypes=["float32", "int32"])


# ------------------------------------------------------------------ attention

B, S, HIDDEN, HEADS = 2, 5, 16, 2


def attention(inputs, attrs=None, width=3 * HIDDEN):
    x, w, bias = rand(B, S, HIDDEN), rand(HIDDEN, width, seed=1), rand(width, seed=2)
    check_contrib_op("Attention", [x, Const(w), Const(bias), *inputs], {"num_heads": HEADS, **(attrs or {})})


@pytest.mark.parametrize(
    "mask",
    [
        np.array([3, 5]),  # lengths (right padding)
        np.array([4, 5, 1, 0]),  # ends, then starts (left padding)
        np.array([[1, 0, 1, 1, 0], [1, 1, 1, 1, 1]]),  # raw [batch, keys]
        np.random.default_rng(3).integers(0, 2, (B, S, S)),  # raw [batch, queries, keys]
    ],
    ids=["lengths", "ends-starts", "raw-2d", "raw-3d"],
)
def test_attention_masks(mask):
    attention([mask.astype("int32")])
    attention([mask.astype("int32")], {"unidirectional": 1, "mask_filter_value": -300.0})


def test_attention_attention_bias_scale_and_sizes():
    attention([None, None, rand(B, HEADS, S, S, seed=5)], {"scale": 0.3})
    attention([None, None, rand(1, 1, S, S, seed=6)])
    attention([], {"qkv_hidden_sizes": [HIDDEN, HIDDEN, 24]}, width=2 * HIDDEN + 24)
    x, w = rand(B, S, HIDDEN), rand(HIDDEN, 3 * HIDDEN, seed=1)
    check_contrib_op("Attention", [x, Const(w)], {"num_heads": HEADS, "unidirectional": 1})


@pytest.mark.parametrize("unidirectional", [0, 1])
def test_attention_after_a_past_state(unidirectional):
    x, w, bias = rand(B, S, HIDDEN), rand(HIDDEN, 3 * HIDDEN, seed=1), rand(3 * HIDDEN, seed=2)
    past = rand(2, B, HEADS, 3, HIDDEN // HEADS, seed=3)
    lengths = np.array([6, 8], "int32")  # (of past and new keys together)
    attrs = {"num_heads": HEADS, "unidirectional": unidirectional}
    check_contrib_op("Attention", [x, Const(w), Const(bias), lengths, past], attrs, n_outputs=2)


def mha(inputs, attrs=None, n_outputs=1, kv=S):
    q, k, v = rand(B, S, HIDDEN), rand(B, kv, HIDDEN, seed=1), rand(B, kv, HIDDEN, seed=2)
    check_contrib_op(
        "MultiHeadAttention", [q, k, v, *inputs], {"num_heads": HEADS, **(attrs or {})}, n_outputs
    )


def test_multi_head_attention():
    mha([Const(rand(3 * HIDDEN, seed=3))], kv=7)  # cross attention, with the projections' bias
    mha([None, np.array([4, 7], "int32")], kv=7)
    mha([None, np.array([[1, 1, 0, 1, 1, 0, 1], [1] * 7], "int32")], {"mask_filter_value": -300.0}, kv=7)
    mha([None, None, rand(B, HEADS, S, 7, seed=4)], {"scale": 0.4}, kv=7)
    mha([None, np.array([[1, 0, 1, 1, 0], [1] * 5], "int32")], {"unidirectional": 1})


@pytest.mark.parametrize("unidirectional", [0, 1])
def test_multi_head_attention_after_past_keys_and_values(unidirectional):
    size = HIDDEN // HEADS
    past = [rand(B, HEADS, 3, size, seed=5), rand(B, HEADS, 3, size, seed=6)]
    mha([None, None, None, *past], {"unidirectional": unidirectional}, n_outputs=3)


def test_multi_head_attention_with_split_keys_and_values():
    q, k, v = rand(B, S, HIDDEN), rand(B, HEADS, 7, HIDDEN // HEADS, seed=1), rand(B, HEADS, 7, 8, seed=2)
    check_contrib_op("MultiHeadAttention", [q, k, v], {"num_heads": HEADS})


def test_multi_head_attention_packed_is_refused_as_onnx_runtime_refuses_it():
    """ONNX Runtime's CPU kernel runs no packed QKV: korch keeps the node whole, which ONNX Runtime
    then cannot run either: a one-line error."""
    packed = rand(B, S, HEADS, 3, HIDDEN // HEADS)
    model, _ = one_node_model("MultiHeadAttention", [packed], {"num_heads": HEADS}, domain=MS)
    with pytest.raises(korch.KorchError, match="Packed QKV"):
        korch.fission(model)


@pytest.mark.parametrize("interleaved", [0, 1])
@pytest.mark.parametrize("dim", [0, 4])
def test_rotary_embedding(interleaved, dim):
    size, positions = HIDDEN // HEADS, 16
    width = (dim or size) // 2
    cos, sin = Const(rand(positions, width, seed=1)), Const(rand(positions, width, seed=2))
    attrs = {"interleaved": interleaved, "num_heads": HEADS, "rotary_embedding_dim": dim}
    ids = np.random.default_rng(3).integers(0, positions, (B, S))
    check_contrib_op("RotaryEmbedding", [rand(B, S, HIDDEN), ids, cos, sin], attrs)
    check_contrib_op("RotaryEmbedding", [rand(B, S, HIDDEN), np.array([3]), cos, sin], attrs)  # offset
    check_contrib_op("RotaryEmbedding", [rand(B, HEADS, S, size), ids, cos, sin], attrs)
    if not dim:  # the heads as wide as the rotation
        check_contrib_op("RotaryEmbedding", [rand(B, S, HIDDEN), ids, cos, sin], {"interleaved": interleaved})


# GroupQueryAttention: 4 query heads over 2 key/value heads of 16
GQ, GKV, GH, PAST = 4, 2, 16, 6
GQA = {"num_heads": GQ, "kv_num_heads": GKV}


def gqa_inputs(seq, batch=B, past=None, lengths=None, rotary=False, known=False, seed=0):
    """query, key, value [batch, seq, heads * 16], a past of `past` rows, seqlens_k (lengths - 1:
    every entry full by default; a constant if `known`) and total_sequence_length; cos and sin
    caches of 32 positions."""
    lengths = lengths or [(past or 0) + seq] * batch
    qkv = [rand(batch, seq, h * GH, seed=seed + i) for i, h in enumerate((GQ, GKV, GKV))]
    pasts = (
        [None, None] if past is None else [rand(batch, GKV, past, GH, seed=seed + 3 + i) for i in range(2)]
    )
    seqlens = np.array(lengths, "int32") - 1
    counts = [Const(seqlens) if known else seqlens, Const(np.array(max(lengths), "int32"))]
    caches = [Const(rand(32, GH // 2, seed=seed + 5 + i)) for i in range(2)] if rotary else []
    return [*qkv, *pasts, *counts, *caches]


def check_gqa_rows(inputs, attrs, rows):
    """A GroupQueryAttention node against ONNX Runtime where its outputs are specified: per batch
    entry rows[b] = (queries, cache rows) (the rest is padding, or past the entry's length)."""
    model, feeds = one_node_model("GroupQueryAttention", inputs, {**GQA, **attrs}, 17, 3, domain=MS)
    result = korch.fission(model)
    assert not result.opaque
    want, got = check.onnxruntime_outputs(model, feeds), reference.run(result.graph, feeds)
    for i, name in enumerate(["out0", "out1", "out2"]):
        assert got[name].shape == want[name].shape
        for b, (queries, cached) in enumerate(rows):
            part = (b, slice(queries)) if i == 0 else (b, slice(None), slice(cached))
            assert check.rel_err(got[name][part], want[name][part]) <= 1e-5, (name, b)


@pytest.mark.parametrize("past", [None, 0, PAST])
@pytest.mark.parametrize("rotary", [0, 1])
def test_group_query_attention_prompt_and_decode(past, rotary):
    """A prompt of 5 tokens (no past, an empty one) and one token after 6 cached, rotated or not
    (half-split and interleaved pairs)."""
    seq = 1 if past else S
    for interleaved in (0, 1) if rotary else (0,):
        attrs = {"do_rotary": rotary, "rotary_interleaved": interleaved}
        check_contrib_op(
            "GroupQueryAttention", gqa_inputs(seq, past=past, rotary=rotary), {**GQA, **attrs}, 3
        )


def test_group_query_attention_packed_chunk_window_softcap_bias():
    packed = rand(B, S, (GQ + 2 * GKV) * GH)
    check_contrib_op("GroupQueryAttention", [packed, None, None, *gqa_inputs(S)[3:]], GQA, 3)
    # a later chunk of 3 tokens after 6 cached (one batch entry, as ONNX Runtime requires)
    chunk = gqa_inputs(3, batch=1, past=PAST, rotary=True)
    check_contrib_op("GroupQueryAttention", chunk, {**GQA, "do_rotary": 1}, 3)
    # a sliding window of 2 keys (the query's own and one before), over a past too
    check_contrib_op("GroupQueryAttention", gqa_inputs(S), {**GQA, "local_window_size": 2}, 3)
    check_contrib_op("GroupQueryAttention", gqa_inputs(3, 1, PAST), {**GQA, "local_window_size": 4}, 3)
    # scale and softcap; attention_bias (added after the cap)
    bias = rand(B, 1, S, S, seed=20)
    check_contrib_op("GroupQueryAttention", gqa_inputs(S), {**GQA, "scale": 0.7, "softcap": 0.5}, 3)
    inputs = [*gqa_inputs(S), None, None, None, bias]
    check_contrib_op("GroupQueryAttention", inputs, {**GQA, "softcap": 0.5}, 3)


def test_group_query_attention_ragged_batches():
    """Entries of different lengths, known only at run time: a decode step after 6 and after 3
    cached tokens (the second entry's new row lands at 3, its present rows past 4 unspecified), and
    a right-padded prompt of 5 and 3 tokens."""
    decode = gqa_inputs(1, past=PAST, lengths=[PAST + 1, 4], rotary=True)
    check_gqa_rows(decode, {"do_rotary": 1}, [(1, PAST + 1), (1, 4)])
    check_gqa_rows(gqa_inputs(S, lengths=[S, 3], rotary=True), {"do_rotary": 1}, [(S, S), (3, 3)])


def test_group_query_attention_sliding_window_cache():
    """Window-sized caches (as the model builder writes Gemma 2 and 3, gpt-oss): 6 rows for a
    window of 4, so positions leave 3 at a time. The prompt (5 tokens, 5 rows kept); one token
    after 9 (the past holds positions 3-8; after it, rows 0-3 hold 6-9) and after 3 (nothing
    evicted), in one batch; a chunk of 3 after 9 (rows 0-5 hold 6-11), rotated and capped."""
    attrs = {"sliding_window_cache": 1, "local_window_size": 4}
    check_gqa_rows(gqa_inputs(S, batch=1, past=6, lengths=[S], known=True), attrs, [(S, S)])
    check_gqa_rows(gqa_inputs(1, past=6, lengths=[10, 4], known=True), attrs, [(1, 4), (1, 4)])
    chunk = gqa_inputs(3, batch=1, past=6, lengths=[12], rotary=True, known=True)
    check_gqa_rows(chunk, {**attrs, "do_rotary": 1, "softcap": 0.5}, [(3, 6)])
    # total_sequence_length, which this path does not read, known only at run time
    unknown_total = gqa_inputs(1, past=6, lengths=[10, 4], known=True)
    unknown_total[6] = unknown_total[6].value
    check_gqa_rows(unknown_total, attrs, [(1, 4), (1, 4)])


def test_group_query_attention_sinks():
    """smooth_softmax (one more score of 0 per query in the softmax) and head_sink (that score per
    head, as gpt-oss's attention sinks), with a window too."""
    sinks = [*gqa_inputs(S), None, None, None, None, Const(rand(GQ, seed=9) * 3)]
    check_contrib_op("GroupQueryAttention", gqa_inputs(S), {**GQA, "smooth_softmax": 1}, 3)
    check_contrib_op("GroupQueryAttention", sinks, GQA, 3)
    check_contrib_op("GroupQueryAttention", sinks, {**GQA, "smooth_softmax": 1, "local_window_size": 3}, 3)
    check_contrib_op("GroupQueryAttention", gqa_inputs(1, past=PAST), {**GQA, "smooth_softmax": 1}, 3)


def test_group_query_attention_options_it_cannot_lower_stay_opaque():
    """position_ids and the qk output are left to ONNX Runtime's kernel."""
    positions = [*gqa_inputs(S, rotary=True), np.tile(np.arange(S), (B, 1))]
    model, feeds = one_node_model("GroupQueryAttention", positions, {**GQA, "do_rotary": 1}, 17, 3, domain=MS)
    assert check_model(model, feeds, allow_opaque=True).opaque_ops == ["GroupQueryAttention"]


def test_an_attribute_set_to_onnx_runtimes_default_is_no_reason_to_stay_opaque():
    """onnx knows no schema for com.microsoft's operators; their defaults come from ONNX Runtime's.
    qk_norm_epsilon (q/k norm weights, which the rule refuses, read it) and MoE's
    swiglu_limit_after_activation (CUDA only) are never looked up by the rules: set to the default,
    the node lowers; set otherwise, it stays whole."""
    check_contrib_op("GroupQueryAttention", gqa_inputs(S), {**GQA, "qk_norm_epsilon": 1e-6}, 3)
    model, feeds = one_node_model(
        "GroupQueryAttention", gqa_inputs(S), {**GQA, "qk_norm_epsilon": 1e-5}, 17, 3, domain=MS
    )
    assert check_model(model, feeds, allow_opaque=True).opaque_ops == ["GroupQueryAttention"]
    moe({"activation_type": "silu", "k": 2, "swiglu_limit_after_activation": 0})


def builder_decoder(seq, past):
    """A one-layer decoder as onnxruntime-genai's model builder writes one (fp32, CPU): embedding,
    SimplifiedLayerNormalization, one qkv MatMul, GroupQueryAttention (rotary inside) fed from the
    attention mask (seqlens_k = its sum - 1, total_sequence_length = its length), the output
    projection, SkipSimplifiedLayerNormalization, a SiLU-gated MLP, the final norm and the LM head.
    32 wide, 2 query heads over 1 key/value head; `seq` new tokens after `past` cached."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    weights = {
        "embed": (40, 32), "norm1": (32,), "qkv": (32, 64), "o": (32, 32), "norm2": (32,),
        "gate": (32, 48), "up": (32, 48), "down": (48, 32), "norm3": (32,), "head": (32, 40),
        "cos": (32, 8), "sin": (32, 8),
    }  # fmt: skip
    inits = [
        numpy_helper.from_array((rng.standard_normal(s) * 0.3).astype("float32"), n)
        for n, s in weights.items()
    ]
    inits += [numpy_helper.from_array(np.array(v, "int64"), n) for n, v in (("one", [1]), ("axis1", [1]))]
    node = helper.make_node
    nodes = [
        node("ReduceSum", ["attention_mask", "axis1"], ["mask_sum"]),
        node("Sub", ["mask_sum", "one"], ["mask_last"]),
        node("Cast", ["mask_last"], ["seqlens_k"], to=TensorProto.INT32),
        node("Shape", ["attention_mask"], ["mask_shape"]),
        node("Gather", ["mask_shape", "one"], ["mask_len"], axis=0),
        node("Cast", ["mask_len"], ["total"], to=TensorProto.INT32),
        node("Gather", ["embed", "input_ids"], ["x"]),
        node("SimplifiedLayerNormalization", ["x", "norm1"], ["h1"], epsilon=1e-6, axis=-1),
        node("MatMul", ["h1", "qkv"], ["packed"]),
        node(
            "GroupQueryAttention",
            ["packed", "", "", "past_key", "past_value", "seqlens_k", "total", "cos", "sin"],
            ["attn", "present_key", "present_value"],
            domain=MS, num_heads=2, kv_num_heads=1, do_rotary=1, local_window_size=-1, scale=0.25,
        ),
        node("MatMul", ["attn", "o"], ["attn_out"]),
        node(
            "SkipSimplifiedLayerNormalization",
            ["attn_out", "x", "norm2"], ["h2", "", "", "residual"], domain=MS, epsilon=1e-6,
        ),
        node("MatMul", ["h2", "gate"], ["g"]),
        node("Sigmoid", ["g"], ["g_sig"]),
        node("Mul", ["g", "g_sig"], ["g_act"]),
        node("MatMul", ["h2", "up"], ["u"]),
        node("Mul", ["g_act", "u"], ["gu"]),
        node("MatMul", ["gu", "down"], ["mlp"]),
        node("SkipSimplifiedLayerNormalization", ["mlp", "residual", "norm3"], ["h3"], domain=MS),
        node("MatMul", ["h3", "head"], ["logits"]),
    ]  # fmt: skip
    info = helper.make_tensor_value_info
    inputs = [
        info("input_ids", TensorProto.INT64, ["batch", "seq"]),
        info("attention_mask", TensorProto.INT64, ["batch", "total"]),
        info("past_key", TensorProto.FLOAT, ["batch", 1, "past", 16]),
        info("past_value", TensorProto.FLOAT, ["batch", 1, "past", 16]),
    ]
    outputs = [info(n, TensorProto.FLOAT, None) for n in ("logits", "present_key", "present_value")]
    model = onnx_model(helper.make_graph(nodes, "decoder", inputs, outputs, inits), 21, [(MS, 1)])
    feeds = {
        "input_ids": rng.integers(0, 40, (1, seq)),
        "attention_mask": np.ones((1, past + seq), "int64"),
        "past_key": rng.standard_normal((1, 1, past, 16)).astype("float32"),
        "past_value": rng.standard_normal((1, 1, past, 16)).astype("float32"),
    }
    return model, feeds


@pytest.mark.parametrize("seq,past", [(6, 0), (1, 5)], ids=["prompt", "decode"])
def test_a_decoder_as_the_model_builder_writes_it(seq, past):
    """Lengths from a mask known at run time (gathers and masks: the embedding's gather, the
    rotary caches' and the present caches'), then from a mask pinned to ones (the caches'
    positions folded, the present a concatenation: the embedding's gather alone is left); both
    lower whole and match ONNX Runtime."""
    from korch.ir.prims import Prim

    model, feeds = builder_decoder(seq, past)
    shapes = {name: value.shape for name, value in feeds.items()}
    unpinned = korch.fission(model, shapes=shapes)
    want, got = check.onnxruntime_outputs(model, feeds), reference.run(unpinned.graph, feeds)
    assert not unpinned.opaque and all(check.rel_err(got[n], w) <= 1e-5 for n, w in want.items())
    pinned = korch.fission(model, shapes=shapes, values={"attention_mask": 1})
    assert not pinned.opaque and korch.check_fission(pinned) <= 1e-5
    gathers = [sum(n.prim is Prim.GATHER for n in r.graph.nodes) for r in (unpinned, pinned)]
    assert gathers == [5, 1]


# ------------------------------------------------------------------ mixtures of experts


def moe(attrs, tokens=(6,), fused=False, seed=0):
    """A MoE node of 4 experts (16 wide, 8 inside) over `tokens`-shaped rows of x."""
    widths = 16 if fused else 8
    x, router = rand(*tokens, 16, seed=seed), rand(int(np.prod(tokens)), 4, seed=seed + 1)
    weights = [
        rand(4, widths, 16, seed=seed + 2),
        rand(4, widths, seed=seed + 3),
        rand(4, 16, 8, seed=seed + 4),
    ]
    check_contrib_op(
        "MoE", [x, router, *(Const(w * 0.3) for w in weights), Const(rand(4, 16, seed=seed + 5))], attrs
    )


@pytest.mark.parametrize("kind", ["relu", "gelu", "silu", "identity"])
@pytest.mark.parametrize("normalize", [0, 1])
def test_moe(kind, normalize):
    """Softmax over every expert, then the top k; or (normalize_routing_weights) the top k's
    softmax. 2-D and 3-D rows."""
    moe({"activation_type": kind, "k": 2, "normalize_routing_weights": normalize})
    moe({"activation_type": kind, "k": 1, "normalize_routing_weights": normalize}, tokens=(2, 3))


def test_moe_swiglu_as_gpt_oss():
    """Interleaved gate and linear columns, clamped at swiglu_limit, gate * sigmoid(alpha * gate)
    * (linear + beta); and the defaults (alpha 1, beta 0, no clamp)."""
    oss = {"activation_alpha": 1.702, "activation_beta": 1.0, "swiglu_limit": 0.5}
    moe(
        {"activation_type": "swiglu", "swiglu_fusion": 1, "k": 2, "normalize_routing_weights": 1, **oss},
        fused=True,
    )
    moe({"activation_type": "swiglu", "swiglu_fusion": 1, "k": 3}, fused=True)


def test_moe_ties_go_to_the_higher_expert():
    """Among equal scores ONNX Runtime takes the experts of higher index first."""
    x, router = rand(4, 16), np.array([[1, 1, 1, 0], [0, 2, 2, 2], [3, 3, 3, 3], [1, 0, 1, 0]], "float32")
    weights = [rand(4, 8, 16, seed=2), rand(4, 16, 8, seed=4)]
    check_contrib_op("MoE", [x, router, Const(weights[0]), None, Const(weights[1])], {"k": 2})


def qmoe_inputs(
    bits=4, block=32, zero=False, swiglu=False, bias=True, tokens=(6,), given=False, dtype="float32"
):
    """A QMoE node's inputs: 4 experts, 64 wide, 32 inside (64 rows of fc1 for swiglu), weights
    packed as the model builder's int4 CPU build packs them (per row or per block of `block`),
    packed zero points when `zero`, router_weights when `given`."""
    rng = np.random.default_rng(0)
    experts, hidden, inner = 4, 64, 32

    def weight(rows, k):
        q = rng.integers(0, 256, (experts, rows, k * bits // 8)).astype("uint8")
        scales = rng.uniform(0.01, 0.05, (experts, rows, k // block) if block else (experts, rows))
        zeros = (experts, rows, -(-(k // block) * bits // 8)) if block else (experts, -(-rows * bits // 8))
        return Const(q), Const(scales.astype(dtype)), Const(rng.integers(0, 256, zeros).astype("uint8"))

    width = 2 * inner if swiglu else inner
    (q1, s1, z1), (q2, s2, z2) = weight(width, hidden), weight(hidden, inner)
    b1, b2 = (
        Const(rng.standard_normal((experts, n)).astype(dtype)) if bias else None for n in (width, hidden)
    )
    x = (rng.standard_normal((*tokens, hidden)) * 2).astype(dtype)
    router = rng.standard_normal((int(np.prod(tokens)), experts)).astype(dtype)
    zeros = [z1, z2] if zero else [None, None]
    inputs = [x, router, q1, s1, b1, q2, s2, b2, None, None, None, *zeros]
    return inputs + [None, rng.uniform(-0.2, 1, router.shape).astype(dtype)] if given else inputs


def qmoe(attrs, tol=1e-4, **kw):
    bits, block = attrs.get("expert_weight_bits", 4), attrs.get("block_size", 0)
    return check_contrib_op("QMoE", qmoe_inputs(bits, block, **kw), attrs, tol=tol)


@pytest.mark.parametrize("bits", [2, 4, 8])
@pytest.mark.parametrize("block", [0, 32])
@pytest.mark.parametrize("zero", [False, True])
def test_qmoe_weights(bits, block, zero):
    """2-, 4- and 8-bit experts, scaled per row or per block of 32, zero points packed or
    2^(bits-1); blocked 8-bit weights run on activations rounded to 8 bits (ONNX Runtime's int8
    kernel: dequantizing alone is 0.7% off)."""
    attrs = {"expert_weight_bits": bits, "k": 2, "normalize_routing_weights": 1}
    qmoe({**attrs, "block_size": block} if block else attrs, zero=zero)


def test_qmoe_as_the_model_builder_writes_lfm2_moe():
    """int4 in blocks of 32, interleaved swiglu, biases, normalize_routing_weights; accuracy_level
    4 rounds 4-bit experts' activations to 8 bits per block (2-bit ones' not); a decode step's
    one token."""
    lfm2 = {"block_size": 32, "activation_type": "swiglu", "swiglu_fusion": 1, "k": 2}
    qmoe({**lfm2, "normalize_routing_weights": 1}, swiglu=True)
    qmoe({**lfm2, "activation_alpha": 1.702, "activation_beta": 1.0, "swiglu_limit": 0.5}, swiglu=True)
    qmoe({**lfm2, "accuracy_level": 4}, swiglu=True, tokens=(1,))
    qmoe({"expert_weight_bits": 2, "block_size": 32, "accuracy_level": 4})


@pytest.mark.parametrize("kind", ["relu", "gelu", "silu", "identity"])
def test_qmoe_activations_and_routing(kind):
    """Without router_weights the k chosen are weighted by their softmax, normalize_routing_weights
    or not (ONNX Runtime's CPU kernel; MoE's takes the softmax over all experts without it); with
    router_weights, those of the k chosen (divided by their sum when normalized; a weight of at
    most 1e-8, as the negative ones here, drops its expert)."""
    qmoe({"activation_type": kind, "k": 2, "normalize_routing_weights": 0, "block_size": 32}, tokens=(2, 3))
    qmoe({"activation_type": kind, "k": 3, "normalize_routing_weights": 1}, given=True, bias=False)
    qmoe({"activation_type": kind, "k": 1, "normalize_routing_weights": 0}, given=True)


def test_qmoe_of_float16_keeps_its_weights_packed():
    """float16 values computed in float32 as ONNX Runtime does (to float16's precision); the packed
    weights stay the graph's largest constants (folded at import they were float32, 8 times as
    large)."""
    result = qmoe({"block_size": 32, "k": 2, "accuracy_level": 4}, tol=2e-3, dtype="float16")
    qmoe({"expert_weight_bits": 8, "k": 2}, tol=2e-3, dtype="float16")
    packed = 4 * 32 * 64 // 2  # either weight: 4 experts x 32 x 64 values of 4 bits
    assert max(c.nbytes for c in result.graph.constants.values()) == packed


@pytest.mark.parametrize(
    "attrs,length",
    [({}, 5), ({"dilation": 2}, 5), ({"dilation": 3, "activation": "silu"}, 1), ({"activation": "swish"}, 2)],
)
@pytest.mark.parametrize("past", [False, True])
def test_causal_conv_with_state(attrs, length, past):
    """ONNX Runtime's CausalConvWithState (LFM2's short convolution: the model builder writes it
    with the state an input): dilated taps, whose state is (k - 1) * dilation long; a decode
    step's one position."""
    state = 3 * attrs.get("dilation", 1)
    inputs = [rand(2, 6, length), Const(rand(6, 1, 4, seed=1)), Const(rand(6, seed=2))]
    inputs.append(rand(2, 6, state, seed=3) if past else None)
    check_contrib_op("CausalConvWithState", inputs, attrs, n_outputs=2, tol=1e-5)


def test_causal_conv_with_state_channels_last_and_float16():
    """channels_last: x [batch, length, d1, d2] and the states [batch, state, d1, d2], channels d1 *
    d2; float16 computed in float32."""
    w = Const(rand(6, 1, 4, seed=1))
    inputs = [rand(2, 5, 2, 3), w, None, rand(2, 3, 2, 3, seed=3)]
    check_contrib_op("CausalConvWithState", inputs, {"channels_last": 1}, n_outputs=2, tol=1e-5)
    half = [rand(2, 6, 5, dtype="float16"), Const(rand(6, 1, 4, seed=1, dtype="float16")), None]
    check_contrib_op("CausalConvWithState", half, {"activation": "silu"}, n_outputs=2, tol=2e-3)


@pytest.mark.parametrize(
    "rule,heads,kv_heads,key_heads",
    [("linear", 2, 2, 2), ("gated", 4, 2, 2), ("delta", 2, 1, 1), ("gated_delta", 4, 2, 2),
     ("gated_delta", 2, 4, 4), ("linear", 1, 2, 2), ("gated_delta", 2, 4, 2)],
)  # fmt: skip
def test_linear_attention(rule, heads, kv_heads, key_heads):
    """ONNX Runtime's LinearAttention (Qwen3.5's Gated DeltaNet layers as the model builder writes
    them for a CPU), against its own CPU kernel: ONNX's opset-27 operator's rule. With more
    key/value heads than query heads (Qwen3.5's 2 and 4) each query head serves a run of them and
    the output has one head per key/value head; the key may then have the query's heads (Qwen3.5's
    2 key heads for 4 value heads), grouped as the query's."""
    per_head = rule == "gated_delta"  # (Qwen3.5's: a decay per head)
    inputs, attrs = linear_attention_case(rule, heads, kv_heads, rule != "linear", key_heads, per_head)
    check_contrib_op("LinearAttention", inputs, attrs, n_outputs=2, tol=1e-5)


@pytest.mark.parametrize(
    "rule,heads,kv_heads,key_heads",
    [("linear", 2, 2, 2), ("gated", 4, 2, 2), ("delta", 2, 1, 1), ("gated_delta", 2, 4, 2)],
)
def test_linear_attention_in_chunks(rule, heads, kv_heads, key_heads, monkeypatch):
    """From 16 steps, with a decay per head (Qwen3.5's prompts), the recurrence runs in chunks of
    about sqrt(T): 37 steps are 6 chunks of 7, the last padded. The same results as ONNX Runtime's
    kernel (and ONNX's opset-27 operator's), in under half the primitives of a step each."""
    from korch.frontend.onnx import rules_attention

    inputs, attrs = linear_attention_case(
        rule, heads, kv_heads, True, key_heads, per_head_decay=True, steps=37
    )
    chunked = check_contrib_op("LinearAttention", inputs, attrs, n_outputs=2, tol=1e-5)
    monkeypatch.setattr(rules_attention, "CHUNKED_FROM", 10**9)
    stepped = check_contrib_op("LinearAttention", inputs, attrs, n_outputs=2, tol=1e-5)
    assert 2 * len(chunked.graph.nodes) < len(stepped.graph.nodes)
    if heads >= kv_heads:
        monkeypatch.undo()
        check_op("LinearAttention", inputs, attrs, opset=27, n_outputs=2, tol=1e-5)


@pytest.mark.parametrize("dtype,tol", [("float32", 1e-5), ("float16", 2e-3)])
def test_linear_attention_gate_gated_rms_norm_gated_add(dtype, tol):
    """The rest of a Gated DeltaNet layer and Qwen3.5-MoE's MLP as the model builder writes them:
    LinearAttentionGate (decay = decay_scale * softplus(a + dt_bias) in float32, softplus whole
    at +-100; beta = sigmoid(b), or none), GatedRMSNorm (per run of scale's length, each gate
    activation) and GatedAdd (x + y * gate per row)."""
    a = rand(2, 5, 4, dtype=dtype) * 4
    a[0, 0] = [-100, -20, 20, 100]
    scales = [Const(rand(4, seed=1)), Const(-np.exp(rand(4, seed=2)))]  # (float32 always)
    check_contrib_op(
        "LinearAttentionGate", [a, *scales, rand(2, 5, 4, seed=3, dtype=dtype)], n_outputs=2, tol=tol
    )
    check_contrib_op("LinearAttentionGate", [a, *scales], tol=tol)
    x, gate = rand(2, 5, 12, dtype=dtype), rand(2, 5, 12, seed=2, dtype=dtype)
    for activation in ("silu", "swish", "sigmoid"):
        attrs = {"activation": activation, "epsilon": 1e-6}
        check_contrib_op("GatedRMSNorm", [x, Const(rand(4, seed=1, dtype=dtype)), gate], attrs, tol=tol)
    check_contrib_op("GatedRMSNorm", [x, Const(rand(12, seed=1, dtype=dtype)), gate], tol=tol)
    y, row = rand(2, 5, 12, seed=4, dtype=dtype), rand(2, 5, 1, seed=5, dtype=dtype)
    check_contrib_op("GatedAdd", [x, y, row], tol=tol)


@pytest.mark.parametrize(
    "layout,sections,rotated,four_d,interleaved",
    [(1, [2, 1, 1], 8, False, 0), (0, [2, 1, 1], 8, False, 0), (1, [4, 2, 2], 16, False, 0),
     (0, [3, 3, 2], 16, True, 0), (1, [2, 1, 1], 8, False, 1), (1, [1, 2, 1], 8, True, 0)],
)  # fmt: skip
def test_m_rotary_embedding(layout, sections, rotated, four_d, interleaved):
    """Qwen-VL's and Qwen3.5's multimodal RoPE: three position streams (here all different, as an
    image's tokens have them) read from one cache, the angles taken from them in contiguous
    sections (layout 0) or interleaved (1, Qwen3.5's), then RotaryEmbedding's rotation of part
    (or all) of each head."""
    rng = np.random.default_rng(0)
    angles = rng.uniform(0, 6, (32, sum(sections))).astype("float32")
    positions = rng.integers(0, 32, (3, 2, 5)).astype("int64")
    x = rand(2, 3, 5, 16) if four_d else rand(2, 5, 3 * 16)
    attrs = {
        "mrope_section": sections,
        "mrope_layout": layout,
        "rotary_embedding_dim": rotated,
        "num_heads": 3,
    }
    inputs = [x, positions, Const(np.cos(angles)), Const(np.sin(angles))]
    check_contrib_op("MRotaryEmbedding", inputs, {**attrs, "interleaved": interleaved}, tol=1e-6)


# ------------------------------------------------- whole models as ONNX Runtime saves them


@pytest.fixture(scope="module")
def tiny_bert(tmp_path_factory):
    """A two-layer BERT from korch's zoo, 32 wide, exported by torch."""
    import torch

    from korch.cli.zoo.attention import Bert

    torch.manual_seed(0)
    module = Bert(vocab=50, dim=32, layers=2, heads=2, max_len=16).eval()
    ids = torch.randint(0, 50, (2, 8))
    mask = torch.tensor([[1] * 8, [1] * 5 + [0] * 3])
    path = tmp_path_factory.mktemp("bert") / "bert.onnx"
    names = ["input_ids", "attention_mask", "token_type_ids"]
    with torch.no_grad():
        torch.onnx.export(
            module,
            (ids, mask, torch.zeros_like(ids)),
            str(path),
            dynamo=False,
            opset_version=17,
            input_names=names,
        )
    feeds = {"input_ids": ids.numpy(), "attention_mask": mask.numpy(), "token_type_ids": (ids.numpy() % 2)}
    return path, feeds


def _contrib_ops(model):
    return sorted({node.op_type for node in model.graph.node if node.domain == MS})


def test_a_model_saved_by_onnx_runtimes_session_optimizer(tiny_bert, tmp_path):
    import onnx

    path, feeds = tiny_bert
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    options.optimized_model_filepath = str(tmp_path / "saved.onnx")
    ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    saved = onnx.load(options.optimized_model_filepath)
    assert {"FusedMatMul", "Gelu", "SkipLayerNormalization"} <= set(_contrib_ops(saved))
    check_model(saved, feeds)  # (nothing opaque, outputs as ONNX Runtime's)


def test_a_model_from_onnx_runtimes_transformer_optimizer(tiny_bert, tmp_path):
    import onnx
    from onnxruntime.transformers import optimizer

    path, feeds = tiny_bert
    for fast_gelu in (False, True):
        options = optimizer.FusionOptions("bert")
        options.enable_gelu_approximation = fast_gelu
        optimized = optimizer.optimize_model(
            str(path),
            model_type="bert",
            num_heads=2,
            hidden_size=32,
            optimization_options=options,
            opt_level=0,
        )
        optimized.save_model_to_file(str(tmp_path / "optimized.onnx"))
        saved = onnx.load(str(tmp_path / "optimized.onnx"))
        ops = _contrib_ops(saved)
        assert {"Attention", "EmbedLayerNormalization", "SkipLayerNormalization"} <= set(ops), ops
        assert ("FastGelu" if fast_gelu else "BiasGelu") in ops, ops
        check_model(saved, feeds)  # (nothing opaque, outputs as ONNX Runtime's)
