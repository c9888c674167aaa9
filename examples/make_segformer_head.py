"""Regenerate examples/segformer_head.onnx: Segformer's all-MLP decode head alone, random weights.

Four feature maps (a 128x128 image's encoder stages: 32x32, 16x16, 8x8 and 4x4) each go through a
linear layer, are resized to 32x32 and concatenated; a 1x1 convolution fuses them. korch folds that
convolution into the four linear layers (korch/rewrite/linear.py), a graph with less work than the
model as written, which is what its plan runs."""

import warnings
from pathlib import Path

import torch
from torch import nn

from korch.cli.zoo import _randomize_norms
from korch.cli.zoo.attention import decode_head

DIMS = (32, 64, 160, 256)  # MiT-b0's stage widths
SIZES = (32, 16, 8, 4)  # their resolutions for a 128x128 image


class SegformerHead(nn.Module):
    def __init__(self, dims=DIMS, decoder=128, classes=19):
        super().__init__()
        self.mlps = nn.ModuleList(nn.Linear(d, decoder) for d in dims)
        self.fuse = nn.Sequential(
            nn.Conv2d(4 * decoder, decoder, 1, bias=False), nn.BatchNorm2d(decoder), nn.ReLU()
        )
        self.classify = nn.Conv2d(decoder, classes, 1)

    def forward(self, *feats):
        return decode_head(feats, self.mlps, self.fuse, self.classify)


def main() -> None:
    torch.manual_seed(0)
    model = SegformerHead()
    _randomize_norms(model)
    feats = tuple(torch.randn(1, d, s, s) for d, s in zip(DIMS, SIZES))
    out = Path(__file__).with_name("segformer_head.onnx")
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            model.eval(),
            feats,
            str(out),
            dynamo=False,
            opset_version=17,
            input_names=[f"stage{i + 1}" for i in range(len(DIMS))],
            output_names=["logits"],
        )
    print(out, out.stat().st_size, "bytes")


if __name__ == "__main__":
    main()
