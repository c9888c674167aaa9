"""ONNX's Attention operator (opset 23 on: torch.onnx exports scaled_dot_product_attention as one)
split into primitives, against ONNX Runtime's own Attention kernel."""

import numpy as np
import pytest
from helpers import Const, check_op, linear_attention_case, one_node_model, rand

import korch
from korch.measure import check

FAST = dict(backends="onnxruntime,inductor", min_time=0.002, progress=False, time_budget=20)


def test_grouped_query_attention_over_a_cache_with_a_short_boolean_mask_and_causal_frontier():
    """3D inputs (4 query heads sharing 2 key/value heads), a key/value cache, a boolean mask,
    the causal frontier aligned to the cache's end, every output (probabilities as the fourth)."""
    b, q_len, past, kv_len, d = 2, 3, 4, 3, 8
    q, k, v = rand(b, q_len, 4 * d, seed=1), rand(b, kv_len, 2 * d, seed=2), rand(b, kv_len, 2 * d, seed=3)
    mask = rand(q_len, past + kv_len, dtype="bool", seed=4)
    mask[:, 0] = True  # (every query attends some key: ONNX Runtime's and the spec's empty rows differ)
    past_k, past_v = rand(b, 2, past, d, seed=5), rand(b, 2, past, d, seed=6)
    attrs = {"q_num_heads": 4, "kv_num_heads": 2, "is_causal": 1, "qk_matmul_output_mode": 3}
    check_op("Attention", [q, k, v, mask, past_k, past_v], attrs, opset=23, n_outputs=4)


@pytest.mark.parametrize("mode", [0, 1, 2])
def test_attention_with_a_float_mask_softcap_and_scale(mode):
    q, k, v = rand(1, 2, 5, 4, seed=1), rand(1, 2, 6, 4, seed=2), rand(1, 2, 6, 4, seed=3)
    mask = rand(5, 6, seed=4)
    attrs = {"scale": 0.3, "softcap": 2.0, "qk_matmul_output_mode": mode}
    check_op("Attention", [q, k, v, mask], attrs, opset=23, n_outputs=4)


@pytest.mark.e2e
def test_an_attention_model_optimizes_into_fused_kernels_that_match_onnxruntime(tmp_path):
    """What torch.onnx's exporter writes for a causal scaled_dot_product_attention at opset 23."""
    q = rand(1, 4, 8, 16, seed=1)
    model, feeds = one_node_model(
        "Attention", [q, rand(1, 4, 8, 16, seed=2), rand(1, 4, 8, 16, seed=3)], {"is_causal": 1}, opset=23
    )
    fission = korch.fission(model)
    assert not fission.opaque and len(fission.graph.nodes) > 5
    plan = korch.optimize(model, **FAST, cache=tmp_path / "p.sqlite")
    assert plan.verify() <= 1e-4
    np.testing.assert_allclose(
        plan(**feeds)[0], check.onnxruntime_outputs(model, feeds)["out0"], rtol=1e-4, atol=1e-5
    )


@pytest.mark.parametrize("causal", [0, 1])
def test_attention_over_an_external_cache_with_key_lengths_known_at_run_time(causal):
    """nonpad_kv_seqlen (opset 24): per batch entry, the keys past its length are padding and
    the causal frontier ends at its last real key; a decode step of grouped-query attention."""
    q, k, v = rand(3, 4, 1, 8, seed=1), rand(3, 2, 6, 8, seed=2), rand(3, 2, 6, 8, seed=3)
    lengths = np.array([6, 2, 4], "int64")
    check_op("Attention", [q, k, v, None, None, None, lengths], {"is_causal": causal}, opset=24)
    prefill = [rand(2, 2, 3, 8, seed=4), rand(2, 2, 5, 8, seed=5), rand(2, 2, 5, 8, seed=6)]
    check_op(
        "Attention",
        [*prefill, rand(3, 5, seed=7), None, None, np.array([5, 3], "int64")],
        {"is_causal": causal},
        opset=24,
    )


@pytest.mark.parametrize("opset", [23, 24])
@pytest.mark.parametrize("interleaved", [0, 1])
def test_rotary_embedding(interleaved, opset):
    """Positions read from the caches at run time (4D input, every feature rotated; 3D input with
    num_heads, half of each head rotated), or caches already per position."""
    cos, sin = rand(10, 4, seed=1), rand(10, 4, seed=2)
    positions = np.array([[0, 3, 9], [2, 2, 5]], "int64")
    attrs = {"interleaved": interleaved}
    check_op(
        "RotaryEmbedding",
        [rand(2, 3, 3, 8, seed=3).transpose(0, 2, 1, 3).copy(), cos, sin, positions],
        attrs,
        opset=opset,
    )
    attrs.update(num_heads=2, rotary_embedding_dim=8)
    check_op("RotaryEmbedding", [rand(2, 3, 32, seed=4), cos, sin, positions], attrs, opset=opset)
    check_op(
        "RotaryEmbedding",
        [rand(2, 3, 32, seed=5), rand(2, 3, 4, seed=6), rand(2, 3, 4, seed=7)],
        attrs,
        opset=opset,
    )


def test_sliding_window_attention():
    """left_window_size and right_window_size (opset 25): query i attends keys i - left .. i +
    right (from i + the past's length after a cache), with or without the causal frontier."""
    q, k, v = rand(1, 2, 6, 8, seed=1), rand(1, 2, 6, 8, seed=2), rand(1, 2, 6, 8, seed=3)
    check_op("Attention", [q, k, v], {"is_causal": 1, "left_window_size": 2}, opset=25)
    check_op("Attention", [q, k, v], {"left_window_size": 1, "right_window_size": 3}, opset=25)
    past = [rand(1, 2, 4, 8, seed=4), rand(1, 2, 4, 8, seed=5)]
    check_op(
        "Attention", [q, k, v, None, *past], {"is_causal": 1, "left_window_size": 3}, opset=25, n_outputs=3
    )


@pytest.mark.parametrize(
    "rule,heads,kv_heads,past",
    [("linear", 2, 2, False), ("gated", 4, 2, True), ("delta", 2, 1, False), ("gated_delta", 4, 2, True)],
)
def test_linear_attention_against_onnxruntime(rule, heads, kv_heads, past):
    """Opset 27's LinearAttention unrolled over 5 steps: each update rule, grouped key/value heads,
    a past state; decays per key dimension, betas per head."""
    inputs, attrs = linear_attention_case(rule, heads, kv_heads, past)
    check_op("LinearAttention", inputs, attrs, opset=27, n_outputs=2)


def test_linear_attention_of_onnx_needs_whole_groups_of_query_heads():
    """More key/value heads than query heads is ONNX Runtime's own operator's (com.microsoft,
    tests/frontend/test_fission_contrib.py); ONNX's refuses it, as ONNX Runtime does."""
    inputs, attrs = linear_attention_case("linear", 2, 4, False)
    model, _ = one_node_model("LinearAttention", inputs, attrs, 27, 2)
    with pytest.raises(korch.KorchError, match="heads 2/4"):
        korch.fission(model)


@pytest.mark.parametrize("past,activation", [(False, "none"), (True, "silu")])
def test_causal_conv_with_state_against_onnxruntime(past, activation):
    inputs = [
        rand(2, 3, 6),
        Const(rand(3, 1, 4, seed=1)),
        Const(rand(3, seed=2)),
        rand(2, 3, 3, seed=3) if past else None,
    ]
    check_op("CausalConvWithState", inputs, {"activation": activation}, opset=27, n_outputs=2)
