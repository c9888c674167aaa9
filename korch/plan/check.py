"""Plan integrity: the manifest of file checksums, the versions a plan was built with, and whether its
parts agree (every kernel's inputs, weights and outputs)."""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path

from korch.errors import KorchError
from korch.plan.meta import built_with

MANIFEST = "MANIFEST.json"
MANIFEST_FORMAT = "korch.manifest/1"
VERSIONED = ("korch", "torch", "onnxruntime")

log = logging.getLogger("korch")


def _sha256(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def write_manifest(directory: Path, known: dict[str, str] | None = None) -> None:
    """Record every file's size and sha256 (`known`: digests of files the caller just wrote from
    bytes it hashed); written after all of them, so its presence says the directory was complete
    when it was sealed."""
    known = known or {}
    files = sorted(p for p in directory.iterdir() if p.is_file() and p.name != MANIFEST)
    doc = {
        "format": MANIFEST_FORMAT,
        "files": {
            p.name: {"bytes": p.stat().st_size, "sha256": known.get(p.name) or _sha256(p)} for p in files
        },
    }
    (directory / MANIFEST).write_text(json.dumps(doc, indent=1))


def current_versions(backends: set[str]) -> dict[str, str]:
    """What a plan of kernels on `backends` (names) would record now (PlanMeta.versions)."""
    from korch.backends import all_backends

    known = all_backends()
    return built_with([known[b] for b in sorted(backends) if b in known])


def _model(device_name: str) -> str:
    """The device without the thread count (cpu:MODEL:Nthreads): threads change speed, not results."""
    head, _, tail = device_name.rpartition(":")
    return head if head and tail.endswith("threads") else device_name


def _current_device(device: str) -> str | None:
    import torch

    from korch.measure.device import device_name

    if device.startswith("cuda") and not torch.cuda.is_available():
        return None  # the runtime refuses the plan itself, saying so
    return device_name(device)


def check_versions(
    directory: Path,
    recorded: dict[str, str],
    built: str | None,
    device: str,
    backends: set[str],
    allow_mismatch: bool,
) -> None:
    """A plan built with other versions of korch, torch, onnxruntime or its backends may hold stale
    kernels (or kernels chosen for another device): refuse it, naming what differs, unless the
    caller allows it explicitly. `recorded` and `built`: PlanMeta.versions and .device_name."""
    if not recorded:
        return  # a plan assembled by hand, not by korch.optimize: nothing to compare
    now = current_versions(backends)
    keys = [k for k in (*VERSIONED, *(f"backend:{b}" for b in sorted(backends))) if k in recorded]
    differ = [f"{k} {recorded[k]} (now {now.get(k, 'missing')})" for k in keys if recorded[k] != now.get(k)]
    device = _current_device(device)
    if device is not None and built is not None and _model(built) != _model(device):
        differ.append(f"device {_model(built)!r} (now {_model(device)!r})")
    if not differ:
        return
    message = f"{directory}: built with other versions: {', '.join(differ)}"
    if not allow_mismatch:
        raise KorchError(f"{message}; optimize again, or pass --allow-version-mismatch")
    log.warning("warning: %s; loading it anyway", message)


# ------------------------------------------------------------------------ consistency


def check_plan(plan, source: bytes = b"") -> None:
    """Refuse a plan whose parts disagree (edited by hand and resealed, or written by a buggy
    korch), naming the first inconsistency: every value a kernel reads is a plan input, a weight
    or an earlier kernel's output, still alive, of the type the kernel's graph declares; a value
    written twice has one type; every output exists at the end; the source model takes the same
    inputs and gives the same outputs; no kernel's model keeps data in another file (`source`:
    model.onnx's bytes, checked already)."""
    alive = _sources(plan)
    producer = {}  # value -> the first kernel that writes it
    for i, k in enumerate(plan.kernels):
        for v in k.spec.outputs:
            producer.setdefault(v, i)
    freed: dict[str, int] = {}
    written: dict[str, tuple[int, object]] = {}  # value -> (the kernel that wrote it, its type)
    inputs = {name for name, _ in plan.inputs}
    for i, k in enumerate(plan.kernels):
        _check_reads(i, k, alive, freed, producer)
        _check_writes(i, k, alive, written, plan.weights, inputs)
        for v in k.free_after:
            if v not in plan.weights and alive.pop(v, None) is not None:  # (weights live on)
                freed[v] = i
    names = [name for _, name in plan.outputs]
    for value, name in plan.outputs:
        if names.count(name) > 1:
            raise KorchError(f"plan output name {name!r} is listed twice")
        if value not in alive:
            when = f"freed by kernel {freed[value]}" if value in freed else "never produced"
            raise KorchError(f"plan output {name!r} (value {value!r}) is {when}")
    _check_embedded_models([(f"kernel {i}", k.spec.graph) for i, k in enumerate(plan.kernels)], source)
    if plan.model is not None:
        _check_against_model(plan, plan.model)


def check_graph(plan, graph) -> None:
    """The plan's primitive graph (graph.json, for reports and the reference executor) takes the
    plan's inputs and gives its outputs, and its opaque operators' models hold all their data."""
    inputs = [(v, graph.types[v]) for v in graph.inputs]
    if list(plan.inputs) != inputs:
        raise KorchError(f"the plan's inputs {_listed(plan.inputs)} are not its graph's {_listed(inputs)}")
    outputs = list(zip(graph.outputs, graph.output_names))
    if list(plan.outputs) != outputs:
        raise KorchError(f"the plan's outputs {plan.outputs} are not its graph's {outputs}")
    _check_embedded_models([("the primitive graph", graph)], b"")


def _sources(plan) -> dict:
    """value -> type of what the plan starts with: its inputs and weights."""
    from korch.ir.prims import TensorType

    alive = {}
    for name, t in plan.inputs:
        if name in alive:
            raise KorchError(f"plan input {name!r} is listed twice")
        alive[name] = t
    for name, array in plan.weights.items():
        if name in alive:
            raise KorchError(f"weight {name!r} has the name of a plan input")
        alive[name] = TensorType.of(array)
    return alive


def _check_reads(i: int, k, alive: dict, freed: dict, producer: dict) -> None:
    graph = k.spec.graph
    if len(k.spec.inputs) != len(graph.inputs) or len(k.spec.outputs) != len(graph.outputs):
        raise KorchError(
            f"kernel {i} names {len(k.spec.inputs)} inputs and {len(k.spec.outputs)} outputs; its graph "
            f"takes {len(graph.inputs)} and gives {len(graph.outputs)}"
        )
    for v, inner in zip(k.spec.inputs, graph.inputs):
        if v in freed:
            raise KorchError(f"kernel {i} reads {v!r} after kernel {freed[v]} freed it")
        if v not in alive:
            later = producer.get(v)
            if later is not None and later >= i:
                raise KorchError(f"kernel {i} reads {v!r} before kernel {later} produces it")
            raise KorchError(f"kernel {i} reads {v!r}, which is no plan input, weight or kernel output")
        if alive[v] != graph.types[inner]:
            raise KorchError(f"kernel {i} reads {v!r} as {graph.types[inner]}, but it is {alive[v]}")


def _check_writes(i: int, k, alive: dict, written: dict, weights, inputs: set) -> None:
    """A value may be written again (two chosen multi-output kernels may share an output: the same
    value, computed twice), never as another type, and never over a plan input or weight."""
    graph = k.spec.graph
    for v, inner in zip(k.spec.outputs, graph.outputs):
        if v in weights or v in inputs:
            raise KorchError(f"kernel {i} writes {v!r}, a plan {'weight' if v in weights else 'input'}")
        t = graph.types[inner]
        first, before = written.setdefault(v, (i, t))
        if before != t:
            raise KorchError(f"kernel {i} writes {v!r} as {t}, but kernel {first} wrote it as {before}")
        alive[v] = t


def _check_embedded_models(graphs, source: bytes) -> None:
    """The one-node models of opaque primitives in `graphs` ((where, graph) pairs) may keep no
    tensor in another file: ONNX Runtime would read it relative to the current folder. (The source
    model that a kernel runs whole is model.onnx, `source`, checked when it was loaded.)"""
    import onnx

    from korch.frontend.onnx.external import refuse_external_data
    from korch.ir.prims import Prim

    for where, graph in graphs:
        for node in graph.nodes:
            blob = dict(node.attrs).get("model") if node.prim is Prim.OPAQUE else None
            if not isinstance(blob, bytes) or blob is source or blob == source:
                continue
            try:
                model = onnx.load_from_string(blob)
            except Exception as e:  # protobuf raises assorted types on damaged bytes
                raise KorchError(f"{where}: its operator's model is not ONNX ({type(e).__name__})") from None
            refuse_external_data(model, f"{where}'s model")


def _check_against_model(plan, model) -> None:
    """By name: what verify feeds the source model and compares its outputs by."""
    initialized = {t.name for t in model.graph.initializer}
    inputs = [i.name for i in model.graph.input if i.name not in initialized]
    if [n for n, _ in plan.inputs] != inputs:
        raise KorchError(f"the plan's inputs {[n for n, _ in plan.inputs]} are not model.onnx's {inputs}")
    outputs = [o.name for o in model.graph.output]
    if [n for _, n in plan.outputs] != outputs:
        raise KorchError(f"the plan's outputs {[n for _, n in plan.outputs]} are not model.onnx's {outputs}")


def _listed(values) -> str:
    return "[" + ", ".join(f"{n}: {t}" for n, t in values) + "]"
