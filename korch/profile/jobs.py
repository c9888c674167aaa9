"""Profiling jobs: what the parent writes for them (the activations kernels read, the source
models' bytes, as files) and what a worker does with one (run_job: compile, check against the
reference, time). Jobs are plain data, so that a local worker process (korch.profile.workers) or a
Ray task (korch.profile.ray_pool) can run them; the parent builds them (korch.profile.profiler)."""

from __future__ import annotations

import hashlib
import time
from pathlib import Path

import numpy as np
import torch

from korch.backends import backend_class, compile_with, torch_ops
from korch.errors import KorchError, first_line
from korch.ir import reference, tensors
from korch.ir.graph import Graph
from korch.ir.prims import from_npy
from korch.ir.serialize import load_graph_json
from korch.ir.tensors import to_tensor
from korch.measure import check
from korch.measure.timing import time_fn
from korch.measure.tolerance import graph_tolerance
from korch.profile.workers import compile_threads, environmental, kernel_threads
from korch.search.kernel import KernelSpec

# ------------------------------------------------------------------ the parent's side: files


def spill_activations(graph: Graph, needed: set[str], directory: Path, seed: int = 0) -> dict[str, str]:
    """Real values of `needed` (a run on seeded inputs), each written to an .npy file in
    `directory` as soon as it is computed: value -> path. Kernels are checked and timed on the data
    they will see, not on noise that makes sqrt and log produce NaN; on disk, a large model's
    activations (YOLOv4's are 1 GB) are neither held by this process nor pickled into every job.
    Torch ops compute them (numpy convolutions take minutes on large models); the reference stays
    the oracle in the checks of kernels, and these values are the oracle of the source model (ONNX
    Runtime's run of the original operators is checked against the primitive graph)."""
    paths: dict[str, str] = {}

    def save(v: str, array) -> None:
        if v in needed and v not in paths:
            paths[v] = str(directory / f"v{len(paths)}.npy")
            np.save(paths[v], np.asarray(array, dtype=graph.types[v].dtype))

    def step(node, arrays):
        try:
            args = [to_tensor(a) for a in arrays]
            outs = [tensors.to_numpy(o) for o in torch_ops.apply(node.prim, args, node.a)]
        except NotImplementedError:
            outs = node.prim.ref(arrays, node.a)
        except RuntimeError as e:  # torch raises on an integer division by zero
            if "ZeroDivisionError" not in str(e):
                raise
            raise KorchError(
                f"{node.origin.rstrip(':') or node.prim.name}: an integer division by zero on korch's seeded "
                "inputs (non-index integer inputs are 1 or 2; a divisor computed from them is 0)"
            ) from None
        for v, out in zip(node.outputs, outs):
            save(v, out)
        return outs

    feeds = check.random_inputs(graph, seed)
    for v, array in [*graph.constants.items(), *feeds.items()]:
        save(v, array)
    with torch.inference_mode():
        reference.evaluate(graph, feeds, (), step)
    return paths


def load_array(value) -> np.ndarray:
    """A job's array: given, or an .npy file written by spill_activations."""
    return from_npy(np.load(value)) if isinstance(value, str) else value


def write_blobs(specs, directory: Path) -> tuple[dict[str, dict[str, bytes]], dict[str, dict[str, str]]]:
    """Each source model's bytes written once to a file: (key -> {sha256: bytes}, key -> {sha256:
    path}). Workers load the file instead of receiving hundreds of megabytes through a pipe with
    every job; the bytes let the job's graph refer to them by digest."""
    data: dict[str, dict[str, bytes]] = {}
    paths: dict[str, dict[str, str]] = {}
    for spec in specs:
        for node in spec.graph.nodes:
            for _, value in node.attrs:
                if isinstance(value, bytes):
                    digest = hashlib.sha256(value).hexdigest()
                    path = directory / f"{digest}.onnx"
                    if not path.exists():
                        path.write_bytes(value)
                    data.setdefault(spec.key, {})[digest] = value
                    paths.setdefault(spec.key, {})[digest] = str(path)
    return data, paths


# ------------------------------------------------------------------ the worker's side


def run_job(job: dict) -> dict:
    """Compile (and, in the timing phase, time) one (key, backend) in this process."""
    backend = backend_class(job["backend_class"])()
    blobs = {digest: Path(path).read_bytes() for digest, path in job.get("blob_files", {}).items()}
    graph = load_graph_json(job["spec"], blobs=blobs)
    spec = KernelSpec(job["key"], graph, (), ())
    device = job["device"]
    started = time.perf_counter()
    try:
        arrays = [load_array(x) for x in job["inputs"]]
        weights = {graph.inputs[i]: arrays[i] for i in job.get("weights", ())}  # the model's constants
        with compile_threads(job.get("compile_threads")), kernel_threads(job.get("kernel_threads")):
            compiled = compile_with(backend, spec, device, weights)
        compile_s = time.perf_counter() - started
        inputs = [to_tensor(x, device) for x in arrays]
        reason = None if job.get("checked") else _check_job(job, graph, arrays, compiled.fn(*inputs))
        if reason:
            return {"status": "failed", "reason": reason, "compile_s": compile_s}
        result = {"status": "ok", "compile_s": compile_s, "kernels": compiled.kernels}
        if job["phase"] == "time":
            spread = job.get("spread_s", 0.0)
            timing = time_fn(compiled.fn, inputs, device, job["min_time"], spread)
            result.update(median_ms=timing.median_ms, min_ms=timing.min_ms, max_ms=timing.max_ms)
            result.update(tries=timing.tries, disturbed=timing.disturbed)
        return result
    except Exception as e:  # a backend that cannot compile or run this kernel: infinite cost
        line = first_line(e, 240)
        return {
            "status": "failed",
            "reason": f"{type(e).__name__}: {line}",
            "compile_s": time.perf_counter() - started,
            "environmental": environmental(e),  # (memory ran out: profiled again by a later run)
        }


def _check_job(job: dict, graph: Graph, arrays: list[np.ndarray], outs) -> str | None:
    """check_kernel against the reference: the source model's is the primitive graph's values,
    computed by the caller (checking ONNX Runtime against another ONNX Runtime session would prove
    nothing)."""
    if "want" in job:
        want = {name: load_array(x) for name, x in job["want"].items()}
    else:
        want = reference.run(graph, dict(zip(graph.inputs, arrays)))
    return check_kernel(outs, want, graph, job.get("discrete_mismatch", 0.0), job.get("tolerance", 0.0))


def check_kernel(
    outs, want, graph: Graph, discrete_mismatch: float = 0.0, tolerance: float = 0.0
) -> str | None:
    """None when every output matches the reference within tolerance (the graph's, or the given
    one where larger), else the reason. Integer and boolean outputs must match exactly (8-bit
    integers, quantized values, are compared as numbers: check.rel_err), or up to a
    `discrete_mismatch` fraction of elements (an argmax over near-ties, after a whole model
    computed two ways)."""
    if len(outs) != len(graph.outputs):
        return f"returned {len(outs)} outputs, expected {len(graph.outputs)}"
    limit = max(graph_tolerance(graph), tolerance)
    for got, name, v in zip(outs, graph.output_names, graph.outputs):
        t = graph.types[v]
        got = tensors.to_numpy(got) if isinstance(got, torch.Tensor) else np.asarray(got)
        if tuple(got.shape) != t.shape or str(got.dtype) != t.dtype:
            return f"{name}: got {got.dtype}{list(got.shape)}, expected {t}"
        expected = np.asarray(want[name])
        if discrete_mismatch and (expected.dtype == bool or expected.dtype.kind in "iu"):
            wrong = float(np.mean(got != expected)) if expected.size else 0.0
            if wrong > discrete_mismatch and not check.rel_err(got, expected) <= limit:  # (8-bit: numbers)
                return f"wrong result: {name} differs in {wrong:.1%} of its elements"
            continue
        err = check.rel_err(got, expected)
        if not err <= limit:
            return f"wrong result: {name} relative error {err:.3g}"
    return None
