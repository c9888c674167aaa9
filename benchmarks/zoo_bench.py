"""The zoo, end to end, side by side: optimize each model (cold, then warm from the profile
database), verify it, time korch against ONNX Runtime, torch.compile and eager PyTorch interleaved
in one process, and set every system against a roofline floor. Results accumulate in
OUT/results.json (one entry per model and device), so models can be run in separate invocations;
--render writes the markdown table and the bar chart from everything collected.

    python benchmarks/zoo_bench.py [MODEL ...] [--dir ZOO] [--out DIR] [--device cpu|cuda]
        [--backends a,b] [--time-budget S] [--peers a,b] [--rounds N] [--render BENCHMARKS_PART.md]
        [--chart PNG]

`--backends inductor,vendor --peers torch-compile,eager` on CPU rehearses the GPU run: no ONNX
Runtime runs the source model whole (it has no CUDA provider there), so korch's plans are made of
Inductor and vendor kernels and set against torch.compile, as on a GPU.
"""

from __future__ import annotations

# isort: off
import korch  # (first: korch.measure.openmp sets torch's OpenMP spin, as the CLI does)

# isort: on
import argparse
import dataclasses
import json
import platform
import sqlite3
import statistics
import time
from pathlib import Path

import torch

from korch.cli import zoo
from korch.cli.bench import bench
from korch.measure.device import cpu_model
from korch.measure.roofline import measure_ceilings, node_flops
from korch.pipeline import OptimizeOptions, optimize
from korch.plan.runtime import interleave
from korch.search.kernel import SOURCE_MODEL_PREFIX

MEMORY_BOUND = ("candy", "segformer-b0", "efficientvit-b1")
PAPER_MODELS = ("candy", "segformer-b0", "yolox-nano", "yolov4", "efficientvit-b1")


def roofline_floor_ms(graph, ceilings: dict) -> dict:
    """The fastest any system could be: all FLOPs at the measured matmul rate, or the compulsory
    traffic (inputs, weights, outputs, each moved once) at the measured copy bandwidth."""
    flops = sum(node_flops(n, graph.types) for n in graph.nodes)
    used = {v for n in graph.nodes for v in n.inputs}
    moved = [*graph.inputs, *graph.outputs, *(c for c in graph.constants if c in used)]
    nbytes = sum(graph.types[v].nbytes for v in set(moved))
    compute_ms = flops / (ceilings["gflops"] * 1e9) * 1e3
    memory_ms = nbytes / (ceilings["bandwidth_gbs"] * 1e9) * 1e3
    return {"gflop": flops / 1e9, "mbytes": nbytes / 1e6, "floor_ms": max(compute_ms, memory_ms)}


def top_kernels(plan, count: int = 5) -> list[dict]:
    """Where the time goes: the costliest kernels with their share of the prediction."""
    total = sum(k.cost_ms for k in plan.kernels) or 1.0
    ranked = sorted(plan.kernels, key=lambda k: -k.cost_ms)[:count]
    return [
        {
            "backend": k.backend,
            "ms": round(k.cost_ms, 4),
            "share": round(k.cost_ms / total, 3),
            "primitives": len(k.nodes),
            "ops": sorted({n.prim.value for n in k.spec.graph.nodes})[:6],
        }
        for k in ranked
    ]


def compile_seconds(db: Path) -> dict[str, float]:
    """Median compile time per candidate, by backend, over everything in the database."""
    with sqlite3.connect(db) as con:
        rows = con.execute("SELECT backend, compile_s FROM profiles WHERE compile_s IS NOT NULL").fetchall()
    by: dict[str, list[float]] = {}
    for backend, seconds in rows:
        by.setdefault(backend, []).append(seconds)
    return {b: round(statistics.median(v), 3) for b, v in by.items()}


def run_model(name: str, args, ceilings: dict, out: Path) -> dict:
    """One model's entry; korch's part is stored as unfinished before the peers compile, so a
    run cut short by a time limit still leaves its numbers."""
    path = zoo.build(name, args.dir)
    cache = Path(args.cache or Path(args.out) / f"profiles-{args.device}.sqlite")
    backends = tuple(b for b in (args.backends or "").split(",") if b) or None
    options = OptimizeOptions(
        device=args.device,
        cache=cache,
        time_budget=args.time_budget,
        max_size=args.max_size,
        backends=backends,
    )
    start = time.perf_counter()
    plan = optimize(path, options=options)
    cold_s = time.perf_counter() - start
    hits, warm_s = {"cache_hits": 0, "profiled": 0}, None
    if args.rerun:
        start = time.perf_counter()
        # again with nothing new to profile past the first chunk: what a cached re-run costs (the
        # same budget again would spend it profiling what the first run had no time for)
        again = optimize(path, options=dataclasses.replace(options, time_budget=0))
        warm_s = time.perf_counter() - start
        hits = again.meta.profiling
    err = plan.verify()
    measured = plan.meta.measured or {}
    # in the log before the peers compile: a run cut short by a time limit still says this much
    print(
        f"{name}: optimized in {cold_s:.1f} s, {len(plan.kernels)} kernels, predicted "
        f"{plan.predicted_ms:.3f} ms, in place {measured.get('ms', float('nan')):.3f} ms, "
        f"verify max rel err {err:.1e}",
        flush=True,
    )
    meta = plan.meta
    entry = {
        "model": name,
        "device": args.device,
        "backends": options.backends,
        "primitives": meta.fission["primitives"],
        "kernels": len(plan.kernels),
        "source_model_only": [k.spec.key[: len(SOURCE_MODEL_PREFIX)] for k in plan.kernels]
        == [SOURCE_MODEL_PREFIX],
        "greedy_kernels": meta.greedy_kernels,
        "predicted_ms": plan.predicted_ms,
        "prediction_checked": plan.prediction_checked,  # (False: priced by in-place timings)
        "greedy_ms": meta.greedy_ms,
        "solver": meta.solver,
        "profiling": meta.profiling,
        "optimize_cold_s": round(cold_s, 1),
        "optimize_warm_s": round(warm_s, 1) if warm_s is not None else None,
        "warm_cache_hit_rate": hits["cache_hits"] / max(hits["cache_hits"] + hits["profiled"], 1),
        "max_rel_err": err,
        "in_place_ms": measured.get("ms"),
        "roofline": roofline_floor_ms(plan.graph, ceilings),
        "top_kernels": top_kernels(plan),
        "compile_s_per_candidate": compile_seconds(cache),
        "time_budget": args.time_budget,
        "ceilings": ceilings,
    }
    store(out, entry, finished=False)
    peers = tuple(p for p in args.peers.split(",") if p)
    entry["bench"] = bench(plan, peers, rounds=args.rounds)
    return entry


def machine() -> dict:
    import onnxruntime

    return {
        "cpu": f"{platform.machine()} ({cpu_model()})",
        "cores": torch.get_num_threads(),
        "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
        "python": platform.python_version(),
        "korch": korch.__version__,
        "torch": torch.__version__,
        "onnxruntime": onnxruntime.__version__,
        "date": time.strftime("%Y-%m-%d"),
    }


def store(out: Path, entry: dict, finished: bool = True) -> None:
    """Into OUT/results.json: "runs" holds finished entries, "unfinished" those whose peers have
    not been timed (yet)."""
    path = out / "results.json"
    doc = json.loads(path.read_text()) if path.exists() else {"runs": {}}
    key = f"{entry['model']}@{entry['device']}"
    unfinished = doc.setdefault("unfinished", {})
    unfinished.pop(key, None)
    if finished:
        doc["runs"][key] = entry
    else:
        doc["runs"].pop(key, None)
        unfinished[key] = entry
    save(path, doc)


def save(path: Path, doc: dict) -> None:
    """`doc`, with this machine's description, written to `path` atomically."""
    doc["machine"] = machine()
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(doc, indent=1))
    tmp.replace(path)


def side_by_side(callers: dict, args) -> dict[str, dict]:
    """Each caller timed side by side (runtime.interleave: --rounds rounds of --block-s blocks,
    pauses between): its median, minimum and per-round medians, in ms."""
    rounds = interleave(callers, args.rounds, args.block_s, "cpu", pause_s=0.2)
    return {
        label: {
            "median_ms": round(statistics.median(ms for r in timed for ms in r), 4),
            "min_ms": round(min(ms for r in timed for ms in r), 4),
            "round_medians_ms": [round(statistics.median(r), 4) for r in timed],
        }
        for label, timed in rounds.items()
    }


def run_zoo(description: str, run_model, out_default: str, **options) -> None:
    """The command line of a script that runs `run_model(name, args)` on zoo models (the paper's
    five by default) and times them side by side (--rounds, --block-s), each model's entry saved in
    --out's "runs" as soon as it is done. `options`: more string options, name -> default."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("models", nargs="*", default=list(PAPER_MODELS))
    parser.add_argument("--dir", help="zoo cache directory")
    parser.add_argument("--out", default=out_default)
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--block-s", type=float, default=0.5)
    for name, default in options.items():
        parser.add_argument(f"--{name}", default=default)
    args = parser.parse_args()
    out = Path(args.out)
    doc = json.loads(out.read_text()) if out.exists() else {"runs": {}}
    for name in args.models:
        doc["runs"][name] = run_model(name, args)
        save(out, doc)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="*", help="zoo models (default: all; none with --render)")
    parser.add_argument("--dir", help="zoo cache directory")
    parser.add_argument("--out", default="bench-results", help="results directory (accumulates)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--cache", help="profile database (default OUT/profiles-DEVICE.sqlite)")
    parser.add_argument("--time-budget", type=float, default=300.0, help="profiling seconds per model")
    parser.add_argument("--max-size", type=int, default=12)
    parser.add_argument("--backends", help="korch's backends, comma-separated (default: the device's)")
    parser.add_argument("--peers", default="onnxruntime,torch-compile,eager")
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--no-rerun", dest="rerun", action="store_false", help="skip the cached re-run")
    parser.add_argument("--render", help="write the markdown tables here from OUT/results.json")
    parser.add_argument("--chart", help="write the bar chart (PNG) here")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    models = args.models or ([] if args.render else list(zoo.MODELS))
    ceilings = measure_ceilings(args.device) if models else {}
    for name in models:
        print(f"== {name}", flush=True)
        entry = run_model(name, args, ceilings, out)
        store(out, entry)
        res = entry["bench"]["results"]
        print(" ".join(f"{k} {v['median_ms']:.3f} ms" for k, v in res.items()), flush=True)
    if args.render or args.chart:
        from zoo_report import render

        render(out / "results.json", args.render, args.chart)


if __name__ == "__main__":
    main()
