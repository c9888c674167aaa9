"""timm and torchvision models as torch.onnx writes them (its default exporter since PyTorch 2.9:
torch.export, then onnxscript's translation and optimizer): image classifiers of many families,
among them EfficientViT-B1 (MIT's, the paper's), segmentation heads, a video network of 3-D
convolutions, optical flow, detectors whole and up to their box filtering (torch.export refuses
the whole ones; benchmarks/torch_hub_export.py has the inputs), random weights, batch 1. Their
graphs are what a PyTorch user hands korch today.

Per file, as benchmarks/quantized_zoo.py: primitives, opaque operators, the primitive graph's error
against ONNX Runtime, the plan's kernels and backends, `plan.verify()`, medians of korch and ONNX
Runtime (interleaved) and their ratio. The export runs in an environment of its own (PyPI's
torchvision does not import beside korch's CPU wheel of torch): `python -m venv ENV &&
ENV/bin/pip install torch==2.14.1 torchvision==0.29.1 timm onnx onnxscript`. Usage: `python
benchmarks/torch_hub_zoo.py [NAME ...] --torch-python ENV/bin/python --dir DIR [--legacy]
[--time-budget S] [--cache DB]`.
"""

from __future__ import annotations

from pathlib import Path

from tf2onnx_zoo import exported_parser, measure_exported

MODELS = (
    "timm-resnet50",
    "timm-efficientnet_b0",
    "timm-mobilenetv3_large_100",
    "timm-regnety_016",
    "timm-convnext_tiny",
    "timm-ghostnet_100",
    "timm-vit_small_patch16_224",
    "timm-swin_tiny_patch4_window7_224",
    "timm-efficientvit_b1",
    "timm-mobilevit_s",
    "timm-levit_128",
    "timm-poolformer_s12",
    "timm-mixer_s16_224",
    "tv-shufflenet_v2_x1_0",
    "tv-deeplabv3_mobilenet_v3_large",
    "tv-lraspp_mobilenet_v3_large",
    "tv-r3d_18",
    "tv-raft_small",
    "tv-ssdlite320_mobilenet_v3_large",
    "tv-fasterrcnn_mobilenet_v3_large_320_fpn",
    "tv-ssdlite320_mobilenet_v3_large-head",
    "tv-fasterrcnn_mobilenet_v3_large_320_fpn-head",
)


def main() -> None:
    parser = exported_parser(__doc__, MODELS, "--torch-python", "a Python with torchvision, timm, onnxscript")
    parser.add_argument("--legacy", action="store_true", help="torch.onnx's TorchScript exporter")
    args = parser.parse_args()
    exporter = [args.torch_python, str(Path(__file__).with_name("torch_hub_export.py"))]
    exporter += ["--legacy"] if args.legacy else []
    measure_exported(args.models, exporter, Path(args.dir), args.time_budget, args.cache, "torch.onnx")


if __name__ == "__main__":
    main()
