"""Kernel backends: who can run a candidate as one kernel, and how to compile it for a device.

A backend answers `supports(spec)` with None (yes) or a reason, and `compile(spec, device)` with a
CompiledKernel whose `fn(*inputs)` takes and returns torch tensors on the device, inputs in the
order of `spec.graph.inputs`. Compilation may raise anything: the profiler records it as a failure.
A backend that `bakes_weights` is also given the values of the inputs that are the model's
constants, and compiles them in (its kernel then serves only kernels reading those weights)."""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np
import torch

from korch.search.kernel import KernelSpec

# korch computes float32 as IEEE float32 on every device. cuDNN's default on Ampere and later is
# TF32 convolutions (10-bit mantissas: relative errors near 1e-3), which would fail korch's 1e-4
# checks against ONNX Runtime and the reference. Set process-wide on import (every process that
# compiles, times or runs kernels imports this module), so peers timed beside korch (`korch bench`)
# run the same arithmetic. The legacy switches, because mixing them with the new fp32_precision
# API makes torch raise; matmuls are IEEE by default, set anyway in case a user enabled TF32.
torch.backends.cudnn.allow_tf32 = False
torch.backends.cuda.matmul.allow_tf32 = False


Weights = Mapping[str, np.ndarray]  # kernel input name -> the model's constant it reads


@dataclass
class CompiledKernel:
    fn: Callable[..., list[torch.Tensor]]
    kernels: int = 1  # device kernels launched per call, as far as the backend knows
    # the same kernel on numpy arrays (arrays in, new arrays out), where the backend runs on them
    # natively (ONNX Runtime on a CPU): a plan made of such kernels runs a numpy caller's arrays
    # without converting each value to a tensor and back (korch.plan.runtime.Executable.run_arrays)
    arrays: Callable[..., list[np.ndarray]] | None = None


class Backend:
    name = "?"
    selectable = True  # False for the reference: it checks the others but is never chosen
    default_on: tuple[str, ...] = ("cpu", "cuda")  # device kinds where it is used unless named
    bakes_weights = False  # compile() takes a third argument: the values of the weights the kernel reads
    fresh_outputs = False  # every output of its kernels is new memory, never a view of an input or weight

    def version(self) -> str:
        raise NotImplementedError

    def supports(self, spec: KernelSpec, device: str) -> str | None:
        raise NotImplementedError

    def compile(self, spec: KernelSpec, device: str, weights: Weights | None = None) -> CompiledKernel:
        """`weights`: for a backend that bakes them, some of spec.graph.inputs' values (fn still
        takes every input)."""
        raise NotImplementedError


def compile_with(backend: Backend, spec: KernelSpec, device: str, weights: Weights) -> CompiledKernel:
    """backend.compile, given the weights when it bakes them in (the others take two arguments)."""
    return backend.compile(spec, device, weights) if backend.bakes_weights else backend.compile(spec, device)


@functools.cache  # (asked for every candidate of a model: a backend's version is in its profile's key)
def source_digest(*modules) -> str:
    """A short hash of the modules' source and of korch's check policy (korch.measure.tolerance): part of
    a backend's version, so that changing how korch lowers, runs or checks kernels invalidates the
    profiles (and cached failures) measured before."""
    import hashlib
    import inspect

    from korch.measure import tolerance

    h = hashlib.sha256()
    for module in (*modules, tolerance):
        h.update(inspect.getsource(module).encode())
    return h.hexdigest()[:8]


def all_backends() -> dict[str, Backend]:
    from korch.backends.eager import EagerBackend
    from korch.backends.inductor import InductorBackend
    from korch.backends.onnxrt import OnnxRuntimeBackend
    from korch.backends.reference import ReferenceBackend
    from korch.backends.vendor import VendorBackend

    found = [InductorBackend(), VendorBackend(), EagerBackend(), OnnxRuntimeBackend(), ReferenceBackend()]
    return {b.name: b for b in found}


def get_backends(names: list[str] | None = None, device: str = "cpu") -> list[Backend]:
    """The named backends (default: every selectable one used by default on the device's kind)."""
    from korch.errors import KorchError

    known = all_backends()
    if not names:
        kind = "cuda" if device.startswith("cuda") else "cpu"
        return [b for b in known.values() if b.selectable and kind in b.default_on]
    choices = ", ".join(n for n, b in known.items() if b.selectable)
    unknown = [n for n in names if n not in known]
    if unknown:
        raise KorchError(f"unknown backends {unknown}; known: {choices}")
    oracles = [n for n in names if not known[n].selectable]
    if oracles:  # a plan checked against its own kernels would check nothing
        raise KorchError(
            f"{oracles[0]} is korch's oracle (the numpy executor every kernel is checked against), "
            f"not a backend to optimize with; choose from {choices}"
        )
    return [known[n] for n in names]


# calls after a pause before anything is timed: the first calls after a sleep run slow (on the
# 2-core machine a 0.85 ms ONNX Runtime plan took 41, 2.1 and 1.0 ms on its first three calls
# after 0.6 s asleep: its thread pool and the idle CPU waking), and the plans measured in place
# timed the second call (2.1 ms against 0.85 in the bench)
WAKE_CALLS = 3


def synchronize(device: str) -> None:
    """Wait for the device's queued work (a no-op on CPU): every timer calls this around a call."""
    if device.startswith("cuda"):
        torch.cuda.synchronize(device)


_CYCLES_PER_MS: dict[str, float] = {}


def hold_device(device: str, ms: float) -> None:
    """On CUDA, queue a kernel that spins for about `ms` milliseconds. Work the host queues
    meanwhile then runs back to back, so timing events around it measure the device's time
    without the host's launch overhead, which a plan replayed as one CUDA graph does not pay
    either (Inductor's Python wrapper alone costs tens of microseconds per call, more than many
    fused kernels take). Call it with `device` current (torch.cuda.device). A no-op on CPU, and
    where torch lacks its spin kernel."""
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


def device_intervals(device: str, hold_ms: float, run: Callable[[Callable[[], None]], object]) -> list[float]:
    """Milliseconds on the CUDA device between the marks `run` makes (it is handed the function to
    call at each), the host's launch overhead hidden behind a stream held for `hold_ms`."""
    events: list[torch.cuda.Event] = []

    def mark() -> None:
        events.append(timing_events(1)[0])
        events[-1].record()

    with torch.cuda.device(device):  # the events and the hold go to the current device's stream
        hold_device(device, hold_ms)
        run(mark)
        events[-1].synchronize()
    return [a.elapsed_time(b) for a, b in zip(events, events[1:])]


def device_name(device: str) -> str:
    """A stable description of the device, part of every profile's key."""
    if device.startswith("cuda"):
        return f"cuda:{torch.cuda.get_device_name(torch.device(device))}"
    model = "unknown cpu"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return f"cpu:{model}:{torch.get_num_threads()}threads"
