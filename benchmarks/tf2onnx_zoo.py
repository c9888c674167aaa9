"""Keras models as tf2onnx writes them (TensorFlow's ONNX exporter): the image classifiers of
`keras.applications` and four small models of other layers (benchmarks/keras_export.py), random
weights, batch 1. Their graphs are not PyTorch's: images arrive channels-last and are transposed
once, 1-D layers are 2-D ones between Unsqueeze and Squeeze, same-padding of strided convolutions
is a Pad node, batch normalization is folded into a Mul and an Add, Keras' UpSampling1D is a Split
into single rows concatenated twice each, shapes are computed at run time by Shape, Gather and
ReduceProd. tf2onnx 1.17 with TensorFlow 2.21 writes ConvNeXt's and RegNet's grouped
convolutions as TensorFlow's PartitionedCall, a file that neither ONNX Runtime nor korch loads.

Per file, as benchmarks/quantized_zoo.py: primitives, opaque operators, the primitive graph's error
against ONNX Runtime, the plan's kernels and backends, `plan.verify()`, medians of korch and ONNX
Runtime (interleaved) and their ratio. The export runs in an environment of its own (TensorFlow
pins its own numpy and protobuf): `python -m venv ENV && ENV/bin/pip install tensorflow-cpu tf-keras
tf2onnx`. Usage: `python benchmarks/tf2onnx_zoo.py [NAME ...] --tf-python ENV/bin/python --dir DIR
[--time-budget S] [--cache DB]`.
"""

from __future__ import annotations

import argparse
import subprocess
import time
from pathlib import Path

from quantized_zoo import MEASURED, measure

import korch

MODELS = (
    "MobileNet",
    "MobileNetV2",
    "MobileNetV3Small",
    "MobileNetV3Large",
    "EfficientNetB0",
    "EfficientNetV2B0",
    "ResNet50",
    "ResNet50V2",
    "DenseNet121",
    "InceptionV3",
    "Xception",
    "NASNetMobile",
    "text-lstm",
    "text-transformer",
    "conv1d",
    "unet",
)


def main() -> None:
    parser = exported_parser(__doc__, MODELS, "--tf-python", "a Python with tensorflow, tf-keras, tf2onnx")
    args = parser.parse_args()
    exporter = [args.tf_python, str(Path(__file__).with_name("keras_export.py"))]
    measure_exported(args.models, exporter, Path(args.dir), args.time_budget, args.cache, "tf2onnx")


def exported_parser(doc: str, models, python: str, needs: str) -> argparse.ArgumentParser:
    """The arguments of a zoo exported in an environment of its own: the Python flag, what it needs."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("models", nargs="*", default=list(models))
    parser.add_argument(python, required=True, help=needs)
    parser.add_argument("--dir", required=True, help="where the ONNX files go (kept between runs)")
    parser.add_argument(
        "--time-budget", type=float, default=60.0, metavar="S", help="profiling budget per file"
    )
    parser.add_argument("--cache", help="profile database (default: korch's)")
    return parser


def measure_exported(names, exporter: list[str], directory: Path, budget: float, cache, tool: str):
    """Export the models whose files `directory` lacks (`exporter` DIR NAME ... prints `ok NAME` or
    `fail NAME: why` per model, in an environment of its own), then print measure's row per file."""
    import onnxruntime

    directory.mkdir(parents=True, exist_ok=True)
    missing = [name for name in names if not (directory / f"{name}.onnx").exists()]
    failed = {}
    if missing:
        done = subprocess.run([*exporter, str(directory), *missing], capture_output=True, text=True)
        for line in done.stdout.splitlines():
            if line.startswith("fail "):
                name, why = line[5:].split(": ", 1)
                failed[name] = why
    width = max(18, *(len(name) + 1 for name in names))
    print(f"onnxruntime {onnxruntime.__version__}, korch {korch.__version__}, budget {budget:g} s")
    print(f"{'model':{width}s} {MEASURED} {'s':>5s}")
    for name in names:
        path = directory / f"{name}.onnx"
        if not path.exists():
            print(f"{name:{width}s} {tool} failed: {failed.get(name, 'no file written')}")
            continue
        started = time.perf_counter()
        try:
            line = measure(path, budget, cache)
        except korch.KorchError as e:
            line = f"korch: {e}"
        print(f"{name:{width}s} {line} {time.perf_counter() - started:5.1f}", flush=True)


if __name__ == "__main__":
    main()
