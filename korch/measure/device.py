"""The device kernels run on: float32 arithmetic, waiting for its queue, holding its stream, its
name in every profile's key, and example inputs placed on it."""

from __future__ import annotations

import torch

from korch.ir.graph import Graph
from korch.ir.tensors import as_tensor
from korch.measure.check import random_inputs

# korch computes float32 as IEEE float32 on every device. cuDNN's default on Ampere and later is
# TF32 convolutions (10-bit mantissas: relative errors near 1e-3), which would fail korch's 1e-4
# checks against ONNX Runtime and the reference. Set process-wide on import (every process that
# compiles, times or runs kernels imports this module, through korch.backends or
# korch.measure.timing), so peers timed beside korch (`korch bench`) run the same arithmetic. The
# legacy switches, because mixing them with the new fp32_precision API makes torch raise; matmuls
# are IEEE by default, set anyway in case a user enabled TF32.
torch.backends.cudnn.allow_tf32 = False
torch.backends.cuda.matmul.allow_tf32 = False


def synchronize(device: str) -> None:
    """Wait for the device's queued work (a no-op on CPU): every timer calls this around a call."""
    if device.startswith("cuda"):
        torch.cuda.synchronize(device)


_CYCLES_PER_MS: dict[str, float] = {}


def hold_device(device: str, ms: float) -> None:
    """On CUDA, queue a kernel that spins for about `ms` milliseconds. Work the host queues
    meanwhile then runs back to back, so timing events around it measure the device's time
    without the host's launch overhead, which a plan replayed as one CUDA graph does not pay
    either (Inductor's Python wrapper alone costs more per call than many fused kernels take).
    Call it with `device` current (torch.cuda.device). A no-op on CPU, and where torch lacks its
    spin kernel."""
    spin = getattr(torch.cuda, "_sleep", None)
    if not device.startswith("cuda") or spin is None:
        return
    if device not in _CYCLES_PER_MS:
        # a spin counts clock cycles: the rate is measured after a spin that lifts an idle GPU's
        # clock, the highest of three, so a hold lasts at least as long as asked at that clock
        spin(10**7)
        rates = []
        for _ in range(3):
            start, end = timing_events()
            start.record()
            spin(2 * 10**6)
            end.record()
            end.synchronize()
            rates.append(2 * 10**6 / max(start.elapsed_time(end), 1e-3))
        _CYCLES_PER_MS[device] = max(rates)
    spin(int(min(ms, 200.0) * _CYCLES_PER_MS[device]))


def timing_events(n: int = 2) -> list[torch.cuda.Event]:
    return [torch.cuda.Event(enable_timing=True) for _ in range(n)]


def device_name(device: str) -> str:
    """A stable description of the device, part of every profile's key."""
    if device.startswith("cuda"):
        return f"cuda:{torch.cuda.get_device_name(torch.device(device))}"
    return f"cpu:{cpu_model()}:{torch.get_num_threads()}threads"


def cpu_model() -> str:
    """The processor's model name as the kernel reports it (/proc/cpuinfo)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown cpu"


def example_tensors(graph: Graph, device: str, seed: int = 0) -> list[torch.Tensor]:
    """The graph's seeded inputs (korch.measure.check.random_inputs) as tensors on the device, in
    the order of graph.inputs."""
    feeds = random_inputs(graph, seed)
    return [as_tensor(feeds[name]).to(device) for name in graph.inputs]
