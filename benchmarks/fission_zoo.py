"""Fission on every zoo model: time (median of 3), primitive counts by kind, error vs ONNX Runtime.

python benchmarks/fission_zoo.py [--dir ZOO_CACHE] [MODEL ...]
"""

from __future__ import annotations

import argparse
import resource
import statistics
import time

import korch
from korch.cli import zoo


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="*", default=list(zoo.MODELS))
    parser.add_argument("--dir", default=None, help="zoo cache directory")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()

    header = (
        f"{'model':16s} {'onnx':>5s} {'prims':>6s} {'elem':>5s} {'bcast':>5s} {'red':>4s} {'lay':>4s} "
        f"{'lin':>4s} {'opq':>4s} {'fission_s':>9s} {'rel_err':>9s}"
    )
    print(header)
    print("-" * len(header))
    for name in args.models:
        path = zoo.build(name, args.dir)
        times = []
        for _ in range(args.repeat):
            start = time.perf_counter()
            result = korch.fission(path)
            times.append(time.perf_counter() - start)
        err = korch.check_fission(result)
        k = result.graph.by_kind()
        print(
            f"{name:16s} {result.onnx_nodes:5d} {len(result.graph.nodes):6d} {k['elementwise']:5d} "
            f"{k['broadcast']:5d} {k['reduce']:4d} {k['layout']:4d} {k['linear']:4d} {k['opaque']:4d} "
            f"{statistics.median(times):9.3f} {err:9.2e}",
            flush=True,
        )
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"peak RSS {peak:.0f} MiB")


if __name__ == "__main__":
    main()
