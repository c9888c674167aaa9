"""The whole pipeline: fission, candidates (plus seeds), profiling, selection, plan."""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import math
import numbers
import os
import sys
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType

import onnx

from korch.backends import get_backends
from korch.config import PRIORITY_SHARE
from korch.errors import KorchError
from korch.frontend import FissionResult, import_onnx
from korch.ir.graph import Graph, Node
from korch.ir.prims import Prim
from korch.measure import check
from korch.measure.device import device_name
from korch.measure.roofline import half_matmuls, measure_ceilings
from korch.orchestrate.alternatives import rejected_alternatives
from korch.orchestrate.solve_measure import SearchReport, certify, least_calls, measured_ms, search_profiler
from korch.orchestrate.solver import Solution, greedy, solve
from korch.plan.meta import PlanMeta, built_with
from korch.plan.plan import Plan, build_plan, decided_by
from korch.plan.refine import Settings, alone, fastest_whole_graph, refine
from korch.profile.database import ProfileDB
from korch.profile.plan_timing import PlanTimings
from korch.profile.profiler import ProfileOptions, Profiler, ProfileResult, essential, spread_s
from korch.profile.rewrite_timing import RewriteTimer
from korch.rewrite import rewrite
from korch.search.candidates import (
    WHOLE_GRAPH,
    Candidate,
    CandidateOptions,
    CandidateSet,
    _KeyMaker,
    enumerate_candidates,
    make_candidate,
)
from korch.search.kernel import SOURCE_MODEL_PREFIX, WHOLE_GRAPH_PREFIX, KernelSpec

log = logging.getLogger("korch")
SELECTIONS = ("optimal", "greedy", "whole-graph")


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
    executor: str = "local"  # or "ray": compile jobs spread over a Ray cluster
    ray_address: str | None = None
    measure: bool = True  # time each plan in place (PlanMeta.measured) and re-solve with those timings
    refine_rounds: int = 2  # re-solves with in-place timings (when measure is on)
    rewrite: bool = True  # rewrites of the graph that save work (korch.rewrite)
    # what makes the plan: "optimal" (the BLP's solution, refined by in-place timings); for
    # `korch bench --ablation`, "greedy" (korch.orchestrate.solver.greedy) or "whole-graph" (the
    # whole primitive graph as one kernel, in the backend whose plan measured fastest in place)
    selection: str = "optimal"

    def __post_init__(self):
        """Check values as the CLI's flags are checked, so a Python caller gets the same one-line
        KorchError before any work instead of a raw exception (or silence) minutes later."""
        if self.backends is not None:
            object.__setattr__(self, "backends", _backend_names(self.backends))
        budget = self.time_budget
        if budget is not None and not (_is_number(budget) and budget >= 0):  # NaN fails >= too
            raise KorchError(f"time_budget must be a number of seconds, at least 0, got {budget!r}")
        if not (_is_int(self.max_size) and self.max_size >= 1):
            raise KorchError(f"max_size must be an int, at least 1, got {self.max_size!r}")
        if self.jobs is not None and not (_is_int(self.jobs) and self.jobs >= 1):
            raise KorchError(f"jobs must be an int, at least 1, got {self.jobs!r}")
        self._cap_jobs()
        if self.selection not in SELECTIONS:
            raise KorchError(f"selection must be one of {', '.join(SELECTIONS)}, got {self.selection!r}")
        if self.executor not in ("local", "ray"):
            raise KorchError(f"executor must be 'local' or 'ray', got {self.executor!r}")

    def _cap_jobs(self) -> None:
        """At most one compile worker per core: each is a process holding torch and ONNX Runtime
        (hundreds of MiB), and more than the cores only makes them wait for each other."""
        cores = os.cpu_count() or 1
        if self.jobs is not None and self.jobs > cores:
            log.warning(
                "korch: warning: %d jobs asked for, more than this machine's %d cores: %d compile workers",
                self.jobs,
                cores,
                cores,
            )
            object.__setattr__(self, "jobs", cores)

    def check_device(self, name: str = "device") -> None:
        """The device exists on this machine: a separate check, since options may describe a
        run elsewhere, and torch's own error for a missing GPU is a bare AssertionError. `name`:
        what the caller calls the option (the CLI's --device)."""
        import torch

        kind, colon, index = self.device.partition(":") if isinstance(self.device, str) else ("", "", "")
        if kind not in ("cpu", "cuda") or colon and (kind == "cpu" or not index.isdigit()):
            raise KorchError(f"{name} must be cpu, cuda or cuda:N, got {self.device!r}")
        if kind == "cuda" and not torch.cuda.is_available():
            raise KorchError(f"{name} {self.device!r}: no CUDA device is available")
        count = torch.cuda.device_count() if index else 0
        if index and int(index) >= count:
            raise KorchError(f"{name} {self.device!r}: this machine has {count} CUDA devices")


def _backend_names(backends) -> tuple[str, ...]:
    """A tuple of names, from one comma-separated string as on the command line (a bare string
    would otherwise be iterated letter by letter) or any iterable of names."""
    parts = backends.split(",") if isinstance(backends, str) else backends
    if not isinstance(parts, Iterable) or isinstance(parts, bytes):
        raise KorchError(f"backends wants names, e.g. 'onnxruntime,vendor', got {backends!r}")
    names = tuple(str(n).strip() for n in parts if str(n).strip())
    if not names:
        raise KorchError(f"backends names no backend: {backends!r}")
    return names


def _is_number(value) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)  # numpy scalars too


def _is_int(value) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def add_seeds(graph: Graph, found: CandidateSet, alone: set[int] | None = None) -> int:
    """Each partition, and the whole graph, as one candidate: the onnxruntime and inductor backends
    then price running them their own way, and the plan is never worse than that (as measured).
    The whole graph's key says it is a plan by itself (korch.search.kernel.runs_alone). Around the
    primitives `alone` that no kernel generator fuses (`unfused`), the runs of primitives between
    such ones are the seeds instead (a run of a topological order is convex)."""
    alone = unfused(graph) if alone is None else alone
    keys = _KeyMaker(graph)
    seeds = [
        make_candidate(graph, range(start, stop), part.index, keys, seed=True)
        for part in found.partitions
        for start, stop in _runs(part.start, part.stop, alone)
    ]
    if len(found.partitions) > 1 and not alone:
        seeds.append(make_candidate(graph, range(len(graph.nodes)), WHOLE_GRAPH, keys, seed=True))
    for cand in seeds:
        if len(cand.nodes) == len(graph.nodes):
            cand = dataclasses.replace(cand, key=WHOLE_GRAPH_PREFIX + cand.key)
        found.candidates.append(cand)
    return len(seeds)


def unfused(graph: Graph, backends: Iterable[str] = ()) -> set[int]:
    """The primitives that run alone: opaque operators (ONNX Runtime's node), and grouped matmuls
    unless Inductor is among the backends (vendor and eager kernels run single primitives;
    Inductor calls a grouped matmul as a library call amid its fused code)."""
    kinds = (Prim.OPAQUE,) if "inductor" in backends else (Prim.OPAQUE, Prim.GROUPED_MATMUL)
    return {i for i, node in enumerate(graph.nodes) if node.prim in kinds}


def _runs(start: int, stop: int, alone: set[int]) -> list[tuple[int, int]]:
    """Nodes [start, stop) split around the primitives that run alone: the runs of two or more."""
    runs, first = [], start
    for i in range(start, stop):
        if i in alone:
            runs.append((first, i))
            first = i + 1
    runs.append((first, stop))
    return [(a, b) for a, b in runs if b - a > 1]


# bytes: protobuf's limit on one serialized model. The source model reaches the profiling workers
# as a file (korch.profile.profiler) and plans and the database keep it by sha256, so even BERT-base's
# 418 MB adds one ONNX Runtime session per process that runs it, not copies per job.
ORIGINAL_SEED_LIMIT = 2**31 - 1


def original_model_seed(graph: Graph, model: onnx.ModelProto) -> tuple[Candidate, KernelSpec] | None:
    """The source model itself, run whole by ONNX Runtime, as one candidate: ONNX Runtime's own
    fusions on the original operators are then priced too, so the plan is never slower than
    ONNX Runtime as measured. It is one opaque primitive over the graph's inputs and outputs."""
    producers = graph.producers()
    if model.ByteSize() > ORIGINAL_SEED_LIMIT or not all(v in producers for v in graph.outputs):
        return None
    blob = model.SerializeToString()
    key = SOURCE_MODEL_PREFIX + hashlib.sha256(blob).hexdigest()[:18]
    in_types = tuple((graph.types[v].shape, graph.types[v].dtype) for v in graph.inputs)
    out_types = tuple((graph.types[v].shape, graph.types[v].dtype) for v in graph.outputs)
    outs = tuple(f"t0_{i}" for i in range(len(graph.outputs)))
    attrs = {"model": blob, "op_type": "model", "in_types": in_types, "out_types": out_types}
    attrs["nodes"] = len(model.graph.node)
    node = Node(Prim.OPAQUE, tuple(graph.inputs), outs, tuple(sorted(attrs.items())), "model")
    types = {v: graph.types[v] for v in graph.inputs}
    types.update({o: graph.types[v] for o, v in zip(outs, graph.outputs)})
    names = tuple(f"out{i}" for i in range(len(outs)))
    sub = Graph(tuple(graph.inputs), outs, names, MappingProxyType(types), MappingProxyType({}), (node,), key)
    cand = Candidate(
        tuple(range(len(graph.nodes))), tuple(graph.inputs), tuple(graph.outputs), key, WHOLE_GRAPH, seed=True
    )
    return cand, KernelSpec(key, sub, tuple(graph.inputs), tuple(graph.outputs), seed=True)


def _select(
    graph: Graph, found: CandidateSet, cost, time_limit: float, profiled: ProfileResult | None = None
) -> tuple[Solution, Solution]:
    """The optimal selection and the greedy baseline (None when a tight --time-budget left some
    primitive without a profiled kernel of its own). Without a kernel for every primitive only a
    whole-graph kernel (the source model, profiled first) can make the plan. `profiled` says
    why in the error when there is no plan."""
    try:
        solution = solve(graph, found.partitions, found.candidates, cost, time_limit)
    except KorchError as e:
        solution = _prefer_whole_graph(found, Solution([], "incomplete", objective_ms=math.inf), cost)
        if not solution.chosen:
            why = _why_no_plan(profiled)
            raise KorchError(f"{e}; nothing covers the whole graph either ({why})") from None
        return solution, None
    solution = _prefer_whole_graph(found, solution, cost)
    try:
        return solution, greedy(graph, found.partitions, found.candidates, cost)
    except KorchError:
        return solution, None


def _why_no_plan(profiled: ProfileResult | None) -> str:
    """The commonest profiling failure, and advice that fits: failures of the machine (a worker
    killed, a timeout, memory) are profiled again by the next run; a larger --time-budget helps
    only when kernels were skipped, or none failed (then the budget ended before they ran)."""
    if profiled is None or not profiled.failures:
        return "raise --time-budget"
    ((reason, count),) = profiled.failures.most_common(1)
    why = [f"the commonest profiling failure: {reason!r}, {count} kernels"]
    again = sum(p.transient for by in profiled.profiles.values() for p in by.values())
    if again:
        why.append(f"{again} failed for reasons of the machine and are profiled again by the next run")
    if profiled.skipped:
        why.append("raise --time-budget")
    return "; ".join(why)


def _prefer_whole_graph(found: CandidateSet, solution: Solution, cost) -> Solution:
    """The per-partition optimum, or a whole-graph kernel when one was measured faster."""
    best = solution
    for whole in (c for c in found.candidates if c.partition == WHOLE_GRAPH):
        ms, backend = cost(whole.key)
        if ms < best.objective_ms:
            best = alone(solution, whole, backend, ms)
    return best


def optimize(
    model: str | os.PathLike | onnx.ModelProto,
    shapes: Mapping[str, tuple[int, ...]] | None = None,
    options: OptimizeOptions = OptimizeOptions(),
    strict: bool = False,
    values: Mapping[str, object] | None = None,
) -> Plan:
    started = time.perf_counter()
    options.check_device()  # before the import: a missing GPU should not cost a fission first
    return optimize_fission(import_onnx(model, shapes=shapes, strict=strict, values=values), options, started)


def optimize_fission(fission: FissionResult, options: OptimizeOptions, started: float | None = None) -> Plan:
    """Candidates, profiling, selection and the plan for an imported primitive graph (from ONNX or
    PyTorch; without a source ONNX model there is no whole-model seed and no ONNX Runtime oracle)."""
    started = time.perf_counter() if started is None else started
    backends = get_backends(list(options.backends) if options.backends else None, options.device)
    db = ProfileDB(options.cache)
    try:
        return _optimize(fission, options, backends, db, started)
    finally:
        db.close()


def _optimize(
    fission: FissionResult, options: OptimizeOptions, backends, db: ProfileDB, started: float
) -> Plan:
    timer = RewriteTimer(options.device, db)
    graph, rewrites = rewrite(fission.graph, timer) if options.rewrite else (fission.graph, [])
    found, seeds, specs = _candidates(graph, fission, backends, options)
    _say(
        options,
        f"{len(graph.nodes)} primitives ({len(rewrites)} rewrites), {len(found.candidates)} "
        f"candidates ({time.perf_counter() - started:.1f}s)",
    )
    ceilings = _ceilings(db, options.device, half_matmuls(graph))
    profiles, report = _profile(graph, found, backends, db, specs, ceilings, options)
    solution, baseline = _select(graph, found, profiles.cost, options.solver_time_limit, profiles)
    meta = PlanMeta(
        versions=built_with(backends),
        device_name=device_name(options.device),
        fission={
            "source": fission.source,
            "onnx_nodes" if fission.source == "onnx" else "aten_nodes": fission.onnx_nodes,
            "primitives": len(graph.nodes),
            "opaque_ops": fission.opaque_ops,
        },
        rewrites=rewrites,
        candidates={**found.summary(), "seeds": seeds},
        profiling=profiles.summary(),
        greedy_ms=baseline.objective_ms if baseline else None,
        greedy_kernels=len(baseline.chosen) if baseline else None,
        ceilings=ceilings,
        input_bounds=check.input_bounds(graph),
        index_limits=check.index_limits(graph),
    )

    def make_plan(solution: Solution) -> Plan:
        solved = dataclasses.replace(meta, solver=solution.summary())
        plan = build_plan(graph, solution, options.device, solved, specs)
        plan.model = fission.model
        return plan

    if options.selection == "greedy":
        if baseline is None:
            raise KorchError("no greedy plan: some primitive has no profiled kernel of its own")
        plan, solution = make_plan(baseline), baseline
    elif options.selection == "whole-graph" or options.measure:  # plans measured in place
        timings = PlanTimings(db, graph, meta.versions, meta.device_name)
        settings = Settings(
            options.refine_rounds,
            spread_s(options.min_time, options.time_budget),
            options.min_time,
            lambda message: _say(options, message),
        )
        if options.selection == "whole-graph":
            plan, solution = fastest_whole_graph(
                graph, found.candidates, profiles, solution, make_plan, timings, settings
            )
        else:

            def resolve(cost) -> Solution:
                return _select(graph, found, cost, options.solver_time_limit)[0]

            plan, solution = refine(
                graph, found.candidates, profiles, solution, make_plan, resolve, timings, settings
            )
    else:
        plan = make_plan(solution)
    plan.meta.alternatives = rejected_alternatives(solution, found.candidates, profiles)
    certify(report, measured_ms(solution, profiles))  # the plan kept, priced as its kernels were alone
    plan.meta.search = report.summary()
    plan.meta.decided_by = decided_by(plan)
    plan.meta.seconds = round(time.perf_counter() - started, 3)
    return plan


def _ceilings(db: ProfileDB, device: str, half: tuple[str, ...]) -> dict:
    """The device's copy and matmul ceilings, each the fastest measured now or kept from before."""
    import torch

    measured = dict(measure_ceilings(device, half))
    rates = {k: v for k, v in measured.items() if k != "seconds"}
    kept = db.raise_ceilings(device_name(device), f"torch {torch.__version__}", rates)
    return {**measured, **kept}


def _candidates(
    graph: Graph, fission: FissionResult, backends, options: OptimizeOptions
) -> tuple[CandidateSet, int, dict[str, KernelSpec]]:
    """The candidate kernels with the seeds (each partition and the whole graph as one kernel, the
    source model run whole): (candidates, how many seeds, the specs no subgraph gives)."""
    bounds = CandidateOptions(max_size=options.max_size)
    found = enumerate_candidates(graph, bounds)
    note = found.lowered_note(bounds.max_size, bounds.max_per_partition)
    if note:
        _say(options, note)
    alone = unfused(graph, [b.name for b in backends])
    seeds = add_seeds(graph, found, alone) if options.seeds else 0
    specs = {}
    original = original_model_seed(graph, fission.model) if options.seeds and fission.model else None
    if original:
        found.candidates.append(original[0])
        specs[original[0].key] = original[1]
        seeds += 1
    return found, seeds, specs


def _profile(
    graph: Graph, found: CandidateSet, backends, db: ProfileDB, specs: dict, ceilings: dict, options
) -> tuple[ProfileResult, SearchReport]:
    """Profiling, then the search with bounds. Without a budget everything is profiled; with one,
    what makes a plan alone (the source model, seeds, singles) within a share of it, and the search
    spends the rest on the kernels its solutions use."""
    popts = ProfileOptions(
        device=options.device,
        jobs=options.jobs,
        time_budget=options.time_budget,
        progress=options.progress,
        min_time=options.min_time,
        executor=options.executor,
        ray_address=options.ray_address,
        whole_graph=True,
    )
    with Profiler(graph, found, backends, db, popts, specs) as profiler:
        budget = options.time_budget
        end = None if budget is None else profiler.started + budget
        queue = profiler.queue()
        if budget is not None:
            queue = [job for job in queue if essential(job)]
        profiler.measure(queue, None if budget is None else profiler.started + PRIORITY_SHARE * budget)
        profiler.cover()  # (where those are no plan: one backend, Inductor, and no seeds)
        if options.selection != "optimal":
            _cover_selection(profiler, options.selection)
        floors = least_calls(profiler, backends)
        report = search_profiler(
            graph,
            found,
            profiler,
            end,
            ceilings,
            floors,
            options.solver_time_limit,
            lambda m: _say(options, m),
        )
    profiles = profiler.result
    report.profiling_seconds = profiles.seconds
    return profiles, report


def _cover_selection(profiler: Profiler, selection: str) -> None:
    """What an ablation's plan needs, whatever the time: the whole primitive graph in every
    backend, or every primitive alone for the greedy plan (in the backends that compile quickly,
    then in Inductor where none of them ran it)."""
    queue = profiler.queue()
    if selection == "whole-graph":
        profiler.measure([job for job in queue if job[0].key.startswith(WHOLE_GRAPH_PREFIX)], None)
        return
    singles = [job for job in queue if len(job[0].graph.nodes) == 1]
    inductor = [job for job in singles if job[1].name.startswith("inductor")]
    profiler.measure([job for job in singles if not job[1].name.startswith("inductor")], None)
    profiler.measure([job for job in inductor if not profiler.ran(job[0].key)], None)


def _say(options: OptimizeOptions | None, message: str) -> None:
    """A line of progress on stderr (the phases before and after profiling take seconds too)."""
    if options is not None and options.progress:
        print(f"korch: {message}", file=sys.stderr, flush=True)
