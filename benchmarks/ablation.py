"""Where korch's speed-up comes from: `korch bench MODEL --ablation` on the zoo, one model at a time.

Each model is optimized (korch full), then korch's variants (no rewrite, the whole primitive graph
as one kernel, the greedy plan, the BLP with no seeds: korch.cli.bench.ABLATION) sharing its
profile database, and everything is timed side by side in one process with the peers: ONNX
Runtime, OpenVINO and torch.compile (default, freezing, max-autotune with freezing) on a CPU;
the torch.compile configurations, CUDA graphs with and without freezing included, on a GPU.
Results accumulate in OUT/ablation.json, a model's entry written as soon as it is timed; korch's
plan of each model is saved in OUT/MODEL-BACKENDS-plan.

    python benchmarks/ablation.py [MODEL ...] --dir ZOO --out OUT [--device cpu|cuda]
        [--backends a,b] [--variants a,b] [--peers a,b] [--time-budget S] [--rounds N]

With `--backends inductor,inductor-frozen,vendor --variants korch-whole-graph --peers
torch-compile-freezing` it measures the orchestration's own gain: korch's plan of Inductor and
vendor kernels against Inductor on korch's whole graph (the same rewrites, frozen where that was
faster) and against torch.compile with freezing on the PyTorch module.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import time
from pathlib import Path

from zoo_bench import PAPER_MODELS, save

from korch.cli import zoo
from korch.cli.bench import ABLATION, bench
from korch.cli.explain import search_totals
from korch.pipeline import OptimizeOptions, optimize

CPU_PEERS = "onnxruntime,openvino,torch-compile,torch-compile-freezing,torch-compile-max-autotune-freezing"
GPU_PEERS = (
    "torch-compile,torch-compile-freezing,torch-compile-max-autotune-freezing,"
    "torch-compile-cudagraphs,torch-compile-cudagraphs-freezing"
)


def summary(plan, seconds: float) -> dict:
    """What optimize decided and measured, for setting beside the bench's timing of the same plan."""
    meta = plan.meta
    return {
        "seconds": round(seconds, 1),
        "kernels": len(plan.kernels),
        "backends": sorted({k.backend for k in plan.kernels}),
        "decided_by": meta.decided_by,
        "predicted_ms": plan.predicted_ms,
        "prediction_checked": plan.prediction_checked,  # (False: priced by in-place timings)
        "in_place_ms": (meta.measured or {}).get("ms"),
        "runoff": meta.runoff,
        "search": search_totals(meta.search),  # (without each pruned candidate)
        "rewrites": len(meta.rewrites),
    }


def run_model(name: str, args) -> dict:
    path = zoo.build(name, args.dir)
    backends = tuple(b for b in (args.backends or "").split(",") if b) or None
    options = OptimizeOptions(
        device=args.device,
        backends=backends,
        cache=Path(args.out) / f"profiles-{args.device}.sqlite",
        time_budget=args.time_budget,
    )
    plans, optimized = {}, {}
    for variant in ("korch", *args.variants):
        start = time.perf_counter()
        changed = options if variant == "korch" else dataclasses.replace(options, **ABLATION[variant])
        plans[variant] = optimize(path, options=changed)
        optimized[variant] = summary(plans[variant], time.perf_counter() - start)
        print(f"{name} {variant}: {optimized[variant]}", flush=True)
    # korch's plan as optimize saves it, for benchmarks/plan_vs_bench.py (a fresh process's bench)
    plans["korch"].save(Path(args.out) / f"{name}-{'+'.join(options.backends or ('default',))}-plan")
    variants = {v: plans[v] for v in args.variants}
    report = bench(plans["korch"], tuple(args.peers), rounds=args.rounds, variants=variants)
    return {
        "model": name,
        "device": args.device,
        "backends": options.backends,
        "time_budget": args.time_budget,
        "optimized": optimized,
        "bench": report,
    }


SHORT = {  # column names
    "korch": "korch",
    "korch-no-rewrite": "no rewrite",
    "korch-whole-graph": "whole graph",
    "korch-greedy": "greedy",
    "korch-no-seeds": "no seeds",
    "onnxruntime": "ONNX Runtime",
    "openvino": "OpenVINO",
    "torch-compile": "torch.compile",
    "torch-compile-freezing": "tc freezing",
    "torch-compile-max-autotune-freezing": "tc max-autotune freezing",
    "torch-compile-cudagraphs": "tc CUDA graphs",
    "torch-compile-cudagraphs-freezing": "tc CUDA graphs freezing",
}


def _rows(entry: dict) -> dict:
    return {**entry["bench"]["results"], **entry["bench"].get("ablation", {})}


def _geomean(values: list[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else float("nan")


def markdown(doc: dict) -> str:
    """Per run (model, backends): every system's median (minimum) ms and launches per call; then
    korch's speedup over each system (medians) with its geomean, what optimize measured for its
    plan against the bench's median, and every system's largest relative error."""
    runs = doc["runs"]
    names = list(dict.fromkeys(n for entry in runs.values() for n in _rows(entry)))
    head = ["model", "backends", *(SHORT.get(n, n) for n in names)]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    ratios: dict[str, list[float]] = {n: [] for n in names}
    for entry in runs.values():
        rows = _rows(entry)
        korch = rows["korch"]["median_ms"]
        cells = [entry["model"], ",".join(entry["backends"] or ("default",))]
        for n in names:
            r = rows.get(n)
            if r is None:
                cells.append("-")
                continue
            launches = "" if r.get("launches") is None else f", {r['launches']} launches"
            graph = "" if r.get("cuda_graph") in (None, True) else ", not captured"
            cells.append(f"{r['median_ms']:.2f} ({r['min_ms']:.2f}){launches}{graph}")
            ratios[n].append(r["median_ms"] / korch)
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "korch's speedup over each system, geomean of medians over the rows that have it:", ""]
    lines.append(
        ", ".join(
            f"{SHORT.get(n, n)} {_geomean(v):.2f}x ({len(v)})" for n, v in ratios.items() if n != "korch"
        )
    )
    lines += [
        "",
        "| model | backends | decided by | kernels | optimize's in place ms | runoff median ms "
        "| bench median ms | largest rel err |",
        "|" + "---|" * 8,
    ]
    for entry in runs.values():
        opt, rows = entry["optimized"]["korch"], _rows(entry)
        runoff = opt.get("runoff") or {}
        err = max(r["max_rel_err"] for r in rows.values())
        cells = [
            entry["model"],
            ",".join(entry["backends"] or ("default",)),
            opt["decided_by"],
            str(opt["kernels"]),
            f"{opt['in_place_ms']:.2f}" if opt.get("in_place_ms") else "-",
            f"{runoff['medians_ms'][runoff['winner']]:.2f}" if runoff else "-",
            f"{rows['korch']['median_ms']:.2f}",
            f"{err:.1e}",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "Each system's largest relative error (against ONNX Runtime on the source model):", ""]
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for entry in runs.values():
        rows = _rows(entry)
        errors = [f"{rows[n]['max_rel_err']:.1e}" if n in rows else "-" for n in names]
        lines.append(
            "| " + " | ".join([entry["model"], ",".join(entry["backends"] or ("default",)), *errors]) + " |"
        )
    return "\n".join(lines) + "\n"


def store(path: Path, key: str, entry: dict) -> None:
    doc = json.loads(path.read_text()) if path.exists() else {"runs": {}}
    doc["runs"][key] = entry
    save(path, doc)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="*", help=f"zoo models (default: {' '.join(PAPER_MODELS)})")
    parser.add_argument("--dir", help="zoo cache directory")
    parser.add_argument("--out", default="ablation-results", help="results directory (accumulates)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--backends", help="korch's backends, comma-separated (default: the device's)")
    parser.add_argument("--variants", default=",".join(ABLATION), help="korch variants to optimize, time")
    parser.add_argument("--peers", help=f"default on CPU: {CPU_PEERS}; on CUDA: {GPU_PEERS}")
    parser.add_argument("--time-budget", type=float, default=120.0, help="profiling seconds per optimize")
    parser.add_argument("--rounds", type=int, default=10)
    args = parser.parse_args()
    args.variants = [v for v in args.variants.split(",") if v]
    unknown = [v for v in args.variants if v not in ABLATION]
    if unknown:
        parser.error(f"unknown variants {unknown}; known: {', '.join(ABLATION)}")
    peers = args.peers or (GPU_PEERS if args.device.startswith("cuda") else CPU_PEERS)
    args.peers = [p for p in peers.split(",") if p]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for name in args.models or PAPER_MODELS:
        print(f"== {name}", flush=True)
        entry = run_model(name, args)
        key = f"{name}@{args.device}@{','.join(entry['backends'] or ('default',))}"
        store(out / "ablation.json", key, entry)
        rows = {**entry["bench"]["results"], **entry["bench"].get("ablation", {})}
        print(" | ".join(f"{k} {v['median_ms']:.3f}" for k, v in rows.items()), flush=True)


if __name__ == "__main__":
    main()
