"""timm and torchvision models exported to ONNX by torch.onnx, for benchmarks/torch_hub_zoo.py. Runs
in an environment with torchvision and timm (not korch's: PyPI's torchvision does not import beside
korch's CPU wheel of torch; `python -m venv ENV && ENV/bin/pip install torch==2.14.1
torchvision==0.29.1 timm onnx onnxscript`): `ENV/bin/python benchmarks/torch_hub_export.py DIR NAME
...` writes DIR/NAME.onnx and prints `ok NAME` or `fail NAME: why` per model. NAME is `timm-` and a
timm model name (its default input size) or `tv-` and a torchvision model builder (the input below;
a detector's name and `-head`: the detector up to its box filtering, DetectorHeads).
Batch 1, random weights seeded by torch, evaluation mode, torch.onnx's default exporter (dynamo,
its opset, its graph optimizations), `--legacy` for the TorchScript one (opset 17).
"""

from __future__ import annotations

import inspect
import re
import sys
import warnings

import torch

# torchvision builders' inputs (C, H, W) or (C, T, H, W) other than 3x224x224 (RAFT takes two images)
TORCHVISION_INPUTS = {
    "r3d_18": (3, 16, 112, 112),
    "ssdlite320_mobilenet_v3_large": (3, 320, 320),
    "fasterrcnn_mobilenet_v3_large_320_fpn": (3, 320, 320),
}


class DetectorHeads(torch.nn.Module):
    """A torchvision detector cut where its outputs' shapes start to depend on values: the
    normalized image through the backbone and the heads (SSD's, or Faster R-CNN's proposal head),
    every anchor's scores and box offsets; filtering, NMS and the second stage left to the caller."""

    def __init__(self, detector):
        super().__init__()
        self.detector = detector

    def forward(self, x):
        d = self.detector
        features = list(d.backbone(d.transform.normalize(x[0]).unsqueeze(0)).values())
        if hasattr(d, "rpn"):
            objectness, deltas = d.rpn.head(features)
            return *objectness, *deltas
        out = d.head(features)
        return out["cls_logits"], out["bbox_regression"]


def build(name: str):
    """The module and its example inputs."""
    if name.startswith("timm-"):
        import timm

        model = timm.create_model(name[5:], pretrained=False)
        return model, (torch.randn(1, *model.pretrained_cfg["input_size"]),)
    if name.startswith("tv-"):
        import torchvision

        arch, cut = name[3:].removesuffix("-head"), name.endswith("-head")
        builder = torchvision.models.get_model_builder(arch)
        none = {
            k: None for k in ("weights", "weights_backbone") if k in inspect.signature(builder).parameters
        }
        model = builder(**none)  # (no download: a backbone's weights too)
        if cut:  # a detector up to its box filtering (korch refuses that: data-dependent shapes)
            model = DetectorHeads(model)
        if arch == "raft_small":
            return model, (torch.randn(1, 3, 128, 128), torch.randn(1, 3, 128, 128))
        return model, (torch.randn(1, *TORCHVISION_INPUTS.get(arch, (3, 224, 224))),)
    raise ValueError(f"{name}: neither timm- nor tv-")


def export(name: str, path: str, legacy: bool) -> None:
    torch.manual_seed(0)
    model, inputs = build(name)
    model.eval()
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if legacy:
            torch.onnx.export(model, inputs, path, dynamo=False, opset_version=17)
        else:
            torch.onnx.export(model, inputs, path, dynamo=True, external_data=False)


def main() -> None:
    legacy = "--legacy" in sys.argv
    directory, *names = [a for a in sys.argv[1:] if a != "--legacy"]
    for name in names:
        try:
            export(name, f"{directory}/{name}.onnx", legacy)
            print(f"ok {name}", flush=True)
        except Exception as e:  # (report and go on: one model's exporter failure is a finding)
            why = " ".join(re.sub(r"\x1b\[[0-9;]*m", "", str(e)).split())[:160]  # (no colours)
            print(f"fail {name}: {type(e).__name__}: {why}", flush=True)


if __name__ == "__main__":
    main()
