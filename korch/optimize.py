"""The whole pipeline: fission, candidates (plus whole-partition peer seeds), profiling, selection,
plan."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass

import onnx

from korch import check
from korch.backends import device_name, get_backends
from korch.candidates import CandidateOptions, CandidateSet, _KeyMaker, enumerate_candidates, make_candidate
from korch.frontend import import_onnx
from korch.ir import Graph
from korch.plan import Plan, build_plan
from korch.profile_db import ProfileDB
from korch.profiler import ProfileOptions, profile
from korch.solver import Choice, Solution, greedy, solve

log = logging.getLogger("korch")
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


def _prefer_whole_graph(found: CandidateSet, solution: Solution, cost) -> Solution:
    """The per-partition optimum, or the whole graph as one kernel when that was measured faster."""
    whole = [c for c in found.candidates if c.partition == WHOLE_GRAPH]
    if whole:
        ms, backend = cost(whole[0].key)
        if ms < solution.objective_ms:
            return Solution(
                [Choice(whole[0], backend, ms)],
                solution.status,
                solution.gap,
                ms,
                solution.seconds,
                solution.cuts,
                solution.partitions,
            )
    return solution


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
    plan = build_plan(graph, solution, options.device, meta)
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
