"""Regenerate examples/tiny_segformer.onnx: a Segformer with tiny widths, random weights, 64x64 input.

It has what the big models have (strided and depthwise convolutions, efficient attention with
softmax, LayerNorm, GELU, bilinear resize, BatchNorm) in a file small enough to commit."""

import warnings
from pathlib import Path

import torch

from korch.cli.zoo import _randomize_norms
from korch.cli.zoo.attention import Segformer


def main() -> None:
    torch.manual_seed(0)
    model = Segformer(dims=(8, 16, 24, 32), heads=(1, 2, 3, 4), srs=(8, 4, 2, 1), classes=4, decoder=16)
    _randomize_norms(model)
    out = Path(__file__).with_name("tiny_segformer.onnx")
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            model.eval(),
            (torch.randn(1, 3, 64, 64),),
            str(out),
            dynamo=False,
            opset_version=17,
            input_names=["image"],
            output_names=["logits"],
        )
    print(out, out.stat().st_size, "bytes")


if __name__ == "__main__":
    main()
