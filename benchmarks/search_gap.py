"""What holds a finished search's lower bound down: korch's search run again, warm, on a copy of the
profile database a run left (`--time-budget 0`, no plan measured in place, so nothing new is
timed), and the kernels of its last solution, the one that gave the lower bound: each measured or
still bounded, and for a bounded one the term of its bound that binds (korch.orchestrate.bounds:
"launch", "flops", "class" or "bytes"), summed by backend, with the largest bounded kernels.

    python benchmarks/search_gap.py MODEL.onnx DB.sqlite [--backends inductor,vendor] [--top 8]
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
from pathlib import Path
from unittest import mock

from korch.orchestrate import solve_measure
from korch.pipeline import OptimizeOptions, optimize


def last_solution(model: str, db: str, backends: str | None):
    """(prices, solution) of the search's last solve with measured costs and bounds."""
    solved = []
    real = solve_measure._solve

    def spy(graph, found, cost, time_limit):
        solution = real(graph, found, cost, time_limit)
        if isinstance(cost, solve_measure.Prices):  # (not the calibrated estimates' solves)
            solved.append((cost, solution))
        return solution

    with tempfile.TemporaryDirectory() as scratch:
        copy = Path(scratch) / "profiles.sqlite"
        shutil.copy(db, copy)
        options = OptimizeOptions(
            cache=copy,
            time_budget=0,
            measure=False,
            progress=False,
            backends=tuple(backends.split(",")) if backends else None,
        )
        with mock.patch.object(solve_measure, "_solve", spy):
            optimize(model, options=options)
    return solved[-1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("database")
    parser.add_argument("--backends", default=None)
    parser.add_argument("--top", type=int, default=8)
    args = parser.parse_args()
    prices, solution = last_solution(args.model, args.database, args.backends)
    rates = prices.rates
    print(
        f"lower bound {solution.objective_ms:.3f} ms: {len(solution.chosen)} kernels; "
        f"{len(rates.class_rate)} of {len(prices.capable)} classes with a rate"
    )
    by: dict[tuple[str, str], list[float]] = {}
    bounded = []
    for choice in solution.chosen:
        key, backend = choice.candidate.key, choice.backend
        work = prices.work(key)
        if prices.measured(key, backend):
            what = "measured"
        else:
            terms = rates.terms(work, backend)
            what = "bound: " + max(terms, key=terms.get)
            bounded.append((choice.cost_ms, backend, what, len(choice.candidate.nodes), len(work.linear)))
        count, ms = by.get((backend, what), [0, 0.0])
        by[(backend, what)] = [count + 1, ms + choice.cost_ms]
    print(f"{'backend':16s} {'priced as':16s} {'kernels':>7s} {'ms':>9s}")
    for (backend, what), (count, ms) in sorted(by.items(), key=lambda item: -item[1][1]):
        print(f"{backend:16s} {what:16s} {count:7d} {ms:9.3f}")
    print("largest bounded (ms, backend, binding term, primitives, linear primitives):")
    for row in sorted(bounded, reverse=True)[: args.top]:
        print(f"  {row[0]:.3f}", *row[1:])


if __name__ == "__main__":
    main()
