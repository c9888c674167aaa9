"""The model zoo: the paper's five models plus BERT, ViT and ResNet-50, exported offline to ONNX.

Weights are random (seeded), input sizes are chosen to run in seconds on two CPU cores, and the
files are built on demand into a cache directory rather than committed."""

from __future__ import annotations

import os
import tempfile
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from korch.errors import KorchError, cannot_create
from korch.ir.serialize import new_file_mode

ZOO_VERSION = 2  # bump when a definition changes so cached files are rebuilt


@dataclass(frozen=True)
class ZooModel:
    description: str
    make: Callable[[], object]  # -> torch.nn.Module
    inputs: tuple[tuple[str, tuple[int, ...], str], ...]  # (name, shape, dtype)
    opset: int
    outputs: tuple[str, ...] = ("output",)


def _vision(name, fn_name, opset, size=224, outputs=("output",), desc=""):
    def make():
        from korch.cli.zoo import attention, vision

        module = getattr(vision, fn_name, None) or getattr(attention, fn_name)
        return module()

    return ZooModel(desc, make, (("image", (1, 3, size, size), "float32"),), opset, outputs)


MODELS: dict[str, ZooModel] = {
    "candy": _vision("candy", "candy", 13, 224, desc="fast neural style transfer (Candy), 224x224"),
    "segformer-b0": _vision("segformer-b0", "Segformer", 17, 256, desc="Segformer-b0 segmentation, 256x256"),
    "yolox-nano": _vision("yolox-nano", "YoloxNano", 14, 416, desc="YOLOX-nano detector, 416x416"),
    "yolov4": _vision("yolov4", "YoloV4", 18, 320, ("p3", "p4", "p5"), desc="YOLOv4 detector, 320x320"),
    "efficientvit-b1": _vision(
        "efficientvit-b1",
        "EfficientViT",
        17,
        224,
        desc="EfficientViT-B1 (MIT linear attention) classifier, 224x224",
    ),
    "bert-base": ZooModel(
        "BERT-base encoder, sequence length 128",
        lambda: __import__("korch.cli.zoo.attention", fromlist=["Bert"]).Bert(),
        (
            ("input_ids", (1, 128), "int64"),
            ("attention_mask", (1, 128), "int64"),
            ("token_type_ids", (1, 128), "int64"),
        ),
        14,
        ("last_hidden_state", "pooled"),
    ),
    "vit-b16": _vision("vit-b16", "ViT", 18, 224, desc="ViT-B/16 classifier, 224x224"),
    "resnet50": _vision("resnet50", "resnet50", 13, 224, desc="ResNet-50 classifier, 224x224"),
}


def default_dir() -> Path:
    return Path(os.path.expanduser("~/.cache/korch/zoo"))


def _randomize_norms(module) -> None:
    """Random affine parameters and running statistics, so normalizations are not identities."""
    import torch

    gen = torch.Generator().manual_seed(1)
    for m in module.modules():
        norm = isinstance(m, (torch.nn.BatchNorm2d, torch.nn.LayerNorm, torch.nn.InstanceNorm2d))
        if norm and getattr(m, "weight", None) is not None:
            m.weight.data = 1 + 0.1 * torch.randn(m.weight.shape, generator=gen)
            m.bias.data = 0.1 * torch.randn(m.bias.shape, generator=gen)
        if isinstance(m, torch.nn.BatchNorm2d):
            m.running_mean = 0.1 * torch.randn(m.running_mean.shape, generator=gen)
            m.running_var = 0.5 + torch.rand(m.running_var.shape, generator=gen)


def example_inputs(name: str) -> tuple:
    import torch

    spec = MODELS[name]
    gen = torch.Generator().manual_seed(0)
    out = []
    for _, shape, dtype in spec.inputs:
        if dtype == "int64":
            out.append(torch.randint(0, 2, shape, generator=gen))
        else:
            out.append(torch.randn(shape, generator=gen))
    return tuple(out)


def make_module(name: str):
    import torch

    if name not in MODELS:
        raise KorchError(f"unknown zoo model {name!r}; known: {', '.join(MODELS)}")
    torch.manual_seed(0)
    module = MODELS[name].make()
    _randomize_norms(module)
    return module.eval()


def build(name: str, directory: str | os.PathLike | None = None, force: bool = False) -> Path:
    """Export the model to DIRECTORY/NAME-vN.onnx unless it is already there; returns the path."""
    import torch

    if name not in MODELS:
        raise KorchError(f"unknown zoo model {name!r}; known: {', '.join(MODELS)}")
    directory = Path(directory or default_dir())
    path = directory / f"{name}-v{ZOO_VERSION}.onnx"
    if path.is_file() and not force:
        return path
    tmp = _temporary_file(directory, name)  # before the model: a bad --dir costs no build
    spec = MODELS[name]
    try:
        module = make_module(name)
        with warnings.catch_warnings(), torch.no_grad():
            warnings.simplefilter("ignore")
            torch.onnx.export(
                module,
                example_inputs(name),
                tmp,
                dynamo=False,
                opset_version=spec.opset,
                input_names=[i[0] for i in spec.inputs],
                output_names=list(spec.outputs),
                do_constant_folding=True,
            )
        _tag(tmp, name)
        os.replace(tmp, path)
    finally:
        Path(tmp).unlink(missing_ok=True)
    return path


def _temporary_file(directory: Path, name: str) -> str:
    """A new file in DIRECTORY (made if missing) to export into, or one line saying why not."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{name}.", suffix=".onnx")
    except OSError as e:
        raise KorchError(
            f"cannot write to the zoo directory {directory}: {cannot_create(directory, e)}"
        ) from None
    os.close(fd)
    os.chmod(tmp, new_file_mode())
    return tmp


def _tag(path: str, name: str) -> None:
    """Record which zoo model (and definition version) a file holds, so `korch bench` can rebuild
    the same PyTorch module as a peer."""
    import onnx

    model = onnx.load(path)
    onnx.helper.set_model_props(model, {"korch.zoo": name, "korch.zoo_version": str(ZOO_VERSION)})
    onnx.save(model, path)
