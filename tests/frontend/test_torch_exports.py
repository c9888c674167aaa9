"""Small PyTorch modules exported to ONNX at several opsets: the patterns real exporters emit."""

import warnings

import numpy as np
import onnx
import pytest
import torch
from torch import nn
from torch.nn import functional as F

import korch
from korch.measure import check


def export_and_check(module, *inputs, opset=17, tmp_path=None):
    path = tmp_path / f"m{opset}.onnx"
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        torch.onnx.export(module.eval(), inputs, str(path), dynamo=False, opset_version=opset)
    result = korch.fission(path)
    assert not result.opaque, result.opaque
    err = korch.check_fission(result)
    assert err <= 1e-4, err
    return result


class Gelus(nn.Module):
    def forward(self, x):
        return F.gelu(x) + F.gelu(x * 0.5, approximate="tanh")


@pytest.mark.parametrize("opset", [13, 17, 20])
def test_gelu_formulas_become_primitives(opset, tmp_path):
    result = export_and_check(Gelus(), torch.randn(4, 16), opset=opset, tmp_path=tmp_path)
    prims = {n.prim.value for n in result.graph.nodes}
    assert "erf" in prims and "tanh" in prims


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln = nn.LayerNorm(16)
        self.fc = nn.Linear(16, 16)
        self.gn = nn.GroupNorm(4, 8)
        self.inorm = nn.InstanceNorm2d(8, affine=True)

    def forward(self, x, img):
        y = torch.softmax(self.fc(self.ln(x)), -1) + x
        z = F.interpolate(self.gn(img), scale_factor=2, mode="bilinear", align_corners=True)
        z = F.avg_pool2d(self.inorm(z), 3, 2, 1, ceil_mode=True, count_include_pad=False)
        return y.log_softmax(1), F.hardswish(z) + F.mish(z), torch.cumsum(y, -1)[..., :1].clamp(-1, 1)


@pytest.mark.parametrize("opset", [14, 17, 18])
def test_norms_softmax_and_resampling(opset, tmp_path):
    export_and_check(Block(), torch.randn(2, 5, 16), torch.randn(1, 8, 6, 6), opset=opset, tmp_path=tmp_path)


class DecoderStep(nn.Module):
    """One attention layer over a key/value cache, as Hugging Face decoders are exported for ONNX
    Runtime (optimum's past_key_values / present layout): the cache so far in, the cache with this
    step's keys and values out; the step's length and the cache's are dynamic axes."""

    def __init__(self, d=16, heads=2):
        super().__init__()
        self.heads = heads
        self.qkv, self.out = nn.Linear(d, 3 * d), nn.Linear(d, d)

    def forward(self, x, past_k, past_v):
        b, n, d = x.shape
        q, k, v = self.qkv(x).reshape(b, n, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        k, v = torch.cat([past_k, k], 2), torch.cat([past_v, v], 2)
        position = torch.arange(n)[:, None] + past_k.shape[2]  # (the causal frontier at the cache's end)
        mask = torch.arange(k.shape[2])[None, :] <= position
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return self.out(y.transpose(1, 2).reshape(b, n, d)), k, v


@pytest.mark.e2e
def test_a_decoder_step_over_a_key_value_cache_optimizes_for_prefill_and_decode(tmp_path):
    """The same exported file pinned to a prefill (an empty cache: zero-size inputs) and to a decode
    step (one token over four cached), each optimized into a plan that matches ONNX Runtime."""
    path = tmp_path / "decoder.onnx"
    cache = {0: "batch", 2: "past"}
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            DecoderStep().eval(),
            (torch.randn(1, 3, 16), torch.randn(1, 2, 2, 8), torch.randn(1, 2, 2, 8)),
            str(path),
            dynamo=False,
            opset_version=17,
            input_names=["x", "past_k", "past_v"],
            output_names=["y", "present_k", "present_v"],
            dynamic_axes={"x": {0: "batch", 1: "step"}, "past_k": cache, "past_v": cache},
        )
    for step, past in [(4, 0), (1, 4)]:
        shapes = {"x": (1, step, 16), "past_k": (1, 2, past, 8), "past_v": (1, 2, past, 8)}
        fast = dict(backends="onnxruntime,inductor", min_time=0.002, progress=False, time_budget=5)
        plan = korch.optimize(path, shapes=shapes, cache=tmp_path / "p.sqlite", **fast)
        rng = np.random.default_rng(past)
        feeds = {n: rng.standard_normal(s).astype("float32") for n, s in shapes.items()}
        want = check.onnxruntime_outputs(onnx.load(path), feeds)
        got = plan(**feeds)
        assert [g.shape for g in got] == [(1, step, 16), (1, 2, past + step, 8), (1, 2, past + step, 8)]
        for name, value in zip(["y", "present_k", "present_v"], got):
            np.testing.assert_allclose(value, want[name], rtol=1e-4, atol=1e-5)
