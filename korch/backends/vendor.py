"""The vendor backend: one linear primitive, with a bias epilogue, as a single library call through
PyTorch (oneDNN/MKL on CPU, cuBLAS/cuDNN on CUDA). ONNX Runtime's MLAS is the onnxruntime backend."""

from __future__ import annotations

import sys

import torch
from torch.nn import functional as F

from korch.backends import Backend, CompiledKernel, source_digest, torch_ops
from korch.backends.torch_ops import apply
from korch.ir.prims import Kind, Prim
from korch.ir.tensors import to_tensor
from korch.search.kernel import KernelSpec


def _is_channel_bias(bias_shape, out_shape, axis: int) -> bool:
    """Right-aligned against the output, the bias has the output's size on `axis`, 1 elsewhere."""
    if len(bias_shape) > len(out_shape):
        return False
    padded = (1,) * (len(out_shape) - len(bias_shape)) + tuple(bias_shape)
    return all(d == (out_shape[i] if i == axis else 1) for i, d in enumerate(padded))


def _bias_pattern(spec: KernelSpec):
    """(linear node, bias input or None) for {linear}, {linear, add(bias)}, {linear, broadcast, add}."""
    g = spec.graph
    linear = [n for n in g.nodes if n.kind is Kind.LINEAR]
    if len(linear) != 1 or linear[0].prim is Prim.CONV_TRANSPOSE and len(g.nodes) > 1:
        return None
    lin = linear[0]
    if len(g.nodes) == 1:
        return lin, None
    add = g.nodes[-1]
    if add.prim is not Prim.ADD or lin.outputs[0] not in add.inputs or g.outputs != add.outputs:
        return None
    other = add.inputs[1] if add.inputs[0] == lin.outputs[0] else add.inputs[0]
    rest = [n for n in g.nodes if n is not lin and n is not add]
    if rest:  # the bias arrives through one broadcast
        if len(rest) != 1 or rest[0].prim is not Prim.BROADCAST or rest[0].outputs[0] != other:
            return None
        other = rest[0].inputs[0]
    out = g.types[lin.outputs[0]].shape
    axis = 1 if lin.prim is Prim.CONV else len(out) - 1
    return (lin, other) if _is_channel_bias(g.types[other].shape, out, axis) else None


class VendorBackend(Backend):
    name = "vendor"

    def version(self) -> str:
        return f"torch-{torch.__version__}+{source_digest(sys.modules[__name__], torch_ops)}"

    def supports(self, spec: KernelSpec, device: str) -> str | None:
        return None if _bias_pattern(spec) else "not a single linear primitive with an optional bias"

    def compile(self, spec: KernelSpec, device: str) -> CompiledKernel:
        lin, bias_source = _bias_pattern(spec)
        g = spec.graph
        position = {v: i for i, v in enumerate(g.inputs)}
        a = lin.a
        # on the device once: a copy from host memory in every call would wait for the device's
        # queue and cannot be captured in a CUDA graph
        constants = {v: to_tensor(c, device) for v, c in g.constants.items()}

        def fetch(v, inputs):
            return inputs[position[v]] if v in position else constants[v]

        def fn(*inputs: torch.Tensor) -> list[torch.Tensor]:
            x, w = fetch(lin.inputs[0], inputs), fetch(lin.inputs[1], inputs)
            bias = None if bias_source is None else fetch(bias_source, inputs).reshape(-1)
            if lin.prim is Prim.CONV and bias is not None and len(set(a["pads"])) <= 1:
                nd = w.dim() - 2
                conv = (F.conv1d, F.conv2d, F.conv3d)[nd - 1]
                pad = a["pads"][0] if a["pads"] else 0
                return [conv(x, w, bias, list(a["strides"]), pad, list(a["dilations"]), a["group"])]
            if lin.prim is Prim.MATMUL and bias is not None and x.dim() >= 2 and w.dim() == 2:
                return [F.linear(x, w.t(), bias)]
            (y,) = apply(lin.prim, [x, w, *(fetch(v, inputs) for v in lin.inputs[2:])], a)
            if bias is not None:
                shape = [1] * y.dim()
                shape[1 if lin.prim is Prim.CONV else -1] = -1
                y = y + bias.reshape(shape)
            return [y]

        return CompiledKernel(fn, kernels=1)
