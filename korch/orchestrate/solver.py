"""Kernel selection: the binary linear program (HiGHS through scipy), and a greedy baseline.

Per partition, one binary variable per candidate (at its best backend's cost). Minimise the summed
latency such that every value the partition must hand on (graph outputs, values read by later
partitions) is written by a chosen kernel, and every value a chosen kernel reads from inside the
partition is written by a chosen kernel too. Kernels may overlap (recomputation). Multi-output
kernels can need each other's outputs; such a cycle is cut off and the program solved again."""

from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass, field

import numpy as np
from scipy.optimize import LinearConstraint, milp
from scipy.sparse import coo_matrix

from korch.config import MAX_CUTS
from korch.errors import KorchError
from korch.ir.graph import Graph
from korch.search.candidates import Candidate
from korch.search.partition import Partition

DEBUG = False


@dataclass(frozen=True)
class Choice:
    candidate: Candidate
    backend: str
    cost_ms: float


@dataclass
class Solution:
    chosen: list[Choice]  # in a valid execution order
    status: str = "optimal"
    gap: float = 0.0
    objective_ms: float = 0.0
    seconds: float = 0.0
    cuts: int = 0
    partitions: list[dict] = field(default_factory=list)

    def summary(self) -> dict:
        return {
            "status": self.status,
            "gap": self.gap,
            "seconds": round(self.seconds, 4),
            "max_partition_seconds": max((p["seconds"] for p in self.partitions), default=0.0),
            "objective_ms": round(self.objective_ms, 6),
            "cycle_cuts": self.cuts,
        }


@dataclass
class _Problem:
    """One partition's candidates and the values that tie them together."""

    candidates: list[Candidate]
    costs: np.ndarray
    backends: list[str]
    required: list[str]
    internal: set[str]  # values computed inside the partition
    providers: dict[str, list[int]]
    covering: dict[int, list[int]]  # primitive -> candidates containing it


def _problem(graph: Graph, part: Partition, candidates: list[Candidate], costs) -> _Problem:
    nodes = graph.nodes[part.start : part.stop]
    internal = {v for n in nodes for v in n.outputs}
    readers = graph.consumers()
    index = {v: i for i, n in enumerate(graph.nodes) for v in n.outputs}
    outputs = set(graph.outputs)
    required = [
        v
        for v in sorted(internal)
        if v in outputs or any(not part.start <= index[r.outputs[0]] < part.stop for r in readers.get(v, []))
    ]
    usable, cost, backend = [], [], []
    for c in candidates:
        ms, name = costs(c.key)
        if np.isfinite(ms):
            usable.append(c)
            cost.append(ms)
            backend.append(name)
    keep = _undominated(graph, usable, cost)
    usable = [usable[i] for i in keep]
    cost = [cost[i] for i in keep]
    backend = [backend[i] for i in keep]
    providers: dict[str, list[int]] = defaultdict(list)
    for i, c in enumerate(usable):
        for v in c.outputs:
            providers[v].append(i)
    for v in required:
        if not providers[v]:
            raise KorchError(f"no profiled kernel computes {v!r}: every backend failed on its producer")
    covering: dict[int, list[int]] = defaultdict(list)
    for i, c in enumerate(usable):
        for n in c.nodes:
            covering[n].append(i)
    return _Problem(usable, np.array(cost, dtype=float), backend, required, internal, providers, covering)


def _mutual(graph: Graph, n: int, rest: frozenset) -> bool:
    """Do primitive n and the set `rest` each read a value the other computes (no valid order)?"""
    node = graph.nodes[n]
    rest_outputs = {v for i in rest for v in graph.nodes[i].outputs}
    reads_rest = any(v in rest_outputs for v in node.inputs)
    return reads_rest and any(v in node.outputs for i in rest for v in graph.nodes[i].inputs)


def _undominated(graph: Graph, candidates: list[Candidate], cost: list[float]) -> list[int]:
    """Indices of the candidates worth offering the solver. A candidate is dropped when splitting
    off one primitive (recursively) is no more expensive (the pieces compute the same values from
    the same inputs, in some order unless each reads the other), or when
    another candidate writes the same values from fewer inputs for no more time. Either way the
    optimum is unchanged while the program shrinks."""
    by_nodes = {frozenset(c.nodes): i for i, c in enumerate(candidates)}
    same_outputs: dict[frozenset, list[int]] = defaultdict(list)
    for i, c in enumerate(candidates):
        same_outputs[frozenset(c.outputs)].append(i)
    best: dict[frozenset, float] = {}
    keep = []
    for i in sorted(range(len(candidates)), key=lambda i: len(candidates[i].nodes)):
        nodes = frozenset(candidates[i].nodes)
        split = float("inf")
        if len(nodes) > 1:
            for n in nodes:
                rest, single = nodes - {n}, frozenset((n,))
                if rest in by_nodes and single in by_nodes and not _mutual(graph, n, rest):
                    split = min(split, best[rest] + best[single])
        best[nodes] = min(cost[i], split)
        if cost[i] < split and not _beaten(i, candidates, cost, same_outputs):
            keep.append(i)
    return sorted(keep)


def _beaten(i: int, candidates: list[Candidate], cost: list[float], same_outputs) -> bool:
    """Another candidate writes the same values, for no more time, from a subset of the inputs."""
    c = candidates[i]
    inputs = set(c.inputs)
    for j in same_outputs[frozenset(c.outputs)]:
        if j != i and (cost[j], j) < (cost[i], i) and inputs.issuperset(candidates[j].inputs):
            return True
    return False


def execution_order(chosen: list[Candidate], available: set[str]) -> tuple[list[int], list[int]]:
    """(an order in which every kernel's inputs exist beforehand, the kernels that can never run)."""
    ready = set(available)
    order, waiting = [], list(range(len(chosen)))
    progress = True
    while waiting and progress:
        progress = False
        for i in list(waiting):
            if all(v in ready for v in chosen[i].inputs):
                order.append(i)
                ready.update(chosen[i].outputs)
                waiting.remove(i)
                progress = True
    return order, waiting


def _solve_partition(p: _Problem, available: set[str], deadline: float):
    n = len(p.candidates)
    rows, cols, vals, lower = [], [], [], []

    def add_row(entries: dict[int, float], lb: float) -> None:
        r = len(lower)
        for col, val in entries.items():
            rows.append(r)
            cols.append(col)
            vals.append(val)
        lower.append(lb)

    for v in p.required:  # produced at least once
        add_row({i: 1.0 for i in p.providers[v]}, 1.0)
    # Every primitive of the partition feeds a required value, so some chosen kernel computes it.
    # Implied for integer choices, but it stops the relaxation from paying only a fraction of an
    # expensive primitive (a matmul) far upstream of several fractional alternatives.
    for members in p.covering.values():
        add_row({i: 1.0 for i in members}, 1.0)
    # Inputs from inside the partition must be written by a chosen kernel. Kernels that write only
    # v are alternatives: an optimal choice never takes two (drop the later one and its readers use
    # the earlier), so they share one row per input, which keeps the relaxation from paying a
    # fraction of an input for each of several fractional alternatives.
    groups: dict[tuple[str, str], list[int]] = defaultdict(list)
    for i, c in enumerate(p.candidates):
        alone = c.outputs[0] if len(c.outputs) == 1 else None
        for u in c.inputs:
            if u in p.internal:
                groups[(alone or f"#{i}", u)].append(i)
        if alone is not None:
            groups[(alone, "")].append(i)
    # One continuous variable per such input u, "u is written" (0..1), carries the providers: a
    # row per group (written_u >= its members) and one per u (providers >= written_u). Writing
    # the providers into every group's row instead is the same program, but its nonzeros grow as
    # groups times providers: on a transformer layer HiGHS spent its time on them, then solved at its root.
    written: dict[str, int] = {}
    for (_, u), members in groups.items():
        if not u:
            if len(members) > 1:
                add_row({i: -1.0 for i in members}, -1.0)  # at most one of them
            continue
        column = written.setdefault(u, n + len(written))
        add_row({column: 1.0, **{i: -1.0 for i in members}}, 0.0)
    for u, column in written.items():
        add_row({column: -1.0, **{j: 1.0 for j in p.providers.get(u, [])}}, 0.0)
    width = n + len(written)
    costs = np.concatenate([p.costs * 1000.0, np.zeros(len(written))])
    integrality = np.concatenate([np.ones(n), np.zeros(len(written))])
    cuts = 0
    while True:
        a = coo_matrix((vals, (rows, cols)), shape=(len(lower), width)).tocsr()
        res = milp(
            costs,
            integrality=integrality,
            bounds=(0, 1),
            constraints=[LinearConstraint(a, np.array(lower), np.inf)],
            options={"time_limit": max(deadline - time.time(), 1.0), "mip_rel_gap": 0.0, "disp": DEBUG},
        )
        if res.x is None:
            raise KorchError(f"kernel selection failed: {res.message}")
        picked = [i for i in range(n) if res.x[i] > 0.5]
        order, stuck = execution_order([p.candidates[i] for i in picked], available)
        if not stuck:
            status = "optimal" if res.status == 0 else ("time_limit" if res.status == 1 else str(res.status))
            gap = float(getattr(res, "mip_gap", 0.0) or 0.0)
            return [picked[i] for i in order], status, gap, float(res.fun) / 1000.0, cuts
        # the stuck kernels only wait on each other: forbid choosing all of them unless some other
        # kernel that writes one of the values they wait for is chosen as well
        members = {picked[i] for i in stuck}
        ready = available.union(*(p.candidates[picked[i]].outputs for i in order))
        waited = {u for i in members for u in p.candidates[i].inputs if u not in ready}
        alternatives = {j for u in waited for j in p.providers.get(u, []) if j not in members}
        entries = {i: -1.0 for i in members}
        entries.update({j: 1.0 for j in alternatives})
        add_row(entries, 1.0 - len(members))
        cuts += 1
        if cuts > MAX_CUTS:
            raise KorchError(f"kernel selection still cyclic after {MAX_CUTS} cuts")


def solve(
    graph: Graph, partitions: list[Partition], candidates: list[Candidate], costs, time_limit: float = 60.0
) -> Solution:
    """costs(key) -> (milliseconds, backend) with inf for candidates no backend could run.
    `time_limit`: seconds for all partitions together (each gets at least one)."""
    start = time.perf_counter()
    deadline = time.time() + time_limit
    by_part: dict[int, list[Candidate]] = defaultdict(list)
    for c in candidates:
        by_part[c.partition].append(c)
    available = set(graph.inputs) | set(graph.constants)
    solution = Solution([])
    statuses, gaps = [], []
    for part in partitions:
        t0 = time.perf_counter()
        p = _problem(graph, part, by_part[part.index], costs)
        picked, status, gap, objective, cuts = _solve_partition(p, available, deadline)
        for i in picked:
            solution.chosen.append(Choice(p.candidates[i], p.backends[i], float(p.costs[i])))
            available.update(p.candidates[i].outputs)
        solution.objective_ms += objective
        solution.cuts += cuts
        statuses.append(status)
        gaps.append(gap)
        solution.partitions.append(
            {
                "index": part.index,
                "candidates": len(p.candidates),
                "status": status,
                "seconds": round(time.perf_counter() - t0, 4),
            }
        )
    solution.status = "optimal" if all(s == "optimal" for s in statuses) else ",".join(sorted(set(statuses)))
    solution.gap = max(gaps, default=0.0)
    solution.seconds = time.perf_counter() - start
    return solution


def greedy(graph: Graph, partitions: list[Partition], candidates: list[Candidate], costs) -> Solution:
    """The Inductor-like baseline: take fusions in order of saved time, never overlapping, and run
    every primitive left over on its own."""
    start = time.perf_counter()
    singles = {c.nodes[0]: c for c in candidates if len(c.nodes) == 1}
    single_cost = {i: costs(c.key)[0] for i, c in singles.items()}
    scored = []
    for c in candidates:
        ms, backend = costs(c.key)
        if len(c.nodes) > 1 and not c.seed and np.isfinite(ms):
            saved = sum(single_cost.get(i, np.inf) for i in c.nodes) - ms
            if saved > 0:
                scored.append((saved, c, backend, ms))
    scored.sort(key=lambda item: -item[0])
    covered: set[int] = set()
    chosen: list[Choice] = []
    available = set(graph.inputs) | set(graph.constants)
    for _, c, backend, ms in scored:
        if covered.intersection(c.nodes):
            continue
        trial = chosen + [Choice(c, backend, ms)]
        if len(c.outputs) > 1 and not _acyclic(graph, trial, singles, costs, available):
            continue
        chosen = trial
        covered.update(c.nodes)
    for i, c in singles.items():
        if i not in covered:
            ms, backend = costs(c.key)
            if not np.isfinite(ms):
                raise KorchError(f"no profiled kernel runs primitive {i} ({graph.nodes[i].prim.value})")
            chosen.append(Choice(c, backend, ms))
    order, stuck = execution_order([ch.candidate for ch in chosen], available)
    if stuck:
        raise KorchError("greedy selection produced a cycle")
    ordered = [chosen[i] for i in order]
    return Solution(ordered, "greedy", 0.0, sum(ch.cost_ms for ch in ordered), time.perf_counter() - start)


def _acyclic(graph, chosen: list[Choice], singles, costs, available) -> bool:
    covered = {i for ch in chosen for i in ch.candidate.nodes}
    kernels = [ch.candidate for ch in chosen] + [c for i, c in singles.items() if i not in covered]
    return not execution_order(kernels, available)[1]
