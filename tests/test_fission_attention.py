"""ONNX's Attention operator (opset 23 on: torch.onnx exports scaled_dot_product_attention as one)
split into primitives, against ONNX Runtime's own Attention kernel."""

import numpy as np
import pytest
from helpers import check_op, one_node_model, rand

import korch
from korch import check

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
