"""Device ceilings (copy bandwidth, fp32 matmul FLOP/s) measured once, and each kernel's work."""

from __future__ import annotations

import functools
import math
import time

from korch.ir import Node
from korch.prims import Prim, TensorType


def _best_seconds(fn, device: str, repeats: int) -> float:
    from korch.backends import synchronize

    fn()  # warm-up: allocation, thread pool, cuBLAS handles
    best = math.inf
    for _ in range(repeats):
        synchronize(device)
        start = time.perf_counter()
        fn()
        synchronize(device)
        best = min(best, time.perf_counter() - start)
    return best


@functools.cache
def measure_ceilings(device: str = "cpu") -> dict:
    """{"bandwidth_gbs", "gflops", "seconds"}: the best of a few runs of a large copy (bytes read
    plus bytes written) and of a large fp32 matmul. A few hundred milliseconds on a small CPU,
    once per process and device (callers must not modify the result)."""
    import torch

    started = time.perf_counter()
    big = device.startswith("cuda")
    n = (256 if big else 16) * 2**20  # fp32 elements: 1 GiB on a GPU, 64 MiB on a CPU
    src = torch.ones(n, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    copy_s = _best_seconds(lambda: dst.copy_(src), device, 3)
    m = 8192 if big else 1024
    a = torch.randn(m, m, dtype=torch.float32, device=device)
    b = torch.randn(m, m, dtype=torch.float32, device=device)
    mm_s = _best_seconds(lambda: torch.mm(a, b), device, 2)
    return {
        "bandwidth_gbs": round(2 * 4 * n / copy_s / 1e9, 3),
        "gflops": round(2 * m**3 / mm_s / 1e9, 3),
        "seconds": round(time.perf_counter() - started, 3),
    }


def node_flops(node: Node, types) -> int:
    """Multiply-adds counted as two FLOPs, for linear primitives only (0 for anything else)."""
    if node.prim in (Prim.MATMUL, Prim.GROUPED_MATMUL):
        a, out = types[node.inputs[0]], types[node.outputs[0]]
        return 2 * out.numel * a.shape[-1]
    if node.prim is Prim.CONV:
        w, out = types[node.inputs[1]], types[node.outputs[0]]
        return 2 * out.numel * math.prod(w.shape[1:])
    if node.prim is Prim.CONV_TRANSPOSE:
        x, w = types[node.inputs[0]], types[node.inputs[1]]
        return 2 * x.numel * math.prod(w.shape[1:])
    return 0


def traffic_bytes(types: list[TensorType]) -> int:
    return sum(t.nbytes for t in types)
