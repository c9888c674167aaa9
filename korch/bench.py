"""Side-by-side timing of a plan and its peers on the same inputs, interleaved (A B A B ...)."""

from __future__ import annotations

import statistics
import time

import numpy as np
import torch

from korch.errors import KorchError
from korch.plan import Plan

PEERS = ("onnxruntime",)


def _onnxruntime_peer(plan: Plan, feeds: dict[str, np.ndarray]):
    import onnxruntime as ort

    if plan.model is None:
        raise KorchError("the plan carries no ONNX model to run in ONNX Runtime")
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    opts.intra_op_num_threads = torch.get_num_threads()  # the same threads korch's kernels use
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    cuda = plan.device.startswith("cuda")
    sess = ort.InferenceSession(
        plan.model.SerializeToString(),
        opts,
        providers=["CUDAExecutionProvider"] if cuda else ["CPUExecutionProvider"],
    )
    return lambda: sess.run(None, feeds)


def bench(
    plan: Plan, peers=PEERS, rounds: int = 10, seed: int = 0, warmup: int = 3, block_s: float = 0.05
) -> dict:
    """Median, min and max milliseconds per system, and korch's speedup over the fastest peer."""
    unknown = [p for p in peers if p not in PEERS]
    if unknown:
        raise KorchError(f"unknown peers {unknown}; available: {', '.join(PEERS)}")
    feeds = plan.random_inputs(seed)
    exe = plan.executable()
    tensors = exe.feeds((), feeds)
    sync = torch.cuda.synchronize if plan.device.startswith("cuda") else (lambda: None)
    systems = {"korch": lambda: exe.run_tensors(tensors)}
    for peer in peers:
        systems[peer] = _onnxruntime_peer(plan, feeds)
    for fn in systems.values():
        for _ in range(warmup):
            fn()
    samples: dict[str, list[float]] = {name: [] for name in systems}
    for _ in range(rounds):
        # interleaved blocks (A B A B ...), so drift on a shared machine hits every system alike; the
        # first call of each block is dropped: it pays for waking a thread pool the other system
        # just left spinning or asleep, which says more about the switch than about either system
        for name, fn in systems.items():
            block_end = time.perf_counter() + block_s
            calls = 0
            while calls < 4 or time.perf_counter() < block_end:
                sync()
                start = time.perf_counter()
                fn()
                sync()
                if calls:
                    samples[name].append((time.perf_counter() - start) * 1e3)
                calls += 1
    results = {
        name: {"median_ms": statistics.median(s), "min_ms": min(s), "max_ms": max(s)}
        for name, s in samples.items()
    }
    peer_best = min((results[p]["median_ms"] for p in peers), default=None)
    speedup = peer_best / results["korch"]["median_ms"] if peer_best else None
    return {
        "device": plan.device,
        "results": results,
        "speedup_vs_best_peer": speedup,
        "predicted_ms": plan.predicted_ms,
        "rounds": rounds,
    }
