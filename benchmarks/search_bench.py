"""The search on the paper's five models: for each model and each set of backends, `korch optimize
--json` in a fresh process with a fresh profile database, its search report (pairs measured,
bounded, pruned; rounds; lower bound; plan; certified gap), its wall time against --time-budget,
and the bounds checked against every kernel the run measured (korch.orchestrate.bounds.violations,
leave-one-out, with the device ceilings the run kept). Results go to OUT/search.json; --markdown
writes the table.

    python benchmarks/search_bench.py [MODEL ...] [--dir ZOO] [--out DIR] [--time-budget S]
        [--backends default,inductor+vendor] [--markdown FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

from korch.cli import zoo
from korch.measure.device import cpu_model
from korch.orchestrate.bounds import violations
from korch.orchestrate.solve_measure import PROBE_PREFIX, database_ceilings, database_observations

PAPER_MODELS = ("candy", "segformer-b0", "yolox-nano", "yolov4", "efficientvit-b1")


def run(model: Path, backends: str, budget: float, out: Path) -> dict:
    """One optimize in its own process, its JSON report, wall time and the bounds' check."""
    db, plan = out / f"{model.stem}-{backends}.sqlite", out / f"{model.stem}-{backends}-plan"
    db.unlink(missing_ok=True)
    argv = [sys.executable, "-m", "korch.cli.commands", "optimize", str(model), "-o", str(plan), "--json"]
    argv += ["--cache", str(db), "--time-budget", str(budget)]
    if backends != "default":
        argv += ["--backends", backends.replace("+", ",")]
    started = time.perf_counter()
    proc = subprocess.run(argv, capture_output=True, text=True)
    wall = time.perf_counter() - started
    if proc.returncode != 0:
        return {"error": proc.stderr.strip().splitlines()[-1:], "wall_s": round(wall, 1)}
    report = json.loads(proc.stdout)
    rows = database_observations(db)
    observed = [(key, o) for key, o in rows if not key.startswith(PROBE_PREFIX)]
    floors = [o for key, o in rows if key.startswith(PROBE_PREFIX)]
    broken = violations([o for _, o in observed], database_ceilings(db), floors=floors)
    return {
        "wall_s": round(wall, 1),
        "profiling_s": report["search"]["profiling_seconds"],
        "search": {k: v for k, v in report["search"].items() if k != "partitions"},
        "decided_by": report["decided_by"],
        "kernels": report["kernels"],
        "measured_ms": report["measured_ms"],
        "observations": len(observed),
        "violations": [{"key": observed[i][0], "bound_over_measured": round(r, 3)} for i, r in broken],
    }


def markdown(results: dict) -> str:
    head = (
        "| model | backends | measured | bounded | pruned | rounds | lower bound ms | plan ms | gap "
        "| decided by | profiling s / budget | bound violations |\n|" + "---|" * 12
    )
    rows = [head]
    for name, r in results["runs"].items():
        model, backends = name.split("/")
        if "error" in r:
            rows.append(f"| {model} | {backends} | error: {r['error']} |" + " |" * 10)
            continue
        s = r["search"]
        gap = "-" if s["certified_gap"] is None else f"{s['certified_gap']:.1%}"
        bound = "-" if s["lower_bound_ms"] is None else f"{s['lower_bound_ms']:.3f}"
        plan = "-" if s["plan_ms"] is None else f"{s['plan_ms']:.3f}"
        rows.append(
            f"| {model} | {backends} | {s['measured']} | {s['bounded']} | {s['pruned']} | {s['rounds']} "
            f"| {bound} | {plan} | {gap} | {r['decided_by']} "
            f"| {r['profiling_s']:.0f} / {results['time_budget']:g} "
            f"| {len(r['violations'])} of {r['observations']} |"
        )
    return "\n".join(rows) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="*", default=list(PAPER_MODELS))
    parser.add_argument("--dir", default=None, help="the zoo's directory (built there when missing)")
    parser.add_argument("--out", default="/tmp/korch-search", type=Path)
    parser.add_argument("--time-budget", type=float, default=300.0)
    parser.add_argument("--backends", default="default,inductor+vendor")
    parser.add_argument("--markdown", default=None)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    results = {
        "date": time.strftime("%Y-%m-%d"),
        "commit": subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True
        ).stdout.strip(),
        "machine": f"{platform.machine()} ({cpu_model()}), {os.cpu_count()} cores",
        "time_budget": args.time_budget,
        "runs": {},
    }
    for name in args.models:
        model = zoo.build(name, args.dir or zoo.default_dir())
        for backends in args.backends.split(","):
            r = results["runs"][f"{name}/{backends}"] = run(model, backends, args.time_budget, args.out)
            print(f"{name}/{backends}: {json.dumps(r)}", file=sys.stderr, flush=True)
            (args.out / "search.json").write_text(json.dumps(results, indent=1))
    table = markdown(results)
    print(table)
    if args.markdown:
        Path(args.markdown).write_text(table)


if __name__ == "__main__":
    main()
