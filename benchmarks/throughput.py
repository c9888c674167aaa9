"""Profiling throughput, two versions of korch side by side: kernels profiled per minute of
profiling on one zoo model (by default in Inductor alone), each run cold (a fresh profile database
and a fresh Inductor cache), the versions alternating so that the machine's drift hits both alike.

    python benchmarks/throughput.py OLD_ROOT NEW_ROOT [--model segformer-b0] [--dir ZOO]
        [--backends inductor] [--time-budget S] [--pairs N] [--out FILE]

Each root is a checkout of korch (e.g. `git worktree add /tmp/old COMMIT`); each run is
`korch.optimize(model, backends=BACKENDS, time_budget=S, measure=False)` in a process of its own
with that root first on the path, and reports what its plan's metadata says: kernels profiled,
profiling seconds, and the median compile time the database recorded.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

RUN = """
import json, sqlite3, sys, time
import korch
from korch.pipeline import OptimizeOptions, optimize
model, budget, cache, backends = sys.argv[1], float(sys.argv[2]), sys.argv[3], sys.argv[4]
options = OptimizeOptions(
    backends=tuple(backends.split(",")), time_budget=budget, cache=cache, measure=False, progress=False
)
plan = optimize(model, options=options)
with sqlite3.connect(cache) as con:
    compile_s = [r[0] for r in con.execute("SELECT compile_s FROM profiles WHERE compile_s IS NOT NULL")]
    by_backend = dict(con.execute("SELECT backend, COUNT(*) FROM profiles GROUP BY backend").fetchall())
doc = {"korch": korch.__file__, "profiling": plan.meta.profiling, "compile_s": compile_s}
print(json.dumps({**doc, "by_backend": by_backend}))
"""


def run(root: Path, model: Path, budget: float, backends: str = "inductor") -> dict:
    with tempfile.TemporaryDirectory(prefix="korch-throughput-") as tmp:
        env = {**os.environ, "PYTHONPATH": str(root), "TORCHINDUCTOR_CACHE_DIR": f"{tmp}/inductor"}
        args = [sys.executable, "-c", RUN, str(model), str(budget), f"{tmp}/profiles.sqlite", backends]
        out = subprocess.run(args, env=env, cwd=tmp, capture_output=True, text=True, check=True).stdout
    doc = json.loads(out.strip().splitlines()[-1])
    prof = doc["profiling"]
    seconds = prof["seconds"]
    return {
        "korch": doc["korch"],
        "profiled": prof["profiled"],
        "failed": prof["failed"],
        "seconds": seconds,
        "per_minute": 60 * prof["profiled"] / seconds if seconds else None,
        "median_compile_s": statistics.median(doc["compile_s"]) if doc["compile_s"] else None,
        "by_backend": doc["by_backend"],  # rows in the database (the least-kernel probes included)
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("roots", nargs=2, type=Path, help="OLD_ROOT NEW_ROOT")
    parser.add_argument("--model", default="segformer-b0")
    parser.add_argument("--dir", default=None, help="the zoo's directory")
    parser.add_argument("--backends", default="inductor", help="as optimize's --backends")
    parser.add_argument("--time-budget", type=float, default=90.0)
    parser.add_argument("--pairs", type=int, default=2)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    from korch.cli import zoo

    model = zoo.build(args.model, args.dir)
    runs: dict[str, list[dict]] = {"old": [], "new": []}
    for i in range(args.pairs):
        for name, root in (("old", args.roots[0]), ("new", args.roots[1]))[:: 1 if i % 2 == 0 else -1]:
            runs[name].append(run(root.resolve(), model, args.time_budget, args.backends))
            print(name, json.dumps(runs[name][-1]), flush=True)
    rates = {name: statistics.median(r["per_minute"] for r in rs) for name, rs in runs.items()}
    print(
        f"{args.backends} kernels profiled per minute: old {rates['old']:.1f}, new {rates['new']:.1f} "
        f"({rates['new'] / rates['old']:.2f}x)"
    )
    if args.out:
        doc = {"model": args.model, "backends": args.backends, "time_budget": args.time_budget}
        doc.update(runs=runs, per_minute=rates)
        args.out.write_text(json.dumps(doc, indent=1))


if __name__ == "__main__":
    main()
