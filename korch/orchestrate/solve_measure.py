"""Solve, measure, re-solve: the binary linear program over measured costs and lower bounds.

Every (candidate, backend) pair has a price before anything is compiled: its measured latency
when the profile database has one, else a lower bound from its own work
(korch.orchestrate.bounds). The program is solved with those prices; the kernels of the solution
that are not measured yet are compiled and timed; and it is solved again, until the solution uses
only measured kernels or the time is up.
Each objective is a lower bound on the optimum over the whole candidate space (every price is at
most the truth), so when the last solution is all measured the plan is optimal although most
candidates were never compiled; otherwise (plan - bound) / plan is the certified gap."""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass, field

from korch.config import ROUND_MOST
from korch.errors import KorchError
from korch.ir.graph import Graph, GraphBuilder
from korch.ir.prims import Prim, TensorType
from korch.ir.work import Work, kernel_work
from korch.orchestrate.bounds import Observation, Rates, capable_backends
from korch.orchestrate.solver import Choice, Solution, solve
from korch.profile.profiler import Profiler
from korch.search.candidates import WHOLE_GRAPH, CandidateSet
from korch.search.kernel import SOURCE_MODEL_PREFIX, KernelSpec


@dataclass
class SearchReport:
    """What `korch optimize --json` reports as "search" (../shared/CONTRACT.md)."""

    candidates: int = 0  # (candidate key, backend) pairs
    measured: int = 0
    bounded: int = 0
    pruned: int = 0  # pairs no backend can run (unsupported) or that failed when measured
    pruned_reasons: dict[str, int] = field(default_factory=dict)
    rounds: int = 0
    lower_bound_ms: float | None = None
    plan_ms: float | None = None
    certified_gap: float | None = None
    profiling_seconds: float = 0.0
    measured_in_rounds: int = 0  # pairs the rounds compiled and timed
    partitions: list[dict] = field(default_factory=list)  # the counts per partition (-1: whole graph)
    # each pruned pair's candidates: "backend: why" -> partition -> their primitives as ranges,
    # each candidate's after a ";" ("3-7,9;12", the source model run whole as "source model")
    pruned_candidates: dict[str, dict[str, str]] = field(default_factory=dict)

    def summary(self) -> dict:
        def ms(x):
            return None if x is None else round(x, 6)

        return {
            "candidates": self.candidates,
            "measured": self.measured,
            "bounded": self.bounded,
            "pruned": self.pruned,
            "pruned_reasons": dict(sorted(self.pruned_reasons.items(), key=lambda kv: -kv[1])[:10]),
            "rounds": self.rounds,
            "measured_in_rounds": self.measured_in_rounds,
            "lower_bound_ms": ms(self.lower_bound_ms),
            "plan_ms": ms(self.plan_ms),
            "certified_gap": None if self.certified_gap is None else round(self.certified_gap, 6),
            "profiling_seconds": round(self.profiling_seconds, 3),
            "partitions": self.partitions,
            "pruned_candidates": self.pruned_candidates,
        }


class Prices:
    """The price of each candidate key: (ms, backend) at its cheapest backend, each pair priced
    at its measurement, or at its lower bound while it is pending in the profiler."""

    def __init__(self, profiler: Profiler, ceilings: dict | None, floors: list[Observation] = ()):
        self.profiler = profiler
        self.ceilings = ceilings
        self.floors = list(floors)  # least_calls
        self._work: dict[str, Work] = {}
        # which backends can run each class of linear primitive alone: every pair pending or measured
        profiles = profiler.result.profiles
        ran = [(k, b) for k, per in profiles.items() for b, prof in per.items() if prof.cost_ms < math.inf]
        pairs = [*self.profiler.pending, *ran]
        self.capable = capable_backends((self.work(key), backend) for key, backend in pairs)
        self.rates = self._rates()

    def work(self, key: str) -> Work:
        if key not in self._work:
            self._work[key] = kernel_work(self.profiler.specs[key].graph)
        return self._work[key]

    def _rates(self) -> Rates:
        observations = [
            Observation(backend, self.work(key), prof.cost_ms, prof.min_ms)
            for key, per_backend in self.profiler.result.profiles.items()
            for backend, prof in per_backend.items()
            if prof.cost_ms < math.inf
        ]
        return Rates([*observations, *self.floors], self.ceilings, self.capable)

    def refresh(self) -> None:
        """New measurements may have raised the fastest rates seen."""
        self.rates = self._rates()

    def __call__(self, key: str) -> tuple[float, str | None]:
        return self._price(key, {})

    def _price(self, key: str, scale: dict[str, float]) -> tuple[float, str | None]:
        """(ms, backend) of the key's cheapest pair: measured, or pending at its bound times its
        backend's `scale` (1 where not given)."""
        best = self.profiler.result.cost(key)
        for backend in self.profiler.backend_names:
            if (key, backend) in self.profiler.pending:
                ms = self.rates.bound_ms(self.work(key), backend) * scale.get(backend, 1.0)
                if ms < best[0]:
                    best = (ms, backend)
        return best

    def measured(self, key: str, backend: str) -> bool:
        return (key, backend) not in self.profiler.pending

    def probes(self, pairs: list[tuple[str, str]]) -> list[tuple[str, str]]:
        """The pending pairs that run alone a linear primitive of a class that the kernels of
        `pairs` hold and whose rate the bounds cannot use yet (some backend that can run it alone
        has not; korch.orchestrate.bounds): one pair per class and backend, none of `pairs`
        itself. One such compile tightens the bound of every kernel holding the class,
        where measuring the kernels themselves tightens one each."""
        wanted = {c for key, _ in pairs for c, _ in self.work(key).linear if c not in self.rates.class_rate}
        asked, found = set(pairs), {}
        for key, backend in self.profiler.pending:
            work = self.work(key)
            if work.alone and work.linear[0][0] in wanted and (key, backend) not in asked:
                found.setdefault((work.linear[0][0], backend), (key, backend))
        return list(found.values())

    def rivals(self, key: str, backend: str) -> list[tuple[str, str]]:
        """The key's other pairs pending: the same kernel in the other backends that can run it."""
        return [
            (key, b)
            for b in self.profiler.backend_names
            if b != backend and (key, b) in self.profiler.pending
        ]

    def estimates(self):
        """Prices with each pending pair at its bound times its backend's median ratio of
        measured to bound (at least 1; the largest of these for a backend with none measured):
        what orders the measuring, never what certifies."""
        ratios: dict[str, list[float]] = {}
        for key, per_backend in self.profiler.result.profiles.items():
            for backend, prof in per_backend.items():
                if prof.cost_ms < math.inf:
                    bound = self.rates.bound_ms(self.work(key), backend)
                    ratios.setdefault(backend, []).append(prof.cost_ms / bound if bound > 0 else 1.0)
        scale = {b: max(1.0, statistics.median(r)) for b, r in ratios.items()}
        # a backend with nothing measured yet is as far from its bounds as the furthest one, not
        # nearer than every other (its candidates would all be measured first)
        unseen = max(scale.values(), default=1.0)
        scale.update({b: unseen for b in self.profiler.backend_names if b not in scale})
        return lambda key: self._price(key, scale)


PROBE_PREFIX = "probe-"  # the key prefix of each backend's least kernel (least_calls)


def _probe_specs() -> list[KernelSpec]:
    """The least kernels a backend can run: one element added, or a 1x1 matmul (vendor runs only
    linear primitives)."""
    specs = []
    for prim in (Prim.ADD, Prim.MATMUL):
        b = GraphBuilder()
        x, y = (b.input(n, TensorType((1, 1), "float32")) for n in ("x", "y"))
        (out,) = b.emit(prim, (x, y))
        graph = b.build([out], ["out0"], name=PROBE_PREFIX + prim.value)
        specs.append(KernelSpec(PROBE_PREFIX + prim.value, graph, ("x", "y"), (out,)))
    return specs


def least_calls(profiler: Profiler, backends) -> list[Observation]:
    """Each backend's least kernel, measured once per profile database (then kept there like any
    other kernel): the floor of the backend's launch cost that the bounds use, where the kernels
    measured so far are all larger."""
    found = []
    for backend in backends:
        spec = next((s for s in _probe_specs() if backend.supports(s, profiler.options.device) is None), None)
        if spec is None:
            continue
        hit = profiler.db.lookup(spec.key, backend.name, backend.version(), profiler.device)
        if hit is None:
            hit = profiler.measure_alone(spec, backend)
        # (one that failed gives its backend no floor: bytes and FLOPs still bound it)
        if hit.cost_ms < math.inf:
            found.append(Observation(backend.name, kernel_work(spec.graph), hit.cost_ms))
    return found


def _best(found: CandidateSet, solution: Solution, cost) -> Solution:
    """The per-partition optimum, or a whole-graph kernel where one is priced lower."""
    best = solution
    for whole in (c for c in found.candidates if c.partition == WHOLE_GRAPH):
        ms, backend = cost(whole.key)
        if ms < best.objective_ms:
            best = Solution([Choice(whole, backend, ms)], solution.status, solution.gap, ms)
    return best


def search(
    graph: Graph,
    found: CandidateSet,
    prices,
    measure,
    deadline: float | None,
    time_limit: float = 60.0,
    say=lambda message: None,
) -> tuple[float | None, int]:
    """Solve with `prices` (measured costs and bounds: a Prices), `measure` the (key, backend)
    pairs the solution uses that are not measured yet, solve again, until the solution is all
    measured or `deadline` (a time.time()) passes. Where `prices` has estimates, what their
    solution uses unmeasured is measured too (bounds several times below the truth would
    otherwise send each round after the most optimistic candidates), beside the bound's
    solution (which holds the bound down until measured): the kernels priced highest in either
    solution, and where `prices` has rivals, each with the same kernel in its other backends, at
    most ROUND_MOST pairs a round (then the program is solved again). Where `prices` has probes,
    the linear primitives alone that would let those kernels' classes bound them are measured
    before the kernels. (The last objective, a lower bound on the optimum, or None where the
    program was not solved to optimality; the rounds of measuring.)"""
    rounds, lower = 0, None
    while True:
        try:
            solution = _solve(graph, found, prices, time_limit)
        except KorchError:  # some value nothing can compute (every backend failed on it): no bound
            return None, rounds
        lower = solution.objective_ms if solution.status == "optimal" else None
        todo = _unmeasured(solution, prices)
        if not todo or deadline is not None and time.time() >= deadline:
            return lower, rounds
        weight = _weights(solution)
        if hasattr(prices, "estimates"):  # what the calibrated estimates choose, too
            guided = _solve(graph, found, prices.estimates(), time_limit)
            todo = list(dict.fromkeys([*_unmeasured(guided, prices), *todo]))
            for key, ms in _weights(guided).items():
                weight[key] = max(weight.get(key, 0.0), ms)
        probes = prices.probes(todo) if hasattr(prices, "probes") else []
        # classes' probes first: they may move the next solution elsewhere; else the kernels that
        # hold the most of the solutions, each with its rivals, a round's worth
        todo = probes or _heaviest_first(todo, weight, getattr(prices, "rivals", None))[:ROUND_MOST]
        say(
            f"search round {rounds + 1}: lower bound {solution.objective_ms:.3f} ms, "
            f"{len(todo)} {'class probes' if probes else 'kernels'} to measure"
        )
        measure(todo)
        rounds += 1
        prices.refresh()


def _solve(graph: Graph, found: CandidateSet, cost, time_limit: float) -> Solution:
    return _best(found, solve(graph, found.partitions, found.candidates, cost, time_limit), cost)


def _weights(solution: Solution) -> dict[str, float]:
    """key -> the ms the solution prices its uses of the key at, summed (a kernel of a repeated
    block is chosen once per block)."""
    weight: dict[str, float] = {}
    for choice in solution.chosen:
        weight[choice.candidate.key] = weight.get(choice.candidate.key, 0.0) + choice.cost_ms
    return weight


def _heaviest_first(
    pairs: list[tuple[str, str]], weight: dict[str, float], rivals=None
) -> list[tuple[str, str]]:
    """`pairs` by the weight of their keys, the heaviest first (a deadline cuts the lightest), each
    followed by its `rivals` (the key's pending pairs in the other backends), where given. A key's
    bounds differ between backends by their least calls only, so a solution that finds one pair
    slower than its bound takes the same key in the next backend: measured together, a key rises
    to its true price in one round, not in one round per backend."""
    ordered = sorted(pairs, key=lambda pair: -weight.get(pair[0], 0.0))
    if rivals is None:
        return ordered
    return list(dict.fromkeys(p for pair in ordered for p in (pair, *rivals(*pair))))


def _unmeasured(solution: Solution, prices) -> list[tuple[str, str]]:
    pairs = dict.fromkeys((c.candidate.key, c.backend) for c in solution.chosen)  # (a key may repeat)
    return [pair for pair in pairs if not prices.measured(*pair)]


def search_profiler(
    graph: Graph,
    found: CandidateSet,
    profiler: Profiler,
    deadline: float | None,
    ceilings: dict | None = None,
    floors: list[Observation] = (),
    time_limit: float = 60.0,
    say=lambda message: None,
) -> SearchReport:
    """search() over a Profiler's measurements, measuring with it; the report without the plan."""
    report = SearchReport()

    def measure(pairs: list[tuple[str, str]]) -> None:
        before = len(profiler.pending)
        profiler.measure([profiler.pending[pair] for pair in pairs], deadline, cover=False)
        report.measured_in_rounds += before - len(profiler.pending)

    prices = Prices(profiler, ceilings, floors)
    report.lower_bound_ms, report.rounds = search(graph, found, prices, measure, deadline, time_limit, say)
    _count(report, profiler, found)
    return report


def _count(report: SearchReport, profiler: Profiler, found: CandidateSet) -> None:
    """Every (key, backend) pair as measured, bounded (pending) or pruned (unsupported, or failed
    when measured), in all and per partition."""
    parts: dict[str, set[int]] = {}
    places: dict[str, list[tuple[int, str]]] = {}  # key -> (partition, primitives) of each candidate
    for c in found.candidates:
        parts.setdefault(c.key, set()).add(c.partition)
        where = "source model" if c.key.startswith(SOURCE_MODEL_PREFIX) else node_ranges(c.nodes)
        places.setdefault(c.key, []).append((c.partition, where))
    unsupported: dict[str, list[tuple[str, str]]] = {}
    for (key, backend), why in profiler.result.pruned.items():
        unsupported.setdefault(key, []).append((backend, why))
    per_part: dict[int, dict] = {}
    reasons: dict[str, int] = {}
    listed: list[tuple[str, int, str]] = []  # (why, partition, primitives) of each pruned candidate
    for key, per_backend in profiler.result.profiles.items():
        states = [
            ("measured" if p.cost_ms < math.inf else "pruned", b, p.reason) for b, p in per_backend.items()
        ]
        states += [("bounded", b, None) for b in profiler.backend_names if (key, b) in profiler.pending]
        states += [("pruned", b, why) for b, why in unsupported.get(key, ())]
        for state, backend, why in states:
            setattr(report, state, getattr(report, state) + 1)
            full = f"{backend}: {why or 'failed'}"
            line = full[:100]
            if state == "pruned":
                reasons[line] = reasons.get(line, 0) + 1
                listed += [(full, part, nodes) for part, nodes in places.get(key, ())]
            for part in parts.get(key, ()):
                entry = per_part.setdefault(
                    part, {"partition": part, "measured": 0, "bounded": 0, "pruned": {}}
                )
                if state == "pruned":
                    entry["pruned"][line] = entry["pruned"].get(line, 0) + 1
                else:
                    entry[state] += 1
    report.pruned_reasons = reasons
    grouped: dict[str, dict[str, list[str]]] = {}
    for why, part, nodes in sorted(listed, key=lambda row: (row[0], row[1], _first(row[2]), row[2])):
        grouped.setdefault(why, {}).setdefault(str(part), []).append(nodes)
    report.pruned_candidates = {
        why: {part: ";".join(nodes) for part, nodes in parts.items()} for why, parts in grouped.items()
    }
    report.partitions = [per_part[i] for i in sorted(per_part)]
    report.candidates = report.measured + report.bounded + report.pruned


def node_ranges(nodes) -> str:
    """Primitive indices as sorted ranges: (3, 4, 5, 9) -> "3-5,9"."""
    runs: list[list[int]] = []
    for i in sorted(nodes):
        if runs and i == runs[-1][1] + 1:
            runs[-1][1] = i
        else:
            runs.append([i, i])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


def node_indices(ranges: str) -> list[int]:
    """node_ranges undone: "3-5,9" -> [3, 4, 5, 9]."""
    out: list[int] = []
    for run in ranges.split(","):
        a, _, b = run.partition("-")
        out += range(int(a), int(b or a) + 1)
    return out


def _first(ranges: str) -> int:
    """The first primitive of node_ranges' text (-1 for the source model)."""
    return int(ranges.split(",")[0].split("-")[0]) if ranges[0].isdigit() else -1


def certify(report: SearchReport, plan_ms: float) -> None:
    """The plan's measured cost and the certified gap against the last lower bound (none where
    some kernel of the plan has no measurement: plan_ms None)."""
    report.plan_ms = plan_ms if math.isfinite(plan_ms) else None
    if report.lower_bound_ms is not None and plan_ms > 0 and math.isfinite(plan_ms):
        report.certified_gap = max(0.0, (plan_ms - report.lower_bound_ms) / plan_ms)


def measured_ms(solution: Solution, profiles) -> float:
    """What the solution's kernels cost as each was measured alone (profiles: a ProfileResult), the
    price certify sets against the lower bound: in-place timings, which may have chosen the plan,
    are not measurements of the kernels alone. inf where one of them was not measured."""
    total = 0.0
    for choice in solution.chosen:
        measured = profiles.profiles.get(choice.candidate.key, {}).get(choice.backend)
        total += measured.cost_ms if measured is not None else math.inf
    return total


def database_kernels(path, device: str | None = None) -> list[tuple[str, str, float, float | None, Graph]]:
    """(key, backend, median ms, fastest ms, kernel graph) of every kernel a profile database holds
    as measured (on `device`, or any), the source model run whole left out: an opaque kernel whose
    work no bound sees."""
    import json

    from korch.ir.serialize import load_graph_json

    query = "SELECT key, backend, median_ms, min_ms, spec, device FROM profiles WHERE status = 'ok'"
    return [
        (key, backend, ms, fastest, load_graph_json(json.loads(spec)))
        for key, backend, ms, fastest, spec, on in _read(path, query)
        if (device is None or on == device) and ms is not None and not key.startswith(SOURCE_MODEL_PREFIX)
    ]


def database_observations(path, device: str | None = None) -> list[tuple[str, Observation]]:
    """(key, observation) of each kernel of database_kernels: what
    korch.orchestrate.bounds.violations checks the bounds against."""
    return [
        (key, Observation(backend, kernel_work(g), ms, fastest))
        for key, backend, ms, fastest, g in database_kernels(path, device)
    ]


def database_ceilings(path, device: str | None = None) -> dict[str, float]:
    """The fastest of each ceiling a profile database keeps (korch.measure.roofline) for a device
    (its name with its threads, as the ceilings table has it; None: a database of one device):
    what the bounds of a run that used it rose to, for checking them afterwards."""
    where, args = ("WHERE device = ?", (device,)) if device is not None else ("", ())
    return dict(_read(path, f"SELECT name, MAX(value) FROM ceilings {where} GROUP BY name", args))


def _read(path, query: str, args: tuple = ()) -> list[tuple]:
    """The rows of one query on a profile database opened read-only (a finished run's, for checks)."""
    import sqlite3

    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return conn.execute(query, args).fetchall()
    finally:
        conn.close()
