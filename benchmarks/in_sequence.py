"""Why the solver's plan runs slower in place than its kernels' isolated timings sum to (issue 42:
which kernels lose, and why, measured). Per model: the plan the solver picks over the prices of a
finished search (`benchmarks/search_bench.py` leaves OUT/<model>-<backends>.sqlite): optimize on a
copy of that database, `--time-budget 0`, no plan measured in place. Then, in this one process, in
alternating blocks, each kernel on the inputs the plan gives it:

- **alone**: called again and again, as the profiler times it;
- **cold caches**: the same, with CACHE_MIB written to memory before each call;
- **after its predecessor**: kernel i timed right after kernel i-1 ran (the first kernel: alone);
- **in sequence**: the plan run whole, each kernel timed in place.

Each figure is a median over the rounds of the median within a block; they are summed by backend
beside the database's isolated medians (what the solver priced the plan at).

    python benchmarks/in_sequence.py [MODEL ...] --dir ZOO --dbs SEARCH_OUT --out FILE
        [--backends default,inductor+vendor] [--rounds 11] [--calls 9]
"""

from __future__ import annotations

# isort: off
import korch  # noqa: F401 (first: korch.measure.openmp sets torch's OpenMP spin, as the CLI does)

# isort: on
import argparse
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from zoo_bench import PAPER_MODELS, save

from korch.cli import zoo
from korch.measure import busy
from korch.measure.check import random_inputs
from korch.pipeline import OptimizeOptions, optimize
from korch.plan.runtime import Executable

CACHE_MIB = 64
WAYS = ("alone", "cold caches", "after its predecessor", "in sequence")


def solver_plan(model: Path, db: Path, backends: str):
    """The solver's plan over the database's prices (nothing new measured, none measured in place)."""
    with tempfile.TemporaryDirectory() as tmp:
        copy = Path(tmp) / "db.sqlite"
        shutil.copy(db, copy)
        chosen = None if backends == "default" else tuple(backends.split("+"))
        options = OptimizeOptions(time_budget=0, cache=copy, measure=False, backends=chosen, progress=False)
        return optimize(model, options=options)


def kernel_calls(ex: Executable, feeds: dict) -> list:
    """(fn, args) of each kernel of the plan, its arguments those one run of the plan gives it
    (the executable's own run, each kernel wrapped to record its call)."""
    calls = []

    def recording(fn):
        def call(*args):
            calls.append((fn, list(args)))
            return fn(*args)

        return call

    ex._run(feeds, steps=[(recording(fn), *rest) for fn, *rest in ex.steps])
    return calls


def timed(fn, args, before=None) -> float:
    if before is not None:
        before()
    start = time.perf_counter()
    fn(*args)
    return (time.perf_counter() - start) * 1e3


def one_round(calls: list, calls_per_kernel: int) -> dict[str, list[float]]:
    """Each way's per-kernel medians in one round (the ways in turn, a block each)."""
    scratch = np.zeros(CACHE_MIB << 20, np.uint8)

    def evict() -> None:
        scratch[::64] += 1  # a write to every cache line

    def block(i: int, way: str) -> float:
        fn, args = calls[i]
        before = {"cold caches": evict, "after its predecessor": None}.get(way)
        if way == "after its predecessor" and i > 0:
            prev_fn, prev_args = calls[i - 1]

            def before() -> None:
                prev_fn(*prev_args)

        return statistics.median(timed(fn, args, before) for _ in range(calls_per_kernel))

    found = {way: [block(i, way) for i in range(len(calls))] for way in WAYS[:3]}
    runs = []
    for _ in range(calls_per_kernel):
        row = []
        for fn, args in calls:
            row.append(timed(fn, args))
        runs.append(row)
    found["in sequence"] = [statistics.median(col) for col in zip(*runs)]
    return found


def run_model(name: str, backends: str, args) -> dict:
    model = zoo.build(name, args.dir)
    plan = solver_plan(model, args.dbs / f"{model.stem}-{backends}.sqlite", backends)
    ex = Executable(plan)
    # (korch's seeded inputs: the profiler timed the kernels on the activations they give)
    feeds = {n: torch.from_numpy(a) for n, a in random_inputs(plan.graph).items()}
    calls = kernel_calls(ex, feeds)
    for fn, a in calls:  # warm-up
        fn(*a)
    rounds = []
    for _ in range(args.rounds):
        busy.settle()
        rounds.append(one_round(calls, args.calls))
    per_kernel = {
        way: [statistics.median(r[way][i] for r in rounds) for i in range(len(calls))] for way in WAYS
    }
    kernels = [
        {"backend": k.backend, "primitives": len(k.nodes), "database_ms": round(k.cost_ms, 4)}
        | {way: round(per_kernel[way][i], 4) for way in WAYS}
        for i, k in enumerate(plan.kernels)
    ]
    by_backend: dict[str, dict] = {}
    for k in kernels:
        entry = by_backend.setdefault(
            k["backend"], {"kernels": 0, "database_ms": 0.0, **dict.fromkeys(WAYS, 0.0)}
        )
        entry["kernels"] += 1
        for field in ("database_ms", *WAYS):
            entry[field] += k[field]
    total = {field: round(sum(k[field] for k in kernels), 3) for field in ("database_ms", *WAYS)}
    sums = ", ".join(f"{f} {v:.2f}" for f, v in total.items())
    print(f"{name} ({backends}): {len(kernels)} kernels, {sums}", flush=True)
    return {
        "kernels": kernels,
        "by_backend": {b: {f: round(v, 3) for f, v in e.items()} for b, e in by_backend.items()},
        "total_ms": total,
    }


def markdown(doc: dict) -> str:
    """One row per run (model and backends) and backend of its plan: kernels, then ms summed."""
    head = ["model", "backends", "kernel backend", "kernels", "database", *WAYS, "in sequence / alone"]
    lines = ["| " + " | ".join(head) + " |", "|---" * len(head) + "|"]
    for run, r in doc["runs"].items():
        model, backends = run.split("/")
        rows = [*r["by_backend"].items()]
        if len(rows) > 1:
            rows.append(("**all**", {"kernels": len(r["kernels"]), **r["total_ms"]}))
        for backend, e in rows:
            ms = [f"{e[f]:.2f}" for f in ("database_ms", *WAYS)]
            ratio = f"{e['in sequence'] / e['alone']:.2f}x"
            lines.append("| " + " | ".join([model, backends, backend, str(e["kernels"]), *ms, ratio]) + " |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="*", default=list(PAPER_MODELS))
    parser.add_argument("--dir", default=None, help="the zoo's directory (built there when missing)")
    parser.add_argument("--dbs", type=Path, required=True, help="search_bench.py's --out directory")
    parser.add_argument("--backends", default="default,inductor+vendor", help="search_bench.py's sets")
    parser.add_argument("--rounds", type=int, default=11)
    parser.add_argument("--calls", type=int, default=9, help="calls per kernel and way in a round")
    parser.add_argument("--out", required=True, type=Path)
    args = parser.parse_args()
    runs = {
        f"{name}/{backends}": run_model(name, backends, args)
        for backends in args.backends.split(",")
        for name in args.models
    }
    about = __doc__.splitlines()[0]
    save(args.out, {"about": about, "rounds": args.rounds, "calls": args.calls, "runs": runs})


if __name__ == "__main__":
    main()
