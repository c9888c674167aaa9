"""The whole pipeline: fission, candidates (plus seeds), profiling, selection, plan."""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

import onnx

from korch import check
from korch.backends import device_name, get_backends
from korch.candidates import (
    Candidate,
    CandidateOptions,
    CandidateSet,
    _KeyMaker,
    enumerate_candidates,
    make_candidate,
)
from korch.frontend import import_onnx
from korch.ir import Graph, Node
from korch.kernel import KernelSpec
from korch.plan import Plan, build_plan
from korch.prims import Prim
from korch.profile_db import ProfileDB
from korch.profiler import ProfileOptions, profile
from korch.solver import Choice, Solution, greedy, solve

WHOLE_GRAPH = -1  # the partition index of the whole-graph seed


@dataclass(frozen=True)
class OptimizeOptions:
    device: str = "cpu"
    backends: tuple[str, ...] | None = None  # default: every selectable backend
    cache: str | os.PathLike | None = None  # profile database; default ~/.cache/korch/profiles.sqlite
    time_budget: float | None = None  # seconds of profiling
    max_size: int = CandidateOptions().max_size
    jobs: int | None = None
    progress: bool = True
    seeds: bool = True  # whole-partition candidates, so korch is never worse than a peer (as measured)
    solver_time_limit: float = 60.0
    min_time: float = 0.02  # seconds of timed calls per kernel


def add_seeds(graph: Graph, found: CandidateSet) -> int:
    """Each partition, and the whole graph, as one candidate: the onnxruntime and inductor backends
    then price running them their own way, and the plan is never worse than that (as measured)."""
    keys = _KeyMaker(graph)
    added = 0
    for part in found.partitions:
        if part.size > 1:
            found.candidates.append(
                make_candidate(graph, range(part.start, part.stop), part.index, keys, seed=True)
            )
            added += 1
    if len(found.partitions) > 1:
        found.candidates.append(make_candidate(graph, range(len(graph.nodes)), WHOLE_GRAPH, keys, seed=True))
        added += 1
    return added


ORIGINAL_SEED_LIMIT = 64 * 2**20  # bytes: the original model travels inside the kernel spec


def original_model_seed(graph: Graph, model: onnx.ModelProto) -> tuple[Candidate, KernelSpec] | None:
    """The source model itself, run whole by ONNX Runtime, as one candidate: ONNX Runtime's own
    fusions on the original operators are then priced too, so the plan is never slower than
    ONNX Runtime as measured. It is one opaque primitive over the graph's inputs and outputs."""
    blob = model.SerializeToString()
    producers = graph.producers()
    if len(blob) > ORIGINAL_SEED_LIMIT or not all(v in producers for v in graph.outputs):
        return None
    key = "model-" + hashlib.sha256(blob).hexdigest()[:18]
    in_types = tuple((graph.types[v].shape, graph.types[v].dtype) for v in graph.inputs)
    out_types = tuple((graph.types[v].shape, graph.types[v].dtype) for v in graph.outputs)
    outs = tuple(f"t0_{i}" for i in range(len(graph.outputs)))
    attrs = {"model": blob, "op_type": "model", "in_types": in_types, "out_types": out_types}
    node = Node(Prim.OPAQUE, tuple(graph.inputs), outs, tuple(sorted(attrs.items())), "model")
    types = {v: graph.types[v] for v in graph.inputs}
    types.update({o: graph.types[v] for o, v in zip(outs, graph.outputs)})
    names = tuple(f"out{i}" for i in range(len(outs)))
    sub = Graph(tuple(graph.inputs), outs, names, MappingProxyType(types), MappingProxyType({}), (node,), key)
    cand = Candidate(
        tuple(range(len(graph.nodes))), tuple(graph.inputs), tuple(graph.outputs), key, WHOLE_GRAPH, seed=True
    )
    return cand, KernelSpec(key, sub, tuple(graph.inputs), tuple(graph.outputs), seed=True)


def _prefer_whole_graph(found: CandidateSet, solution: Solution, cost) -> Solution:
    """The per-partition optimum, or a whole-graph kernel when one was measured faster."""
    best = solution
    for whole in (c for c in found.candidates if c.partition == WHOLE_GRAPH):
        ms, backend = cost(whole.key)
        if ms < best.objective_ms:
            best = Solution(
                [Choice(whole, backend, ms)],
                solution.status,
                solution.gap,
                ms,
                solution.seconds,
                solution.cuts,
                solution.partitions,
            )
    return best


def optimize(
    model: str | os.PathLike | onnx.ModelProto,
    shapes: Mapping[str, tuple[int, ...]] | None = None,
    options: OptimizeOptions = OptimizeOptions(),
    strict: bool = False,
) -> Plan:
    started = time.perf_counter()
    fission = import_onnx(model, shapes=shapes, strict=strict)
    graph = fission.graph
    found = enumerate_candidates(graph, CandidateOptions(max_size=options.max_size))
    seeds = add_seeds(graph, found) if options.seeds else 0
    specs = {}
    original = original_model_seed(graph, fission.model) if options.seeds else None
    if original:
        found.candidates.append(original[0])
        specs[original[0].key] = original[1]
        seeds += 1
    backends = get_backends(list(options.backends) if options.backends else None)
    db = ProfileDB(options.cache)
    try:
        profiles = profile(
            graph,
            found,
            backends,
            db,
            ProfileOptions(
                device=options.device,
                jobs=options.jobs,
                time_budget=options.time_budget,
                progress=options.progress,
                min_time=options.min_time,
            ),
            specs,
        )
    finally:
        db.close()
    solution = solve(graph, found.partitions, found.candidates, profiles.cost, options.solver_time_limit)
    solution = _prefer_whole_graph(found, solution, profiles.cost)
    baseline = greedy(graph, found.partitions, found.candidates, profiles.cost)
    meta = {
        "versions": _versions(backends),
        "device_name": device_name(options.device),
        "fission": {
            "onnx_nodes": fission.onnx_nodes,
            "primitives": len(graph.nodes),
            "opaque_ops": fission.opaque_ops,
        },
        "candidates": {**found.summary(), "seeds": seeds},
        "profiling": profiles.summary(),
        "solver": solution.summary(),
        "greedy_ms": baseline.objective_ms,
        "greedy_kernels": len(baseline.chosen),
        "input_bounds": check.input_bounds(graph),
        "seconds": round(time.perf_counter() - started, 3),
    }
    plan = build_plan(graph, solution, options.device, meta, specs)
    plan.model = fission.model
    return plan


def _versions(backends) -> dict[str, str]:
    import numpy
    import onnxruntime
    import torch

    import korch

    out = {
        "korch": korch.__version__,
        "torch": torch.__version__,
        "onnxruntime": onnxruntime.__version__,
        "onnx": onnx.__version__,
        "numpy": numpy.__version__,
    }
    out.update({f"backend:{b.name}": b.version() for b in backends})
    return out
