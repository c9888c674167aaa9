"""Candidate enumeration on every zoo model: partitions, candidates, unique keys, time, peak memory.

python benchmarks/candidates_zoo.py [--dir ZOO_CACHE] [--max-size N] [MODEL ...]
"""

from __future__ import annotations

import argparse
import resource

import korch
from korch.cli import zoo
from korch.search.candidates import CandidateOptions, enumerate_candidates


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="*", default=list(zoo.MODELS))
    parser.add_argument("--dir", default=None, help="zoo cache directory")
    parser.add_argument("--max-size", type=int, default=CandidateOptions().max_size)
    args = parser.parse_args()

    header = (
        f"{'model':16s} {'prims':>6s} {'parts':>5s} {'cands':>7s} {'unique':>7s} {'ratio':>6s} "
        f"{'rejected':>9s} {'enum_s':>7s} {'rss_MiB':>8s}"
    )
    print(f"max size {args.max_size}")
    print(header)
    print("-" * len(header))
    for name in args.models:
        graph = korch.fission(zoo.build(name, args.dir)).graph
        found = enumerate_candidates(graph, CandidateOptions(max_size=args.max_size))
        s = found.summary()
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        print(
            f"{name:16s} {s['primitives']:6d} {s['partitions']:5d} {s['candidates']:7d} "
            f"{s['unique_candidates']:7d} {s['candidates'] / s['unique_candidates']:6.1f} "
            f"{sum(s['pruned'].values()):9d} {s['seconds']:7.2f} {rss:8.0f}",
            flush=True,
        )


if __name__ == "__main__":
    main()
