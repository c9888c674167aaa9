"""Kernel backends: who can run a candidate as one kernel, and how to compile it for a device.

A backend answers `supports(spec)` with None (yes) or a reason, and `compile(spec, device)` with a
CompiledKernel whose `fn(*inputs)` takes and returns torch tensors on the device, inputs in the
order of `spec.graph.inputs`. Compilation may raise anything: the profiler records it as a failure.
A backend that `bakes_weights` is also given the values of the inputs that are the model's
constants, and compiles them in (its kernel then serves only kernels reading those weights)."""

from __future__ import annotations

import functools
import hashlib
import importlib
import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np
import torch

import korch.measure.device  # noqa: F401  (float32 stays IEEE float32 wherever kernels run: see there)
from korch.errors import KorchError
from korch.ir import reference
from korch.measure import timing, tolerance
from korch.search.kernel import KernelSpec

# the implementations, "module:class", in the order they are tried and listed; imported when first
# asked for (each imports this interface)
IMPLEMENTATIONS = (
    "korch.backends.inductor:InductorBackend",
    "korch.backends.inductor:InductorFrozenBackend",
    "korch.backends.inductor:InductorAutotuneBackend",
    "korch.backends.vendor:VendorBackend",
    "korch.backends.eager:EagerBackend",
    "korch.backends.onnxrt:OnnxRuntimeBackend",
    "korch.backends.openvino:OpenVinoBackend",
    "korch.backends.reference:ReferenceBackend",
)


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

    def compiles_again(self, device: str) -> bool:
        """Whether a second process that compiles a kernel this process compiled pays the whole
        compile again (no cache shared between processes serves it), or compiling runs work on the
        device that must not overlap a timing (autotuning): the profiler then compiles, checks and
        times it in its timing worker alone (korch.profile.profiler)."""
        return False

    def supports(self, spec: KernelSpec, device: str) -> str | None:
        raise NotImplementedError

    def compile(self, spec: KernelSpec, device: str, weights: Weights | None = None) -> CompiledKernel:
        """`weights`: for a backend that bakes them, some of spec.graph.inputs' values (fn still
        takes every input)."""
        raise NotImplementedError


def compile_with(backend: Backend, spec: KernelSpec, device: str, weights: Weights) -> CompiledKernel:
    """backend.compile, given the weights when it bakes them in (the others take two arguments)."""
    return backend.compile(spec, device, weights) if backend.bakes_weights else backend.compile(spec, device)


_CHECKING = (tolerance, reference, timing)


@functools.cache  # (asked for every candidate of a model: a backend's version is in its profile's key)
def source_digest(*modules) -> str:
    """A short hash of the modules' source and of how korch checks and times every kernel (its check
    policy, korch.measure.tolerance; the reference executor, korch.ir.reference; the timer,
    korch.measure.timing): part of a backend's version, so that changing how korch lowers, runs,
    checks or times kernels invalidates the profiles (and cached failures) measured before."""
    h = hashlib.sha256()
    for module in (*modules, *_CHECKING):
        h.update(inspect.getsource(module).encode())
    return h.hexdigest()[:8]


def backend_class(path: str) -> type[Backend]:
    """The backend class a "module:class" path names (IMPLEMENTATIONS; a profiling job names its
    backend so, korch.profile.jobs)."""
    module, _, cls = path.partition(":")
    return getattr(importlib.import_module(module), cls)


def class_path(backend: Backend) -> str:
    """The "module:class" path of a backend's class (backend_class reads it back)."""
    cls = type(backend)
    return f"{cls.__module__}:{cls.__qualname__}"


def all_backends() -> dict[str, Backend]:
    found = [backend_class(path)() for path in IMPLEMENTATIONS]
    return {b.name: b for b in found}


def get_backends(names: list[str] | None = None, device: str = "cpu") -> list[Backend]:
    """The named backends (default: every selectable one used by default on the device's kind)."""
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
