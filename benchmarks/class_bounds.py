"""Would tighter lower bounds hold? Without class rates korch.orchestrate.bounds bounds a kernel's
multiply-adds by the fastest FLOP rate any kernel showed, whatever it computed. Here each linear
primitive (its kind, operand types and attributes: "its class") is bounded instead by the fastest
rate of the measured kernels whose linear primitives are all of that class, raised by a margin:
across all backends, or per backend; with --complete, only once every backend that ran the class
alone in the database ran it alone among the other kernels (what korch.orchestrate.bounds does); with
--margin-one, a kernel holding one linear primitive takes that margin instead (as korch's
CLASS_MARGIN_ONE). A kernel's bound is then the larger of the plain bound and the sum over its
linear primitives. Checked leave-one-out over a profile database's measured kernels, as
korch.orchestrate.bounds.violations checks korch's: a violation is a kernel faster than the bound
the others give it.

    python benchmarks/class_bounds.py DB.sqlite [...] [--margins 1.5,2] [--margin-one 1.25]
        [--per-backend] [--complete]
"""

from __future__ import annotations

import argparse
import statistics
from collections import Counter

from korch.ir.work import kernel_work
from korch.orchestrate.bounds import Observation, Rates, capable_backends
from korch.orchestrate.solve_measure import PROBE_PREFIX, database_ceilings, database_kernels


def load(path: str) -> list[tuple[str, Observation]]:
    """(key, observation) of every measured kernel, its work with its linear primitives' classes."""
    return [
        (key, Observation(backend, kernel_work(g), ms, fastest))
        for key, backend, ms, fastest, g in database_kernels(path)
    ]


def class_rates(kernels, per_backend: bool) -> dict:
    """The fastest FLOPs per ms (by their fastest calls, as korch takes them) of the kernels whose
    linear primitives are all of one class."""
    rates: dict = {}
    for _, o in kernels:
        classes = {c for c, _ in o.work.linear}
        if len(classes) == 1:
            k = (classes.pop(), o.backend if per_backend else None)
            rates[k] = max(rates.get(k, 0.0), o.work.flops / min(o.ms, o.fastest_ms or o.ms))
    return rates


def check(
    path: str, margin: float, per_backend: bool, complete: bool = False, margin_one: float | None = None
) -> dict:
    kernels = load(path)
    ceilings = database_ceilings(path)
    floors = [o for key, o in kernels if key.startswith(PROBE_PREFIX)]
    measured = [k for k in kernels if not k[0].startswith(PROBE_PREFIX)]
    capable = capable_backends((o.work, o.backend) for _, o in measured)
    alone = Counter((o.work.linear[0][0], o.backend) for _, o in measured if o.work.alone)
    old, new, broken = [], [], []
    for i, (key, o) in enumerate(measured):
        others = [*measured[:i], *measured[i + 1 :]]
        rates = Rates([x[1] for x in others] + floors, ceilings)
        by_class = class_rates(others, per_backend)
        if complete:  # a class that each backend running it alone ran alone, this kernel left out
            left = alone - Counter([(o.work.linear[0][0], o.backend)] if o.work.alone else [])
            by_class = {
                k: r for k, r in by_class.items() if all(left[(k[0], b)] for b in capable.get(k[0], ()))
            }
        bound = rates.bound_ms(o.work, o.backend)
        summed = 0.0
        raise_by = margin_one if margin_one and len(o.work.linear) == 1 else margin
        for c, flops in o.work.linear:
            rate = by_class.get((c, o.backend if per_backend else None))
            summed += flops / (raise_by * rate) if rate else flops / rates.flops_per_ms
        tighter = max(bound, summed)
        old.append(o.ms / bound)
        new.append(o.ms / tighter)
        if o.ms < tighter:
            broken.append(
                {
                    "key": key,
                    "backend": o.backend,
                    "linear": len(o.work.linear),
                    "bound_over_measured": round(tighter / o.ms, 2),
                }
            )
    return {
        "kernels": len(measured),
        "median_measured_over_bound": round(statistics.median(old), 2),
        "with_class_rates": round(statistics.median(new), 2),
        "violations": sorted(broken, key=lambda b: -b["bound_over_measured"]),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("databases", nargs="+")
    parser.add_argument("--margins", default="1.5,2")
    parser.add_argument(
        "--margin-one", type=float, help="the margin for a kernel holding one linear primitive"
    )
    parser.add_argument("--per-backend", action="store_true")
    parser.add_argument(
        "--complete",
        action="store_true",
        help="a class's rate only where every backend that ran it alone ran it alone among the rest",
    )
    args = parser.parse_args()
    for path in args.databases:
        for margin in (float(m) for m in args.margins.split(",")):
            r = check(path, margin, args.per_backend, args.complete, args.margin_one)
            worst = r["violations"][:3]
            print(
                f"{path}: margin {margin}, {'per backend' if args.per_backend else 'across backends'}"
                f"{', complete classes' if args.complete else ''}"
                f"{f', margin {args.margin_one} for one linear primitive' if args.margin_one else ''}: "
                f"{r['kernels']} kernels, median measured/bound {r['median_measured_over_bound']} -> "
                f"{r['with_class_rates']}, {len(r['violations'])} violations {worst}",
                flush=True,
            )


if __name__ == "__main__":
    main()
