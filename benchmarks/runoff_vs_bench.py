"""Whether optimize's runoff keeps the plan that a later `korch bench` finds fastest (issue 42: the
runoff never keeps a plan that the bench then finds slower than a rejected one). Per model: `korch
optimize` in this process, the plans its runoff ran side by side saved (korch.plan.refine.runoff,
wrapped to see them); then, in a fresh process, the kept plan benched with the rejected ones as
variants (korch.cli.bench.bench: every plan and ONNX Runtime on the source model interleaved,
--rounds rounds). Per plan: its runoff median and its bench median (and median over the near
rounds); per model: whether the kept plan had the lowest bench median, and its bench median over
the fastest rejected plan's.

    python benchmarks/runoff_vs_bench.py [MODEL ...] --dir ZOO --out FILE [--time-budget S]
        [--backends a,b] [--rounds N]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from zoo_bench import PAPER_MODELS, save

from korch.cli import zoo
from korch.pipeline import OptimizeOptions, optimize
from korch.plan import refine


def contenders(model: Path, options: OptimizeOptions, into: Path) -> dict:
    """Optimize `model`; the runoff's plans saved under `into` (0, 1, ...), and what it measured."""
    seen = []
    runoff = refine.runoff

    def spy(best, measured, *rest):
        kept, report = runoff(best, measured, *rest)
        seen.append((refine.contenders(best, measured), kept, report))
        return kept, report

    refine.runoff = spy
    try:
        plan = optimize(model, options=options)
    finally:
        refine.runoff = runoff
    if not seen or seen[-1][2] is None:
        return {"decided_by": plan.meta.decided_by, "runoff": None}
    close, kept, report = seen[-1]
    dirs = []
    for i, (p, _) in enumerate(close):
        p.save(into / str(i))
        dirs.append(str(into / str(i)))
    return {
        "decided_by": plan.meta.decided_by,
        "plans": dirs,
        "backends": [sorted({k.backend for k in p.kernels}) for p, _ in close],
        "kernels": [len(p.kernels) for p, _ in close],
        "winner": report["winner"],
        "runoff_medians_ms": report["medians_ms"],
        "runoff_near_medians_ms": report.get("near_medians_ms"),
    }


def bench_fresh(plans: list[str], winner: int, rounds: int) -> dict:
    """The kept plan and the rejected ones benched side by side in a process of their own."""
    command = [sys.executable, __file__, "--bench", *plans, "--winner", str(winner), "--rounds", str(rounds)]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"bench failed: {done.stderr.strip()[-500:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _bench(plans: list[str], winner: int, rounds: int) -> None:
    from korch.cli.bench import bench
    from korch.plan.plan import Plan

    loaded = [Plan.load(p) for p in plans]
    variants = {f"plan {i}": p for i, p in enumerate(loaded) if i != winner}
    report = bench(loaded[winner], ("onnxruntime",), rounds=rounds, variants=variants)
    rows = {f"plan {winner}": report["results"]["korch"], **report["ablation"]}
    print(
        json.dumps(
            {
                "medians_ms": [rows[f"plan {i}"]["median_ms"] for i in range(len(plans))],
                "near_medians_ms": [rows[f"plan {i}"].get("near_median_ms") for i in range(len(plans))],
                "min_ms": [rows[f"plan {i}"]["min_ms"] for i in range(len(plans))],
                "onnxruntime_median_ms": report["results"]["onnxruntime"]["median_ms"],
                "far_rounds": report.get("far_rounds"),
            }
        )
    )


def verdict(found: dict, benched: dict) -> dict:
    """Whether the kept plan benched fastest, and its bench median over the fastest rejected one's."""
    w, medians = found["winner"], benched["medians_ms"]
    rejected = [m for i, m in enumerate(medians) if i != w]
    return {
        "kept_fastest": medians[w] <= min(rejected),
        "kept_over_best_rejected": medians[w] / min(rejected),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="*")
    parser.add_argument("--dir", help="zoo cache directory")
    parser.add_argument("--out", default="runoff_vs_bench.json")
    parser.add_argument("--time-budget", type=float, default=60.0)
    parser.add_argument("--backends", default="")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--bench", nargs="+", help=argparse.SUPPRESS)  # (the fresh process's part)
    parser.add_argument("--winner", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.bench:
        _bench(args.bench, args.winner, args.rounds)
        return
    out = Path(args.out)
    results = json.loads(out.read_text()) if out.exists() else {"runs": {}}
    work = Path(tempfile.mkdtemp(prefix="runoff-vs-bench-"))  # (the plans and databases, kept)
    backends = tuple(b for b in args.backends.split(",") if b) or None
    for name in args.models or PAPER_MODELS:
        path = zoo.build(name, args.dir)
        options = OptimizeOptions(
            backends=backends, cache=work / f"{name}.sqlite", time_budget=args.time_budget, progress=False
        )
        found = contenders(path, options, work / name)
        entry = {"model": name, "backends": backends, **found}
        if "plans" in found:
            entry["bench"] = bench_fresh(found["plans"], found["winner"], args.rounds)
            entry.update(verdict(found, entry["bench"]))
        results["runs"][f"{name}/{args.backends or 'default'}"] = entry
        save(out, results)
        print(
            json.dumps(
                {k: entry.get(k) for k in ("model", "winner", "kept_fastest", "kept_over_best_rejected")}
            )
        )


if __name__ == "__main__":
    main()
