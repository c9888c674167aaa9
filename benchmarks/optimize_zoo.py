"""Optimize zoo models on this machine and report what the cost model promised against what the
plan delivers: profiling counts, compile time per candidate, cache hits on a second run, solver
status, optimal versus greedy selection, predicted versus measured latency, and ONNX Runtime.

    python benchmarks/optimize_zoo.py [MODEL ...] [--dir ZOO] [--cache DB] [--time-budget S]
                                      [--backends a,b] [--max-size N] [--second-run]
"""

from __future__ import annotations

import argparse
import sqlite3
import statistics
import tempfile
import time
from pathlib import Path

from korch import zoo
from korch.bench import bench
from korch.optimize import OptimizeOptions, optimize


def compile_seconds(db: Path) -> dict[str, float]:
    """Median compile time per candidate, by backend, over everything in the database."""
    rows = sqlite3.connect(db).execute("SELECT backend, compile_s FROM profiles WHERE compile_s IS NOT NULL")
    by: dict[str, list[float]] = {}
    for backend, seconds in rows:
        by.setdefault(backend, []).append(seconds)
    return {b: statistics.median(v) for b, v in by.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="*", default=list(zoo.MODELS))
    parser.add_argument("--dir", help="zoo cache directory")
    parser.add_argument("--cache", help="profile database (default: a fresh temporary one)")
    parser.add_argument("--time-budget", type=float)
    parser.add_argument("--backends", help="comma-separated backends")
    parser.add_argument("--max-size", type=int, default=12)
    parser.add_argument("--second-run", action="store_true", help="optimize again to measure the cache")
    args = parser.parse_args()
    cache = (
        Path(args.cache or tempfile.mkdtemp(prefix="korch-bench-")) / "profiles.sqlite"
        if not (args.cache and args.cache.endswith(".sqlite"))
        else Path(args.cache)
    )
    options = OptimizeOptions(
        cache=cache,
        time_budget=args.time_budget,
        max_size=args.max_size,
        backends=tuple(args.backends.split(",")) if args.backends else None,
    )
    print(f"profile database: {cache}")
    for name in args.models:
        path = zoo.build(name, args.dir)
        start = time.perf_counter()
        plan = optimize(path, options=options)
        cold = time.perf_counter() - start
        meta = plan.meta
        line = (
            f"{name}: {len(plan.kernels)} kernels ({meta['greedy_kernels']} greedy), predicted "
            f"{plan.predicted_ms:.3f} ms, greedy {meta['greedy_ms']:.3f} ms, "
            f"solver {meta['solver']['status']} "
            f"gap {meta['solver']['gap']:g} in {meta['solver']['seconds']:.2f}s; profiled "
            f"{meta['profiling']['profiled']} (failed {meta['profiling']['failed']}, skipped "
            f"{meta['profiling']['skipped']}), optimize {cold:.1f}s"
        )
        print(line, flush=True)
        if args.second_run:
            start = time.perf_counter()
            again = optimize(path, options=options)
            warm = time.perf_counter() - start
            p = again.meta["profiling"]
            hits = p["cache_hits"] / max(p["cache_hits"] + p["profiled"], 1)
            print(
                f"  second run: {warm:.1f}s ({cold / warm:.1f}x faster), cache hit rate {hits:.0%}",
                flush=True,
            )
        err = plan.verify()
        report = bench(plan, ("onnxruntime",), rounds=30)
        korch_ms = report["results"]["korch"]["median_ms"]
        ort_ms = report["results"]["onnxruntime"]["median_ms"]
        print(
            f"  verify max rel err {err:.2e}; measured {korch_ms:.3f} ms (predicted/measured "
            f"{plan.predicted_ms / korch_ms:.2f}), onnxruntime {ort_ms:.3f} ms, "
            f"speedup {ort_ms / korch_ms:.2f}x",
            flush=True,
        )
    print(
        "median compile seconds per candidate:", {k: round(v, 3) for k, v in compile_seconds(cache).items()}
    )


if __name__ == "__main__":
    main()
