"""What a check right before a timing does to it: Inductor frozen kernels of each zoo model timed
as the profiler's timing worker times them (korch.measure.timing.time_fn), after a pause ("alone"),
right after a numpy matmul with the BLAS library's own threads (what the reference executor's BLAS
calls left behind before it ran them in one thread: the timing worker checks such a kernel against
the reference, then times it), and right after the reference executor itself runs the kernel's
graph (what the timing worker does now). The conditions alternate, a pause before each.

"median/min" is each timing's median call over its fastest (1.0: every call alike); "vs alone" is
a condition's median over the same kernel's median alone, its price in the profile database.

    python benchmarks/check_then_time.py [MODEL ...] --dir ZOO --out FILE [--kernels 12] [--rounds 6]
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import numpy as np
import torch
from threadpoolctl import threadpool_info
from zoo_bench import PAPER_MODELS, save

from korch.backends.inductor import InductorFrozenBackend
from korch.cli import zoo
from korch.frontend import import_onnx
from korch.ir import reference
from korch.measure import check
from korch.measure.timing import time_fn
from korch.search.candidates import CandidateOptions, enumerate_candidates
from korch.search.kernel import kernel_spec

CONDITIONS = ("alone", "after BLAS", "after reference")


def frozen_kernels(path: Path, count: int) -> list[tuple]:
    """(key, compiled kernel, its graph, input tensors) for `count` candidates spread over the
    model that the frozen backend takes (a linear primitive reading a weight), of up to 3 primitives."""
    graph = import_onnx(path).graph
    backend = InductorFrozenBackend()
    found = enumerate_candidates(graph, CandidateOptions(max_size=3))
    specs = {}
    for cand in found.candidates:
        spec = kernel_spec(graph, cand)
        if spec.key not in specs and backend.supports(spec, "cpu") is None:
            specs[spec.key] = spec
    picked = list(specs.values())[:: max(1, len(specs) // count)][:count]
    values = reference.evaluate(graph, check.random_inputs(graph, 0), {v for s in picked for v in s.inputs})
    kernels = []
    for spec in picked:
        arrays = [values[v] for v in spec.inputs]
        weights = {spec.graph.inputs[i]: arrays[i] for i in spec.weights}
        compiled = backend.compile(spec, "cpu", weights)
        kernels.append((spec.key, compiled, spec.graph, arrays))
    return kernels


def run_model(name: str, args) -> dict:
    kernels = frozen_kernels(zoo.build(name, args.dir), args.kernels)
    blas = np.random.default_rng(0).random((512, 512), dtype=np.float32)
    rows = []
    for key, compiled, graph, arrays in kernels:
        tensors = [torch.from_numpy(a.copy()) for a in arrays]
        feeds = dict(zip(graph.inputs, arrays))
        got = {c: [] for c in CONDITIONS}
        for r in range(args.rounds):
            for c in CONDITIONS if r % 2 == 0 else CONDITIONS[::-1]:
                time.sleep(0.3)
                if c == "after BLAS":
                    blas @ blas
                elif c == "after reference":
                    reference.run(graph, feeds)
                got[c].append(time_fn(compiled.fn, tensors, "cpu", 0.05))
        alone = statistics.median(t.median_ms for t in got["alone"])
        rows.append(
            {
                "key": key,
                "alone_ms": round(alone, 4),
                **{
                    c: {
                        "median_over_min": round(statistics.median(t.median_ms / t.min_ms for t in ts), 3),
                        "over_1_3": sum(t.median_ms > 1.3 * t.min_ms for t in ts),
                        "vs_alone": round(statistics.median(t.median_ms for t in ts) / alone, 3),
                    }
                    for c, ts in got.items()
                },
            }
        )
        print(name, rows[-1], flush=True)
    return {"kernels": rows, "timings_per_condition": args.rounds}


def summary(results: dict) -> str:
    heads = " | ".join(f"{c}: median/min, >1.3x, vs alone" for c in CONDITIONS)
    lines = [f"| model | kernels | {heads} |"]
    lines.append("|---|---|" + "---|" * len(CONDITIONS))
    for name, res in results.items():
        rows = res["kernels"]
        cells = []
        for c in CONDITIONS:
            ratio = statistics.median(r[c]["median_over_min"] for r in rows)
            over = sum(r[c]["over_1_3"] for r in rows)
            vs = statistics.median(r[c]["vs_alone"] for r in rows)
            cells.append(f"{ratio:.2f}, {over} of {len(rows) * res['timings_per_condition']}, {vs:.2f}x")
        lines.append(f"| {name} | {len(rows)} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="*", default=list(PAPER_MODELS))
    parser.add_argument("--dir", default=None)
    parser.add_argument("--out", required=True)
    parser.add_argument("--kernels", type=int, default=12)
    parser.add_argument("--rounds", type=int, default=6)
    args = parser.parse_args()
    results = {name: run_model(name, args) for name in args.models}
    pools = [(p["internal_api"], p["num_threads"]) for p in threadpool_info()]
    save(Path(args.out), {"models": results, "thread_pools": pools})
    print(summary(results))


if __name__ == "__main__":
    main()
