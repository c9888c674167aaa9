"""Device ceilings (copy bandwidth, matmul FLOP/s) measured once, and each kernel's work."""

from __future__ import annotations

import functools
import time

from korch.ir.graph import Node
from korch.ir.prims import HALF_DTYPES, TensorType
from korch.ir.work import node_flops


def _best_seconds(fn, device: str, repeats: int) -> float:
    # (here, as torch is: the kernels' work is counted by modules that never import torch)
    from korch.measure.timing import elapsed_ms, repeat, warm_up

    warm_up(fn, device, calls=1)  # allocation, thread pool, cuBLAS handles
    return min(repeat(functools.partial(elapsed_ms, fn, device), 0.0, at_least=repeats)) / 1e3


SIZED = "bandwidth_gbs@"  # a ceiling's name prefix: the copy rate at this many bytes (read plus written)


@functools.cache
def measure_ceilings(device: str = "cpu", half: tuple[str, ...] = ()) -> dict:
    """{"bandwidth_gbs", "gflops", "seconds"}: the best of a few runs of a large copy (bytes read
    plus bytes written) and of a large fp32 matmul, "bandwidth_gbs@<bytes>" for smaller copies
    (cache-resident ones run many times faster per byte), and "gflops_<dtype>" for each dtype in
    `half` (float16, bfloat16: tensor cores, AMX). Timed once per process, device and dtypes
    (callers must not modify the result)."""
    import torch

    started = time.perf_counter()
    big = device.startswith("cuda")
    n = (256 if big else 16) * 2**20  # fp32 elements: 1 GiB on a GPU, 64 MiB on a CPU
    out = {"bandwidth_gbs": _copy_gbs(n, device, 1)}
    out[f"{SIZED}{2 * 4 * n}"] = out["bandwidth_gbs"]  # (near its size its rate, not a cached copy's, holds)
    for small in (2**18, 2**20, 2**22) if big else (2**12, 2**14, 2**16, 2**18, 2**20):
        out[f"{SIZED}{2 * 4 * small}"] = _copy_gbs(small, device, max(1, 2**20 // small))
    m = 8192 if big else 1024
    a = torch.randn(m, m, dtype=torch.float32, device=device)
    b = torch.randn(m, m, dtype=torch.float32, device=device)
    out["gflops"] = _matmul_gflops(a, b, device)
    for dtype in half:
        wanted = getattr(torch, dtype)
        out[f"gflops_{dtype}"] = _matmul_gflops(a.to(wanted), b.to(wanted), device)
    return {**out, "seconds": round(time.perf_counter() - started, 3)}


def _copy_gbs(n: int, device: str, calls: int) -> float:
    """GB/s (read plus written) of copying n fp32 elements: the best of a few timings, each of
    `calls` copies back to back (a small copy's call would otherwise be mostly the timer's)."""
    import torch

    src = torch.ones(n, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)

    def copies():
        for _ in range(calls):
            dst.copy_(src)

    return round(2 * 4 * n * calls / _best_seconds(copies, device, 3) / 1e9, 3)


def sized_copies(ceilings: dict) -> list[tuple[int, float]]:
    """(bytes, GB/s) of each sized copy among `ceilings` (names SIZED + bytes)."""
    return sorted((int(k[len(SIZED) :]), v) for k, v in ceilings.items() if k.startswith(SIZED))


def _matmul_gflops(a, b, device: str) -> float:
    import torch

    return round(2 * a.shape[0] ** 3 / _best_seconds(lambda: torch.mm(a, b), device, 2) / 1e9, 3)


def half_matmuls(graph) -> tuple[str, ...]:
    """The half dtypes (float16, bfloat16) the graph's linear primitives compute in, sorted."""
    dtypes = {graph.types[n.inputs[0]].dtype for n in graph.nodes if node_flops(n, graph.types)}
    return tuple(sorted(dtypes & set(HALF_DTYPES)))


def matmul_dtype(nodes: list[Node], types) -> str | None:
    """The dtype a kernel's linear primitives compute in (the first one's), None without any."""
    for node in nodes:
        if node_flops(node, types):
            return types[node.inputs[0]].dtype
    return None


def flops_ceiling(ceilings: dict, dtype: str | None) -> float | None:
    """The measured matmul peak for `dtype` (fp32's for the dtypes not measured apart)."""
    return ceilings.get(f"gflops_{dtype}") or ceilings.get("gflops")


def traffic_bytes(types: list[TensorType]) -> int:
    return sum(t.nbytes for t in types)
