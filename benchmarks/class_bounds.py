"""Would tighter lower bounds hold? korch.orchestrate.bounds bounds a kernel's multiply-adds by the
fastest FLOP rate any kernel showed, whatever it computed. Here each linear primitive (its kind,
operand shapes and attributes: "its class") is bounded instead by the fastest rate of the measured
kernels whose linear primitives are all of that class, divided by a margin: across all backends,
or per backend. A kernel's bound is then the larger of korch's and the sum over its linear
primitives. Checked leave-one-out over a profile database's measured kernels, as
korch.orchestrate.bounds.violations checks korch's: a violation is a kernel faster than the bound
the others give it.

    python benchmarks/class_bounds.py DB.sqlite [...] [--margins 1.5,2] [--per-backend]
"""

from __future__ import annotations

import argparse
import statistics

from korch.ir.prims import Kind
from korch.ir.work import kernel_work, node_flops
from korch.orchestrate.bounds import Observation, Rates
from korch.orchestrate.solve_measure import PROBE_PREFIX, database_ceilings, database_kernels


def load(path: str) -> list[tuple[str, Observation, list[tuple[tuple, int]]]]:
    """(key, observation, [(class, FLOPs) of each linear primitive]) of every measured kernel."""
    found = []
    for key, backend, ms, g in database_kernels(path):
        linear = [
            ((n.prim.value, tuple(g.types[v].shape for v in n.inputs), n.attrs), node_flops(n, g.types))
            for n in g.nodes
            if n.prim.kind == Kind.LINEAR
        ]
        found.append((key, Observation(backend, kernel_work(g), ms), linear))
    return found


def class_rates(kernels, per_backend: bool) -> dict:
    """The fastest FLOPs per ms of the kernels whose linear primitives are all of one class."""
    rates: dict = {}
    for _, o, linear in kernels:
        classes = {c for c, _ in linear}
        flops = sum(f for _, f in linear)
        if len(classes) == 1 and flops:
            k = (classes.pop(), o.backend if per_backend else None)
            rates[k] = max(rates.get(k, 0.0), flops / o.ms)
    return rates


def check(path: str, margin: float, per_backend: bool) -> dict:
    kernels = load(path)
    ceilings = database_ceilings(path)
    floors = [o for key, o, _ in kernels if key.startswith(PROBE_PREFIX)]
    measured = [k for k in kernels if not k[0].startswith(PROBE_PREFIX)]
    old, new, broken = [], [], []
    for i, (key, o, linear) in enumerate(measured):
        others = [*measured[:i], *measured[i + 1 :]]
        rates = Rates([x[1] for x in others] + floors, ceilings)
        by_class = class_rates(others, per_backend)
        bound = rates.bound_ms(o.work, o.backend)
        summed = 0.0
        for c, flops in linear:
            rate = by_class.get((c, o.backend if per_backend else None))
            summed += flops / (margin * rate) if rate else flops / rates.flops_per_ms
        tighter = max(bound, summed)
        old.append(o.ms / bound)
        new.append(o.ms / tighter)
        if o.ms < tighter:
            broken.append({"key": key, "backend": o.backend, "bound_over_measured": round(tighter / o.ms, 2)})
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
    parser.add_argument("--per-backend", action="store_true")
    args = parser.parse_args()
    for path in args.databases:
        for margin in (float(m) for m in args.margins.split(",")):
            r = check(path, margin, args.per_backend)
            worst = r["violations"][:3]
            print(
                f"{path}: margin {margin}, {'per backend' if args.per_backend else 'across backends'}: "
                f"{r['kernels']} kernels, median measured/bound {r['median_measured_over_bound']} -> "
                f"{r['with_class_rates']}, {len(r['violations'])} violations {worst}",
                flush=True,
            )


if __name__ == "__main__":
    main()
