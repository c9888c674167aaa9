"""Small PyTorch modules exported to ONNX at several opsets: the patterns real exporters emit."""

import warnings

import pytest
import torch
from torch import nn
from torch.nn import functional as F

import korch


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
