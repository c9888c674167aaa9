"""Fission rules for ONNX Runtime's own operators (com.microsoft, and the two it adds to ONNX's
domain), checked against ONNX Runtime's CPU kernels; and whole models as ONNX Runtime's optimizers
save them (every operator lowered, outputs as ONNX Runtime's)."""

import numpy as np
import onnxruntime as ort
import pytest
from helpers import Const, check_contrib_op, check_model, one_node_model, rand

import korch

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


# ------------------------------------------------- whole models as ONNX Runtime saves them


@pytest.fixture(scope="module")
def tiny_bert(tmp_path_factory):
    """A two-layer BERT from korch's zoo, 32 wide, exported by torch."""
    import torch

    from korch.zoo.attention import Bert

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
