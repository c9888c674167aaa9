"""Each primitive as PyTorch operations: traced into aten graphs for Inductor, or run eagerly."""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence

import numpy as np
import torch
from torch.nn import functional as F

from korch.ir.graph import Graph
from korch.ir.prims import Prim
from korch.ir.tensors import DTYPES, to_tensor


def _div(a, b):
    if a.dtype.is_floating_point:
        return torch.div(a, b)
    return torch.div(a, b, rounding_mode="trunc")


def _pow(a, b):
    if a.dtype.is_floating_point:
        return torch.pow(a, b)
    return torch.pow(a.double(), b.double()).trunc().to(a.dtype)


def _reduce(x, a, fn):
    return fn(x, dim=list(a["axes"]), keepdim=True) if a["axes"] else x


def _reduce_prod(x, a):
    for axis in a["axes"]:
        x = torch.prod(x, dim=axis, keepdim=True)
    return x


def _slice(x, a):
    for axis, (start, step, size) in enumerate(zip(a["starts"], a["steps"], a["sizes"])):
        if size == 0:
            x = x.narrow(axis, 0, 0)
        elif step > 0:
            index = [slice(None)] * x.dim()
            index[axis] = slice(start, start + (size - 1) * step + 1, step)
            x = x[tuple(index)]
        else:  # torch slicing has no negative steps
            x = x.index_select(axis, torch.arange(size, device=x.device) * step + start)
    return x


@functools.lru_cache(maxsize=256)
def _pad_index(device: torch.device, size: int, before: int, after: int, mode: str) -> torch.Tensor:
    """The source of every position of an axis padded by reflection or by its edge, made once per
    device: a copy from host memory in every call would wait for the device's queue and cannot be
    captured in a CUDA graph."""
    return torch.as_tensor(np.pad(np.arange(size), (before, after), mode=mode), device=device)


def _torch_pads(pads) -> list[int]:
    """ONNX's pads (every axis's begin, then every axis's end) in F.pad's order: the last axis's
    (begin, end) first."""
    nd = len(pads) // 2
    return [p for i in reversed(range(nd)) for p in (pads[i], pads[nd + i])]


def _pad(x, a):
    rank = x.dim()
    begins, ends = a["pads"][:rank], a["pads"][rank:]
    if a["mode"] == "constant":
        return F.pad(x, _torch_pads(a["pads"]), value=a["value"])
    mode = "reflect" if a["mode"] == "reflect" else "edge"
    for axis in range(rank):
        if begins[axis] or ends[axis]:
            # a tracer's fake tensor must not be cached: made afresh, uncached
            make = _pad_index if type(x) is torch.Tensor else _pad_index.__wrapped__
            x = x.index_select(axis, make(x.device, x.shape[axis], begins[axis], ends[axis], mode))
    return x


def _gather(data, idx, a):
    axis = a["axis"]
    idx = torch.where(idx < 0, idx + data.shape[axis], idx)
    out = data.index_select(axis, idx.reshape(-1))
    return out.reshape(data.shape[:axis] + idx.shape + data.shape[axis + 1 :])


def _window(x, a):
    rank = x.dim()
    k = len(a["kernel"])
    for i, (kk, s, d) in enumerate(zip(a["kernel"], a["strides"], a["dilations"])):
        x = x.unfold(rank - k + i, (kk - 1) * d + 1, s)
    dilate = [slice(None)] * rank + [slice(None, None, d) for d in a["dilations"]]
    return x[tuple(dilate)]


_SCATTER_REDUCE = {"mul": "prod", "max": "amax", "min": "amin"}


def _scatter(data, index, updates, reduction: str):
    index = index.long()
    if reduction in ("none", "add"):
        return data.index_put((index,), updates, accumulate=reduction == "add")
    rows = index.view(-1, *[1] * (updates.dim() - 1)).expand_as(updates)
    return data.scatter_reduce(0, rows, updates, _SCATTER_REDUCE[reduction], include_self=True)


def _grouped_matmul(x, w, ends):
    """On the CPU each group's rows by their matmul where the ends are sorted (torch's own grouped
    kernel where it takes the operands: faster than a matmul per group), by a mask of rows
    per group elsewhere. On a GPU, where reading the ends on the host would keep the plan from
    replaying as a CUDA graph, on the device (`grouped_matmul_on_device`). Traced for Inductor,
    where the ends are not known: torch._grouped_mm on the device where it takes the operands
    (the ends' clamp and the mask then fuse into Inductor's code, faster than through Python),
    else one call of the operator korch::grouped_matmul, which runs this function on the real
    tensors (Inductor calls it as it calls a vendor library)."""
    from torch._subclasses.fake_tensor import is_fake

    if is_fake(x):
        if _grouped_mm_on_device_takes(x, w):
            return grouped_matmul_on_device(x, w, ends)
        return torch.ops.korch.grouped_matmul(x, w, ends)
    if x.is_cuda:
        return grouped_matmul_on_device(x, w, ends)
    rows = x.shape[0]
    bounds = [0, *ends.tolist()]
    if all(0 <= a <= b <= rows for a, b in zip(bounds, bounds[1:])):
        if _grouped_mm_takes(x, w):
            out = torch._grouped_mm(x, w, offs=ends.to(torch.int32))
            if bounds[-1] < rows:  # (torch leaves the rows past the last group as they were)
                out[bounds[-1] :] = 0
            return out
        out = x.new_zeros(rows, w.shape[2])
        for e, (first, end) in enumerate(zip(bounds, bounds[1:])):
            if end > first:
                torch.matmul(x[first:end], w[e], out=out[first:end])
        return out
    out = x.new_zeros(rows, w.shape[2])
    group = _groups(x, ends)
    for e in range(w.shape[0]):
        mine = (group == e).nonzero().squeeze(1)
        out[mine] = x[mine] @ w[e]
    return out


# korch::grouped_matmul, a grouped matmul as Inductor calls it: _grouped_matmul on real tensors, an
# empty [S, N] while tracing (torch.library.custom_op's wrapper costs more a call).
_LIBRARY = torch.library.Library("korch", "DEF")
_LIBRARY.define("grouped_matmul(Tensor x, Tensor w, Tensor ends) -> Tensor")
_LIBRARY.impl("grouped_matmul", _grouped_matmul, "CompositeExplicitAutograd")
_LIBRARY.impl("grouped_matmul", lambda x, w, ends: x.new_empty(x.shape[0], w.shape[2]), "Meta")


def _grouped_mm_takes(x, w) -> bool:
    """Whether torch._grouped_mm runs these operands: bfloat16 or float32 (the torch korch pins
    takes both on the CPU), rows contiguous, every other stride a multiple of 16 bytes."""
    if not hasattr(torch, "_grouped_mm") or x.dtype not in (torch.bfloat16, torch.float32):
        return False
    strides = [s * t.element_size() for t in (x, w) for s in t.stride()[:-1]]
    return x.stride(-1) == w.stride(-1) == 1 and all(s % 16 == 0 for s in strides)


def grouped_mm_on_device(dtype: torch.dtype, device: torch.device | str) -> bool:
    """Whether torch._grouped_mm runs a grouped matmul of `dtype` without reading its ends on the
    host: bfloat16 only (what its tracing rules and CUDA kernels take), on a CPU or on a GPU of
    compute capability 9 or 10 (elsewhere torch's CUDA fallback copies the ends to the host)."""
    device = torch.device(device)
    if not hasattr(torch, "_grouped_mm") or dtype != torch.bfloat16:
        return False
    return (
        device.type == "cpu"
        or device.type == "cuda"
        and torch.cuda.get_device_capability(device)[0] in (9, 10)
    )


def _grouped_mm_on_device_takes(x, w) -> bool:
    return grouped_mm_on_device(x.dtype, x.device) and _grouped_mm_takes(x, w)


def grouped_matmul_on_device(x, w, ends):
    """The grouped matmul without a host sync. torch._grouped_mm where it takes the operands:
    its ends must be sorted, within the rows, as every source of this primitive promises (torch's
    own _grouped_mm, transformers' grouped_mm_fallback); here they are clamped to the rows and
    made non-decreasing, so other ends give a wrong result (which a kernel's check refuses), never
    a read out of bounds. Elsewhere every group's product for every row, masked (E times the work)."""
    if not _grouped_mm_on_device_takes(x, w):
        return grouped_matmul_dense(x, w, ends)
    rows = x.shape[0]
    offs = torch.cummax(ends.clamp(0, rows), 0).values.to(torch.int32)
    out = torch._grouped_mm(x, w, offs=offs)
    grouped = torch.arange(rows, device=x.device) < offs[-1]  # (torch leaves the rest unwritten)
    return torch.where(grouped.unsqueeze(1), out, 0)


def grouped_matmul_dense(x, w, ends):
    """The grouped matmul without a host sync: every group's product for every row, masked."""
    mine = _groups(x, ends) == torch.arange(w.shape[0], device=x.device).reshape(-1, 1)
    return torch.matmul(torch.where(mine.unsqueeze(-1), x, 0), w).sum(0)


def _groups(x, ends):
    """Each row's group: how many ends are <= the row (the number of groups past the last end)."""
    return (ends.reshape(-1, 1) <= torch.arange(x.shape[0], device=x.device)).sum(0)


def _conv(x, w, a):
    nd = w.dim() - 2
    pads = a["pads"]
    if tuple(pads[:nd]) == tuple(pads[nd:]):
        padding = list(pads[:nd])
    else:
        x = F.pad(x, _torch_pads(pads))
        padding = [0] * nd
    conv = (F.conv1d, F.conv2d, F.conv3d)[nd - 1]
    return conv(x, w, None, list(a["strides"]), padding, list(a["dilations"]), a["group"])


def _conv_transpose(x, w, a):
    nd = w.dim() - 2
    pads = a["pads"]
    conv = (F.conv_transpose1d, F.conv_transpose2d, F.conv_transpose3d)[nd - 1]
    y = conv(x, w, None, list(a["strides"]), 0, list(a["output_padding"]), a["group"], list(a["dilations"]))
    crop = [slice(None), slice(None)] + [slice(pads[i], y.shape[2 + i] - pads[nd + i]) for i in range(nd)]
    return y[tuple(crop)]


Lowering = Callable[[Sequence[torch.Tensor], dict], torch.Tensor]  # (operands, attributes) -> result


def _unary(fn: Callable) -> Lowering:
    return lambda xs, a: fn(xs[0])


def _binary(fn: Callable) -> Lowering:
    return lambda xs, a: fn(xs[0], xs[1])


def _sum(x, **kw):
    return torch.sum(x, dtype=x.dtype, **kw)


# each primitive as torch operations, with the numpy reference's semantics (korch.ir.prims.DEFS);
# OPAQUE has none: ONNX Runtime runs it (tests/ir/test_primitive_table.py lists every primitive's lowerings)
LOWERINGS: dict[Prim, Lowering] = {
    Prim.NEG: _unary(torch.neg),
    Prim.ABS: _unary(torch.abs),
    Prim.EXP: _unary(torch.exp),
    Prim.LOG: _unary(torch.log),
    Prim.SQRT: _unary(torch.sqrt),
    Prim.RECIPROCAL: _unary(torch.reciprocal),
    Prim.ERF: _unary(torch.erf),
    Prim.TANH: _unary(torch.tanh),
    Prim.SIGMOID: _unary(torch.sigmoid),
    Prim.FLOOR: _unary(torch.floor),
    Prim.CEIL: _unary(torch.ceil),
    Prim.ROUND: _unary(torch.round),
    Prim.SIN: _unary(torch.sin),
    Prim.COS: _unary(torch.cos),
    Prim.ATAN: _unary(torch.atan),
    Prim.SIGN: _unary(torch.sign),
    Prim.NOT: _unary(torch.logical_not),
    Prim.CAST: lambda xs, a: xs[0].to(DTYPES[a["to"]]),
    Prim.ADD: _binary(torch.add),
    Prim.SUB: _binary(torch.sub),
    Prim.MUL: _binary(torch.mul),
    Prim.DIV: _binary(_div),
    Prim.POW: _binary(_pow),
    Prim.MAX: _binary(torch.maximum),
    Prim.MIN: _binary(torch.minimum),
    Prim.EQ: _binary(torch.eq),
    Prim.LT: _binary(torch.lt),
    Prim.GT: _binary(torch.gt),
    Prim.AND: _binary(torch.logical_and),
    Prim.OR: _binary(torch.logical_or),
    Prim.XOR: _binary(torch.logical_xor),
    Prim.WHERE: lambda xs, a: torch.where(xs[0], xs[1], xs[2]),
    Prim.BROADCAST: lambda xs, a: xs[0].expand(tuple(a["shape"])),
    Prim.REDUCE_SUM: lambda xs, a: _reduce(xs[0], a, _sum),
    Prim.REDUCE_MAX: lambda xs, a: _reduce(xs[0], a, torch.amax),
    Prim.REDUCE_MIN: lambda xs, a: _reduce(xs[0], a, torch.amin),
    Prim.REDUCE_PROD: lambda xs, a: _reduce_prod(xs[0], a),
    Prim.ARGMAX: lambda xs, a: torch.argmax(xs[0], dim=a["axis"], keepdim=True),
    Prim.ARGMIN: lambda xs, a: torch.argmin(xs[0], dim=a["axis"], keepdim=True),
    Prim.ARGSORT: lambda xs, a: torch.argsort(xs[0], dim=a["axis"], descending=a["descending"], stable=True),
    Prim.RESHAPE: lambda xs, a: xs[0].reshape(tuple(a["shape"])),
    Prim.TRANSPOSE: lambda xs, a: xs[0].permute(tuple(a["perm"])),
    Prim.SLICE: lambda xs, a: _slice(xs[0], a),
    Prim.CONCAT: lambda xs, a: torch.cat(list(xs), dim=a["axis"]),
    Prim.PAD: lambda xs, a: _pad(xs[0], a),
    Prim.GATHER: lambda xs, a: _gather(xs[0], xs[1], a),
    Prim.WINDOW: lambda xs, a: _window(xs[0], a),
    Prim.SCATTER: lambda xs, a: _scatter(xs[0], xs[1], xs[2], a["reduction"]),
    Prim.MATMUL: _binary(torch.matmul),
    Prim.GROUPED_MATMUL: lambda xs, a: _grouped_matmul(xs[0], xs[1], xs[2]),
    Prim.CONV: lambda xs, a: _conv(xs[0], xs[1], a),
    Prim.CONV_TRANSPOSE: lambda xs, a: _conv_transpose(xs[0], xs[1], a),
}


def apply(prim: Prim, xs: Sequence[torch.Tensor], a: dict) -> list[torch.Tensor]:
    """One primitive on torch tensors, with the numpy reference's semantics."""
    lowering = LOWERINGS.get(prim)
    if lowering is None:
        raise NotImplementedError(f"no torch lowering for {prim.value}")
    return [lowering(xs, a)]


def _pool(x: torch.Tensor, pool) -> torch.Tensor:
    """A MaxPool or AveragePool (padding counted) found by korch.backends.onnx_patterns, as aten's
    pool: pads torch's pools cannot take (uneven, or over half the kernel) are made explicitly."""
    a = pool.attrs
    nd = len(a["kernel_shape"])
    kernel, strides, pads = list(a["kernel_shape"]), list(a["strides"]), list(a["pads"])
    dilations = list(a.get("dilations", [1] * nd))
    maxing = pool.op == "MaxPool"
    limits = [((k - 1) * d + 1) // 2 if maxing else k // 2 for k, d in zip(kernel, dilations)]
    padding = pads[:nd]
    if pads[:nd] != pads[nd:] or any(p > lim for p, lim in zip(padding, limits)):
        x, padding = F.pad(x, _torch_pads(pads), value=float("-inf") if maxing else 0.0), [0] * nd
    if maxing:
        fn = (F.max_pool1d, F.max_pool2d, F.max_pool3d)[nd - 1]
        return fn(x, kernel, strides, padding, dilations)
    fn = (F.avg_pool1d, F.avg_pool2d, F.avg_pool3d)[nd - 1]
    return fn(x, kernel, strides, padding, count_include_pad=True)


def graph_function(graph: Graph, device: str = "cpu") -> Callable[..., list[torch.Tensor]]:
    """A Python function running the graph with torch ops: f(*inputs) -> outputs (all tensors).
    A pool's primitives (pad, window, reduce) run as aten's pool: Inductor compiles a window and
    its reduction as a loop over the window for every output element, or falls back to aten's
    pool for a large one: large max pools run many times slower as primitives than as pools."""
    from korch.backends.onnx_patterns import POOLS, fuse

    constants = {k: to_tensor(v, device) for k, v in graph.constants.items()}
    pools = fuse(graph, patterns=POOLS) if any(n.prim is Prim.WINDOW for n in graph.nodes) else {}
    inside = set().union(*(p.absorbed - {root} for root, p in pools.items()))  # (only the pool reads them)

    def run(*inputs: torch.Tensor) -> list[torch.Tensor]:
        env = dict(constants)
        env.update(zip(graph.inputs, inputs))
        for i, node in enumerate(graph.nodes):
            if i in pools:
                outs = [_pool(env[pools[i].inputs[0]], pools[i])]
            elif i not in inside:
                outs = apply(node.prim, [env[v] for v in node.inputs], node.a)
            else:
                continue
            env.update(zip(node.outputs, outs))
        return [env[v] for v in graph.outputs]

    return run
