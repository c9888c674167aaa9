"""The vendor backend: one linear primitive as a single library call through PyTorch (oneDNN/MKL on
CPU, cuBLAS/cuDNN on CUDA), with the epilogue the library fuses into that call: a per-channel bias,
a residual add (convolutions), an activation. ONNX Runtime's MLAS is the onnxruntime backend."""

from __future__ import annotations

import functools
import math
import sys
from dataclasses import dataclass

import numpy as np
import torch
from torch.nn import functional as F

from korch.backends import Backend, CompiledKernel, source_digest, torch_ops
from korch.backends.torch_ops import apply
from korch.ir.graph import Graph, Node
from korch.ir.prims import Kind, Prim
from korch.ir.tensors import to_tensor
from korch.search.kernel import KernelSpec

NOT_LINEAR = "not a single linear primitive with an optional bias, residual add (convolutions) and activation"

# Activations as the importers spell them (korch.frontend.ops.elementwise), keyed by oneDNN's name
# with its algorithm: "x" is the activation's input, a float a constant of that value (in the
# kernel's dtype), any other string a constant passed to the library as a scalar.
X = "x"
_HARDSIGMOID = (Prim.MIN, (Prim.MAX, (Prim.ADD, (Prim.MUL, X, 1 / 6), 0.5), 0.0), 1.0)
_GELU_TANH_INNER = (Prim.ADD, X, (Prim.MUL, (Prim.MUL, (Prim.MUL, X, X), X), 0.044715))
ACTIVATIONS = {
    ("relu", None): (Prim.MAX, X, 0.0),
    ("hardtanh", None): (Prim.MIN, (Prim.MAX, X, "low"), "high"),
    ("sigmoid", None): (Prim.SIGMOID, X),
    ("tanh", None): (Prim.TANH, X),
    ("swish", None): (Prim.MUL, X, (Prim.SIGMOID, X)),
    ("hardsigmoid", None): _HARDSIGMOID,
    ("hardswish", None): (Prim.MUL, X, _HARDSIGMOID),
    ("leaky_relu", None): (Prim.WHERE, (Prim.LT, X, 0.0), (Prim.MUL, X, "slope"), X),
    ("gelu", "none"): (
        Prim.MUL,
        (Prim.MUL, X, (Prim.ADD, (Prim.ERF, (Prim.MUL, X, 1 / math.sqrt(2))), 1.0)),
        0.5,
    ),
    ("gelu", "tanh"): (
        Prim.MUL,
        (Prim.MUL, X, (Prim.ADD, (Prim.TANH, (Prim.MUL, _GELU_TANH_INNER, math.sqrt(2 / math.pi))), 1.0)),
        0.5,
    ),
}
_COMMUTATIVE = (Prim.ADD, Prim.MUL, Prim.MAX, Prim.MIN)
# what the fused calls take: oneDNN (CPU) unary epilogues of a convolution or a matmul, and with a
# residual add; cuDNN's convolution takes relu only; cuBLASLt's matmul relu or gelu's tanh form
_CPU_UNARY = {a for a, _ in ACTIVATIONS}
_CPU_AFTER_ADD = {None, "relu"}
_CUDA_MATMUL = {("relu", None), ("gelu", "tanh")}
_SCALARS = ("low", "high", "slope")  # the order oneDNN takes them in
_PROBE_SCALARS = {"hardtanh": (0.0, 6.0), "leaky_relu": (0.01,)}


@dataclass(frozen=True)
class Epilogue:
    """A vendor kernel: the linear primitive and what follows it, each part optional: `bias`, a
    per-channel bias; `residual`, a tensor of the output's shape added after it (convolutions);
    `act`, the activation by oneDNN's name, with its scalars and algorithm."""

    lin: Node
    bias: str | None = None
    residual: str | None = None
    act: str | None = None
    scalars: tuple[float, ...] = ()
    algorithm: str | None = None

    @property
    def fused(self) -> bool:
        """Whether more than the bias follows the linear primitive."""
        return self.residual is not None or self.act is not None


def _is_channel_bias(bias_shape, out_shape, axis: int) -> bool:
    """Right-aligned against the output, the bias has the output's size on `axis`, 1 elsewhere."""
    if len(bias_shape) > len(out_shape):
        return False
    padded = (1,) * (len(out_shape) - len(bias_shape)) + tuple(bias_shape)
    return all(d == (out_shape[i] if i == axis else 1) for i, d in enumerate(padded))


class _Walk:
    """The kernel's nodes by the values they write and read, and those taken into the pattern."""

    def __init__(self, g: Graph):
        self.g = g
        self.producer = {v: i for i, n in enumerate(g.nodes) for v in n.outputs}
        self.readers: dict[str, list[int]] = {}
        for i, n in enumerate(g.nodes):
            for v in dict.fromkeys(n.inputs):
                self.readers.setdefault(v, []).append(i)
        self.taken: set[int] = set()

    def sole_add(self, v: str) -> tuple[int, str] | None:
        """The add that alone reads `v` (no kernel output), and its other operand."""
        readers = self.readers.get(v, [])
        if len(readers) != 1 or v in self.g.outputs:
            return None
        n = self.g.nodes[readers[0]]
        if n.prim is not Prim.ADD or n.inputs[0] == n.inputs[1]:
            return None
        return readers[0], n.inputs[1] if n.inputs[0] == v else n.inputs[0]

    def bias(self, v: str, lin: Node) -> tuple[str, str] | None:
        """(bias, sum) where `v` plus a per-channel bias, perhaps through one broadcast, is next."""
        found = self.sole_add(v)
        if found is None:
            return None
        i, other = found
        source = self.producer.get(other)
        taken = {i}
        if source is not None:  # the bias arrives through one broadcast that only this add reads
            n = self.g.nodes[source]
            if n.prim is not Prim.BROADCAST or len(self.readers[other]) != 1 or other in self.g.outputs:
                return None
            other, taken = n.inputs[0], {i, source}
        out = self.g.types[v].shape
        axis = 1 if lin.prim is Prim.CONV else len(out) - 1
        if not _is_channel_bias(self.g.types[other].shape, out, axis):
            return None
        self.taken |= taken
        return other, self.g.nodes[i].outputs[0]

    def residual(self, v: str) -> tuple[str, str] | None:
        """(residual, sum) where `v` plus a kernel input or constant of its own type is next."""
        found = self.sole_add(v)
        if found is None:
            return None
        i, other = found
        if other in self.producer or self.g.types[other] != self.g.types[v]:
            return None
        self.taken.add(i)
        return other, self.g.nodes[i].outputs[0]

    def bind(self, pattern, v: str, x: str, taken: set[int], scalars: dict) -> bool:
        """Whether the value `v` is `pattern` applied to `x`; the nodes it takes are added to
        `taken`, the constants it names to `scalars`."""
        if pattern == X:
            return v == x
        if isinstance(pattern, (float, str)):
            c = self.g.constants.get(v)
            if c is None or c.size != 1 or str(c.dtype) != self.g.types[x].dtype:
                return False
            if isinstance(pattern, str):
                scalars[pattern] = float(c.reshape(()).astype(np.float64))
                return True
            return bool(np.asarray(pattern).astype(c.dtype) == c.reshape(()))
        prim, *args = pattern
        i = self.producer.get(v)
        if i is None or self.g.nodes[i].prim is not prim or len(self.g.nodes[i].inputs) != len(args):
            return False
        inputs = self.g.nodes[i].inputs
        for order in (args, args[::-1]) if prim in _COMMUTATIVE else (args,):
            trial, named = set(taken), dict(scalars)
            if all(self.bind(p, u, x, trial, named) for p, u in zip(order, inputs)):
                taken |= trial | {i}
                scalars.update(named)
                return True
        return False

    def activation(self, x: str):
        """((name, algorithm), scalars) of the activation that every node not yet taken computes
        from `x` into the kernel's one output, or None."""
        rest = set(range(len(self.g.nodes))) - self.taken
        if len(self.g.outputs) != 1 or self.g.types[self.g.outputs[0]] != self.g.types[x]:
            return None
        for act, pattern in ACTIVATIONS.items():
            taken, named = set(), {}
            if self.bind(pattern, self.g.outputs[0], x, taken, named) and taken == rest:
                if named.get("low", -math.inf) > named.get("high", math.inf):
                    return None  # (min(max(x, low), high) is high everywhere: no clip)
                return act, tuple(named[k] for k in _SCALARS if k in named)
        return None


def _match(g: Graph) -> Epilogue | None:
    """The kernel as one linear primitive with an optional per-channel bias (perhaps through a
    broadcast), then (a convolution's) an optional residual add, then an optional activation,
    each intermediate value read only by the next step and none of them an output; None when it
    is not. The single linear primitive alone, and with a bias, are taken whatever they are
    (but a transposed convolution only alone)."""
    linear = [i for i, n in enumerate(g.nodes) if n.kind is Kind.LINEAR]
    if len(linear) != 1 or g.nodes[linear[0]].prim is Prim.CONV_TRANSPOSE and len(g.nodes) > 1:
        return None
    lin = g.nodes[linear[0]]
    walk = _Walk(g)
    walk.taken.add(linear[0])
    v, bias, residual = lin.outputs[0], None, None
    found = walk.bias(v, lin)
    if found:
        bias, v = found
    if lin.prim is Prim.CONV and (found := walk.residual(v)):
        residual, v = found
    if len(walk.taken) == len(g.nodes):
        return Epilogue(lin, bias, residual) if g.outputs == (v,) else None
    if lin.prim not in (Prim.CONV, Prim.MATMUL):
        return None
    found = walk.activation(v)
    if found is None:
        return None
    (act, algorithm), scalars = found
    return Epilogue(lin, bias, residual, act, scalars, algorithm)


def _conv_args(a: dict) -> tuple[list[int], list[int], list[int], int] | None:
    """(padding, stride, dilation, groups) of a convolution whose padding is the same at both ends
    of every axis, else None."""
    pads, nd = list(a["pads"]), len(a["strides"])
    if pads[:nd] != pads[nd:]:
        return None
    return pads[:nd], list(a["strides"]), list(a["dilations"]), a["group"]


@functools.cache
def _onednn_runs(prim: Prim, residual: bool, act: str | None, algorithm: str | None, dtype: str) -> bool:
    """Whether oneDNN's fused call runs in `dtype` on this CPU (float16 needs AVX512-FP16 or
    AVX-NE-CONVERT; torch 2.13 fails an assertion on a bfloat16 convolution + add + relu): one
    tiny call, once per process."""
    t = getattr(torch, dtype)
    scalars = list(_PROBE_SCALARS.get(act, ()))
    try:
        if prim is Prim.MATMUL:
            x, w = torch.ones(2, 4, dtype=t), torch.ones(4, 3, dtype=t)
            torch.ops.mkldnn._linear_pointwise(x, w.t(), None, act, scalars, algorithm)
            return True
        x, w, r = (
            torch.ones(1, 2, 3, 3, dtype=t),
            torch.ones(2, 2, 1, 1, dtype=t),
            torch.ones(1, 2, 3, 3, dtype=t),
        )
        conv = [[0, 0], [1, 1], [1, 1], 1]
        if residual:
            torch.ops.mkldnn._convolution_pointwise.binary(
                x, r, w, None, *conv, "add", None, act, scalars, algorithm
            )
        else:
            torch.ops.mkldnn._convolution_pointwise(x, w, None, *conv, act, scalars, algorithm)
        return True
    except Exception:  # (a missing operator, or one that refuses the dtype on this CPU)
        return False


def _refusal(ep: Epilogue, g: Graph, device: str) -> str | None:
    """Why no fused library call runs the epilogue on the device, or None."""
    if not ep.fused:
        return None
    lin, dtype = ep.lin, g.types[ep.lin.outputs[0]].dtype
    what = f"{lin.prim.value} + {'bias + ' if ep.bias else ''}{'add + ' if ep.residual else ''}{ep.act or ''}"
    what = what.rstrip(" +")
    if dtype not in ("float32", "float16", "bfloat16"):
        return f"no fused {what} in {dtype}"
    if lin.prim is Prim.CONV and _conv_args(lin.a) is None:
        return f"no fused {what} with padding that differs at the two ends of an axis"
    if lin.prim is Prim.MATMUL and (g.types[lin.inputs[1]].rank != 2 or g.types[lin.inputs[0]].rank < 2):
        return f"no fused {what}: the weight is not a matrix"
    if device.startswith("cuda"):
        return _cuda_refusal(ep, g, what)
    if ep.act not in (_CPU_AFTER_ADD if ep.residual else _CPU_UNARY | {None}):
        return f"oneDNN has no fused {what}"
    if ep.residual and g.types[lin.inputs[1]].rank not in (4, 5):
        return f"oneDNN has no fused {what} but in 2 or 3 dimensions"
    if not _onednn_runs(lin.prim, ep.residual is not None, ep.act, ep.algorithm, dtype):
        return f"oneDNN's fused {what} does not run in {dtype} on this CPU"
    return None


def _cuda_refusal(ep: Epilogue, g: Graph, what: str) -> str | None:
    if ep.lin.prim is Prim.CONV:
        if ep.act != "relu" or g.types[ep.lin.inputs[1]].rank != 4:
            return f"cuDNN has no fused {what} (a 2-d convolution with relu only)"
        return None
    if ep.bias is None or (ep.act, ep.algorithm) not in _CUDA_MATMUL:
        return f"cuBLASLt has no fused {what} (bias + relu or gelu's tanh form only)"
    return None


class VendorBackend(Backend):
    name = "vendor"

    def version(self) -> str:
        return f"torch-{torch.__version__}+{source_digest(sys.modules[__name__], torch_ops)}"

    def supports(self, spec: KernelSpec, device: str) -> str | None:
        ep = _match(spec.graph)
        return NOT_LINEAR if ep is None else _refusal(ep, spec.graph, device)

    def compile(self, spec: KernelSpec, device: str) -> CompiledKernel:
        ep = _match(spec.graph)
        if ep is None or _refusal(ep, spec.graph, device):
            raise ValueError(self.supports(spec, device))
        fetch = _fetcher(spec.graph, device)
        if not ep.fused:
            return CompiledKernel(_plain(ep.lin, ep.bias, fetch), kernels=1)
        make = _cuda_fused if device.startswith("cuda") else _cpu_fused
        return CompiledKernel(make(ep, fetch), kernels=1)


def _fetcher(g: Graph, device: str):
    """fetch(value, inputs): a kernel input from the call's inputs, or a constant."""
    position = {v: i for i, v in enumerate(g.inputs)}
    # on the device once: a copy from host memory in every call would wait for the device's
    # queue and cannot be captured in a CUDA graph
    constants = {v: to_tensor(c, device) for v, c in g.constants.items()}

    def fetch(v, inputs):
        return inputs[position[v]] if v in position else constants[v]

    return fetch


def _plain(lin: Node, bias_source: str | None, fetch):
    """The linear primitive with an optional bias: one library call where torch has it."""
    a = lin.a

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

    return fn


def _operands(ep: Epilogue, fetch, inputs):
    x, w = fetch(ep.lin.inputs[0], inputs), fetch(ep.lin.inputs[1], inputs)
    bias = None if ep.bias is None else fetch(ep.bias, inputs).reshape(-1)
    return x, w, bias, None if ep.residual is None else fetch(ep.residual, inputs)


def _cpu_fused(ep: Epilogue, fetch):
    """oneDNN's convolution or inner product with its post-ops, one call."""
    mkldnn, act, scalars, algorithm = torch.ops.mkldnn, ep.act or "none", list(ep.scalars), ep.algorithm
    if ep.lin.prim is Prim.MATMUL:

        def linear(*inputs: torch.Tensor) -> list[torch.Tensor]:
            x, w, bias, _ = _operands(ep, fetch, inputs)
            return [mkldnn._linear_pointwise(x, w.t(), bias, act, scalars, algorithm)]

        return linear
    conv = _conv_args(ep.lin.a)

    def convolution(*inputs: torch.Tensor) -> list[torch.Tensor]:
        x, w, bias, r = _operands(ep, fetch, inputs)
        if r is None:
            return [mkldnn._convolution_pointwise(x, w, bias, *conv, act, scalars, algorithm)]
        return [
            mkldnn._convolution_pointwise.binary(
                x, r, w, bias, *conv, "add", None, ep.act, scalars, algorithm
            )
        ]

    return convolution


def _cuda_fused(ep: Epilogue, fetch):
    """cuDNN's convolution + bias (+ add) + relu, or cuBLASLt's matmul + bias + relu or gelu."""
    if ep.lin.prim is Prim.MATMUL:
        gelu = ep.act == "gelu"

        def linear(*inputs: torch.Tensor) -> list[torch.Tensor]:
            x, w, bias, _ = _operands(ep, fetch, inputs)
            y = torch._addmm_activation(bias, x.reshape(-1, x.shape[-1]), w, use_gelu=gelu)
            return [y.reshape(*x.shape[:-1], w.shape[-1])]

        return linear
    padding, stride, dilation, groups = _conv_args(ep.lin.a)

    def convolution(*inputs: torch.Tensor) -> list[torch.Tensor]:
        x, w, bias, r = _operands(ep, fetch, inputs)
        if r is None:
            return [torch.cudnn_convolution_relu(x, w, bias, stride, padding, dilation, groups)]
        return [torch.cudnn_convolution_add_relu(x, w, r, None, bias, stride, padding, dilation, groups)]

    return convolution
