"""What `korch optimize` measured for the plans it saved (in place, and in its runoff) against what
`korch bench` then measures for each saved plan in a fresh process (issue 42's target: within 5% of
the bench's median). Each plan is benched in a process of its own, against ONNX Runtime on its
source model as `korch bench` does by default. The bench's median over its near rounds (the
process's CPUs on cores that share a cache, korch.measure.placement) is set beside it where the
bench had one, and against it the runoff's median over its own near rounds, where it recorded them.

    python benchmarks/plan_vs_bench.py PLAN_DIR [...] --out FILE [--rounds 8] [--allow-version-mismatch]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from zoo_bench import save


def optimized(plan_dir: Path) -> dict:
    """What optimize stored in the plan: how it decided, and its timings of the plan kept."""
    plan = json.loads((plan_dir / "plan.json").read_text())
    meta = plan["meta"]
    measured, runoff = meta.get("measured") or {}, meta.get("runoff") or {}
    winner = runoff.get("winner")
    return {
        "decided_by": meta.get("decided_by"),
        "kernels": len(plan["kernels"]),
        "in_place_ms": measured.get("ms"),
        "in_place_min_ms": measured.get("min_ms"),
        "runoff_median_ms": runoff["medians_ms"][winner] if runoff else None,
        "runoff_fastest_ms": runoff["fastest_ms"][winner] if "fastest_ms" in runoff else None,
        "runoff_near_median_ms": runoff["near_medians_ms"][winner] if "near_medians_ms" in runoff else None,
    }


def bench(plan_dir: Path, args) -> dict:
    command = [sys.executable, "-m", "korch.cli.commands", "bench", str(plan_dir), "--json"]
    command += ["--rounds", str(args.rounds)]
    if args.allow_version_mismatch:
        command.append("--allow-version-mismatch")
    done = subprocess.run(command, capture_output=True, text=True)
    if not done.stdout.strip():
        raise SystemExit(f"{plan_dir}: korch bench printed nothing: {done.stderr.strip()[-500:]}")
    doc = json.loads(done.stdout.strip().splitlines()[-1])
    if "error" in doc:
        raise SystemExit(f"{plan_dir}: {doc['error']}")
    return doc


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("plans", nargs="+", type=Path)
    parser.add_argument("--out", default="plan_vs_bench.json")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--allow-version-mismatch", action="store_true")
    args = parser.parse_args()
    out = Path(args.out)
    doc = json.loads(out.read_text()) if out.exists() else {"plans": {}}
    for plan_dir in args.plans:
        row = optimized(plan_dir)
        benched = bench(plan_dir, args)
        korch = benched["results"]["korch"]
        near = korch.get("near_median_ms")
        row.update(bench_median_ms=korch["median_ms"], bench_min_ms=korch["min_ms"])
        row.update(bench_near_median_ms=near, bench=benched)
        for name, median in (("in_place", row["in_place_ms"]), ("runoff", row["runoff_median_ms"])):
            row[f"{name}_over_bench"] = round(median / korch["median_ms"], 4) if median else None
            row[f"{name}_over_bench_near"] = round(median / near, 4) if median and near else None
        runoff_near = row["runoff_near_median_ms"]
        row["runoff_near_over_bench_near"] = round(runoff_near / near, 4) if runoff_near and near else None
        doc["plans"][plan_dir.name] = row
        save(out, doc)
        near_ratio = row["runoff_over_bench_near"]
        both = row["runoff_near_over_bench_near"]
        print(
            f"{plan_dir.name}: optimize in place {row['in_place_ms']:.2f} ms"
            + (f", runoff {row['runoff_median_ms']:.2f}" if row["runoff_median_ms"] else "")
            + f"; bench {korch['median_ms']:.2f} ({korch['min_ms']:.2f}) ms: in place / bench "
            f"{row['in_place_over_bench']:.3f}"
            + (f", runoff / bench {row['runoff_over_bench']:.3f}" if row["runoff_over_bench"] else "")
            + (f"; near rounds {near:.2f} ms" if near else "; no near round")
            + (f", runoff / near {near_ratio:.3f}" if near_ratio else "")
            + (f", runoff's near rounds / near {both:.3f}" if both else ""),
            flush=True,
        )


if __name__ == "__main__":
    main()
