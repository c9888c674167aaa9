"""Plans measured in place, the cost model corrected by those timings and re-solved, and a runoff
between the plans that measured close: the last step of `korch optimize` (korch.pipeline), which
hands it the first solution, a way to build a plan and a way to solve again. Every measurement of a
plan, and every runoff, is kept in the profile database (korch.profile.plan_timing): a warm run
decides by them without compiling a plan."""

from __future__ import annotations

import dataclasses
import logging
import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

from korch.config import IN_PLACE_FLOOR, RUNOFF, RUNOFF_ROUNDS, WHOLE_GRAPH_REACH
from korch.errors import KorchError, first_line
from korch.ir.graph import Graph
from korch.measure import placement
from korch.measure.timing import calm_side_by_side, consistently_faster, rounds_faster, second_look
from korch.orchestrate.solver import Choice, Solution
from korch.plan.plan import Plan, is_source_model
from korch.plan.runtime import interleave, measure_in_place
from korch.profile.plan_timing import PlanTimings
from korch.search.candidates import Candidate
from korch.search.kernel import WHOLE_GRAPH_PREFIX

log = logging.getLogger("korch")


@dataclass(frozen=True)
class Settings:
    """How refining measures: re-solves after the first plan, the seconds each in-place
    measurement spreads over, the runoff's least block of calls per plan, and where progress goes."""

    rounds: int = 2
    spread_s: float = 0.0
    block_s: float = 0.02
    say: Callable[[str], None] = lambda message: None


def extra_per_kernel(timed: list[tuple[str, float, float]]) -> dict[str, float]:
    """backend -> what running inside a plan adds to each of its kernels, from one plan's
    (backend, ms alone, ms in place): the median difference, over two kernels or more. It may be
    negative: a kernel that finds its inputs in the cache its neighbour just wrote runs faster
    in place than timed alone, and is priced so. One kernel's difference is a whole model's
    noise, not a per-kernel cost: taken as one it would reprice every other kernel of its
    backend by a whole model's noise."""
    deltas: dict[str, list[float]] = {}
    for backend, alone, in_place in timed:
        deltas.setdefault(backend, []).append(in_place - alone)
    return {b: statistics.median(d) for b, d in deltas.items() if len(d) > 1}


def corrected(alone_ms: float, extra_ms: float) -> float:
    """A kernel's isolated time with its backend's extra time per kernel in a plan added: lower
    where the extra is negative, but never below IN_PLACE_FLOOR of the isolated time (a median
    taken from other kernels may exceed a small kernel's whole time)."""
    return max(alone_ms + extra_ms, alone_ms * IN_PLACE_FLOOR)


def chosen(solution: Solution) -> frozenset:
    """The solution's (kernel key, backend) pairs."""
    return frozenset((c.candidate.key, c.backend) for c in solution.chosen)


def refine(
    graph: Graph,
    candidates: list[Candidate],
    profiles,
    solution: Solution,
    make_plan: Callable[[Solution], Plan],
    resolve: Callable[[Callable], Solution],
    timings: PlanTimings,
    settings: Settings = Settings(),
) -> tuple[Plan, Solution]:
    """Kernels timed alone run faster than inside the plan (warm caches, thread pools left awake by
    the previous call, no runtime bookkeeping), so each plan is measured in place: those timings
    replace the isolated ones for its kernels, every other kernel of a backend is charged that
    backend's median extra time per call, and the program is solved again (`resolve`, given the
    corrected cost). The plan measured fastest wins."""
    in_place: dict[tuple[str, str], float] = {}
    extra: dict[str, float] = {}  # backend -> median (in place - alone) per kernel

    def adjusted(key: str, backend: str, ms: float) -> float:
        return in_place.get((key, backend), corrected(ms, extra.get(backend, 0.0)))

    def calibrate(plan: Plan) -> None:
        timed = []
        for k, ms in zip(plan.kernels, plan.meta.measured["kernels_ms"]):
            in_place[(k.spec.key, k.backend)] = ms
            alone = profiles.profiles.get(k.spec.key, {}).get(k.backend)
            if alone is not None and alone.cost_ms < math.inf:
                timed.append((k.backend, alone.cost_ms, ms))
        extra.update(extra_per_kernel(timed))

    best, seen, measured_plans = None, set(), []

    def measure(solution: Solution, calibrating: bool = True) -> None:
        nonlocal best
        seen.add(chosen(solution))
        plan = make_plan(solution)
        kept = _in_place(plan, solution, timings, settings)
        measured = plan.meta.measured
        if not priced_alone(solution, profiles):  # (by in-place timings: the prediction checks nothing)
            measured["predicted_over_measured"] = None
        measured_plans.append((plan, solution))
        settings.say(
            f"plan {len(measured_plans)} {'as measured in place before' if kept else 'measured in place'}: "
            f"{len(plan.kernels)} kernels, {measured['ms']:.3f} ms (predicted {plan.predicted_ms:.3f})"
            + (", other processes kept the CPU busy" if measured["disturbed"] else "")
        )
        # minima: a shared machine's interference inflates medians of a few runs, never minima
        if best is None or measured["min_ms"] < best[0].meta.measured["min_ms"]:
            best = (plan, solution)
        if calibrating:
            calibrate(plan)

    for _ in range(1 + settings.rounds):
        if chosen(solution) in seen:
            break
        measure(solution)
        solution = resolve(lambda key: profiles.cost(key, adjusted))
    # the plans of one whole-graph kernel (the source model in ONNX Runtime, the whole primitive
    # graph in each backend that ran it) are always measured too: an isolated timing disturbed by
    # a neighbour when it was profiled (the database keeps it) must not hide them. A neighbour
    # about doubles a timing: one isolated at WHOLE_GRAPH_REACH times the best measured is hopeless.
    for whole in whole_graph_solutions(graph, candidates, profiles, solution):
        reach = WHOLE_GRAPH_REACH * best[0].meta.measured["min_ms"]
        if chosen(whole) in seen or whole.objective_ms > reach:
            continue
        try:  # no re-solve follows, and its timing is a whole model
            measure(whole, calibrating=False)
        except Exception as e:  # built and run here, not in a worker: out of memory, say
            log.warning("korch: a whole-graph plan could not be measured in place (%s)", first_line(e, 160))
    best, report = runoff(best, measured_plans, settings, timings)
    _record(best[0], measured_plans, report, extra)
    return best


def _in_place(plan: Plan, solution: Solution, timings: PlanTimings, settings: Settings) -> bool:
    """`plan` (made of `solution`) measured in place, or the measurement `timings` kept for it, as
    plan.meta.measured (a copy of its own); whether it was kept."""
    key = timings.plan_key(chosen(solution))
    measured, kept = timings.in_place(key, lambda: measure_in_place(plan, spread_s=settings.spread_s))
    plan.meta.measured = dict(measured)
    return kept


def _record(best: Plan, measured_plans: list, report: dict | None, extra: dict[str, float]) -> None:
    """What refining measured, in the kept plan's metadata."""
    best.meta.refine = [
        {
            "kernels": len(plan.kernels),
            "predicted_ms": plan.predicted_ms,
            "measured_ms": plan.meta.measured["ms"],
            "min_ms": plan.meta.measured["min_ms"],
        }
        for plan, _ in measured_plans
    ]
    best.meta.runoff = report
    best.meta.extra_ms_per_kernel = {b: round(v, 6) for b, v in extra.items()}


def priced_alone(solution: Solution, profiles) -> bool:
    """Whether every chosen kernel is priced by its isolated timing."""
    alone = profiles.profiles
    return all(
        c.backend in alone.get(c.candidate.key, {}) and c.cost_ms == alone[c.candidate.key][c.backend].cost_ms
        for c in solution.chosen
    )


def runoff(best, measured: list, settings: Settings = Settings(), timings: PlanTimings | None = None):
    """Plans measured at different moments were compared by numbers a neighbour's burst may have
    doubled: the fastest and those within RUNOFF of it run again side by side (runtime.interleave:
    alternating blocks, a pause between them for the previous plan's spinning thread pools to go
    idle), RUNOFF_ROUNDS rounds spread over settings.spread_s, and the lowest median wins, except
    over the source model run whole: that plan is what ONNX Runtime would run anyway, and another
    replaces it only when consistently faster (korch.measure.timing.consistently_faster), not by a
    margin the machine's noise makes (two copies of one ONNX Runtime session differ by 2-4% side by
    side), if need be after a second look (korch.measure.timing.second_look). (best, what the
    runoff measured or None); a runoff between the same plans that `timings` kept is not run again."""
    close = contenders(best, measured)
    if len(close) < 2:
        return best, None
    settings.say(f"{len(close)} plans within {RUNOFF:g}x of the fastest run again side by side")
    if timings is None:
        report = _run_off(close, settings)
    else:
        keys = [timings.plan_key(chosen(solution)) for _, solution in close]
        report, kept = timings.runoff(keys, lambda: _run_off(close, settings))
        if kept:
            settings.say(f"plan {report['winner'] + 1} of them won when they last ran side by side")
    return close[report["winner"]], report


def contenders(best, measured: list) -> list:
    """The (plan, solution) pairs the runoff runs: those whose in-place minimum is within RUNOFF of
    the fastest's (`best`)."""
    limit = RUNOFF * best[0].meta.measured["min_ms"]
    return [m for m in measured if m[0].meta.measured["min_ms"] <= limit]


def _run_off(close: list, settings: Settings) -> dict:
    """The runoff itself: {"min_ms", "medians_ms", "fastest_ms", "round_medians_ms",
    "rounds_decided_by", "winner"} (and how often the winner was faster than the source model in a
    round, when that is among them). It decides by the calm rounds (korch.measure.timing.calm_side_by_side),
    each plan's in-place minimum among the references that tell a slow round. On a CPU it also
    records each round's placement of the process's CPUs, not decided by: "round_trips_ns" (before
    and after each round) and each plan's "near_medians_ms" (korch.measure.placement)."""
    calls = {}
    for i, (plan, _) in enumerate(close):
        calls[i] = plan.executable().caller(plan.random_inputs())
    pause = settings.spread_s / RUNOFF_ROUNDS
    # on a CPU, the round trips between the process's CPUs before and after each round (measure.placement)
    pairs: list[tuple[float, float]] = []

    def run(k: int) -> list[list[list[float]]]:
        time.sleep(pause)
        trips, between = placement.recorder(close[0][0].device)
        # blocks of at least block_s each (and 4 calls): a sub-millisecond plan gets tens of samples
        by_plan = interleave(
            calls, k, settings.block_s, close[0][0].device, round_pause_s=pause, between=between
        )
        pairs.extend(zip(trips, trips[1:]))
        return [by_plan[i] for i in range(len(close))]

    in_place = [p.meta.measured["min_ms"] for p, _ in close]
    every, used = calm_side_by_side(run, RUNOFF_ROUNDS, in_place)
    rounds = {i: [every[i][k] for k in used] for i in range(len(close))}
    timed = [[ms for r in rounds[i] for ms in r] for i in range(len(close))]
    medians = [statistics.median(ms) for ms in timed]
    winner = medians.index(min(medians))
    report = {
        "min_ms": [round(ms, 6) for ms in in_place],  # (in place: why each ran)
        "medians_ms": [round(m, 6) for m in medians],  # (this and the next over the rounds decided by)
        "fastest_ms": [round(min(ms), 6) for ms in timed],
        "round_medians_ms": [[round(statistics.median(r), 6) for r in every[i]] for i in range(len(close))],
        "rounds_decided_by": used,
    }
    if pairs and len(pairs) == len(every[0]) and all(None not in pair for pair in pairs):  # (not decided by)
        far = placement.placements(pairs)
        near = [placement.near_median(every[i], far) for i in range(len(close))]
        report["round_trips_ns"] = [[round(ns, 1) for ns in pair] for pair in pairs]
        report["near_medians_ms"] = [None if ms is None else round(ms, 6) for ms in near]
    source = next((i for i, (plan, _) in enumerate(close) if is_source_model(plan)), None)
    if source is not None and winner != source:
        if second_look(*rounds_faster(rounds[winner], rounds[source])):
            # faster in most rounds but not in enough: as many rounds again of the two alone, and
            # the sign test over all of them (a plan a few percent faster often wins only 5 or 6)
            settings.say("the fastest plan and the source model run again side by side")
            pair = {i: calls[i] for i in (winner, source)}
            more = interleave(pair, RUNOFF_ROUNDS, settings.block_s, close[0][0].device, round_pause_s=pause)
            for i in pair:
                rounds[i] = rounds[i] + more[i]
        # [rounds won, rounds] (a list, as the report reads back from JSON: the database, a plan)
        report["rounds_faster_than_source_model"] = list(rounds_faster(rounds[winner], rounds[source]))
        if not consistently_faster(rounds[winner], rounds[source]):
            settings.say("no plan ran consistently faster than the source model: it is kept")
            winner = source
    report["winner"] = winner
    return report


def fastest_whole_graph(
    graph: Graph,
    candidates: list[Candidate],
    profiles,
    like: Solution,
    make_plan: Callable[[Solution], Plan],
    timings: PlanTimings,
    settings: Settings = Settings(),
) -> tuple[Plan, Solution]:
    """The ablation's whole-graph variant: korch's whole primitive graph as one kernel (not the
    source model), in the backend refine would pick among them: each plan measured in place (or
    read from `timings`, where korch's own run kept it), then the runoff between those within
    RUNOFF of the fastest, so that the variant and korch rank the same plans alike."""
    measured = []
    for whole in whole_graph_solutions(graph, candidates, profiles, like):
        if not whole.chosen[0].candidate.key.startswith(WHOLE_GRAPH_PREFIX):
            continue
        plan = make_plan(whole)
        _in_place(plan, whole, timings, settings)
        measured.append((plan, whole))
    if not measured:
        raise KorchError("no backend compiled the whole primitive graph as one kernel")
    best = min(measured, key=lambda pair: pair[0].meta.measured["min_ms"])
    best, report = runoff(best, measured, settings, timings)
    best[0].meta.runoff = report
    return best


def whole_graph_solutions(
    graph: Graph, candidates: list[Candidate], profiles, like: Solution
) -> list[Solution]:
    """The plans of one whole-graph kernel in one backend each (every pair that ran), cheapest on
    paper first, for measuring beside the optimum."""
    plans = []
    for cand in candidates:
        if len(cand.nodes) == len(graph.nodes):
            for backend, prof in profiles.profiles.get(cand.key, {}).items():
                if prof.cost_ms < math.inf:
                    plans.append(alone(like, cand, backend, prof.cost_ms))
    return sorted(plans, key=lambda p: p.objective_ms)


def alone(like: Solution, cand: Candidate, backend: str, ms: float) -> Solution:
    """`like` (its solver status and statistics) with `cand` as the whole plan."""
    return dataclasses.replace(like, chosen=[Choice(cand, backend, ms)], objective_ms=ms)
