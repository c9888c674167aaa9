"""What a kernel boundary costs, and whether a mix of backends by region pays for it: korch's
rewritten primitive graph of each zoo model run as plans built by hand, timed side by side.

For each backend: the whole graph as one kernel ("whole B"), and the graph's partition seeds
(korch.pipeline.add_seeds: the regions korch's candidates are enumerated in) as one kernel each
("parts B"). Each partition is timed in place in every parts plan (Executable.time_steps); "mix"
takes each partition's fastest backend. Then the whole graph cut at k evenly spaced places of its
topological order, one kernel per piece in --split-backend ("cut k"). Every plan is checked against
ONNX Runtime on the source model, then all are timed as a caller calls them, side by side
(runtime.interleave: alternating blocks with pauses, so one system's spinning threads do not tax
the next).

    python benchmarks/boundaries.py [MODEL ...] --dir ZOO --out FILE [--backends a,b]
        [--split-backend inductor-frozen] [--splits 2,4,8,16] [--rounds 8]

"crossing MB" is what a plan's kernels write for other kernels to read (values that are not the
model's outputs): the traffic a boundary adds where one compile would have kept a value in cache
or fused it away.
"""

from __future__ import annotations

import argparse
import json
import time
from collections import Counter
from pathlib import Path

import onnx
from zoo_bench import PAPER_MODELS, save, side_by_side

from korch.cli import zoo
from korch.frontend import import_onnx
from korch.ir.graph import Graph
from korch.measure import check
from korch.orchestrate.solver import Choice, Solution
from korch.pipeline import add_seeds, unfused
from korch.plan.plan import build_plan
from korch.plan.runtime import measure_in_place
from korch.profile.database import ProfileDB
from korch.profile.rewrite_timing import RewriteTimer
from korch.rewrite import rewrite
from korch.search.candidates import Candidate, CandidateOptions, enumerate_candidates, make_candidate

BACKENDS = "inductor-frozen,inductor,onnxruntime,openvino"


def korch_graph(path: Path, db: Path) -> tuple[Graph, onnx.ModelProto]:
    """The graph korch optimizes: imported, then rewritten (the timed rewrites decided as
    `korch optimize` decides them, kept in `db`); and the source model."""
    fission = import_onnx(path)
    profiles = ProfileDB(db)
    try:
        return rewrite(fission.graph, RewriteTimer("cpu", profiles))[0], fission.model
    finally:
        profiles.close()


def partition_seeds(graph: Graph) -> list[Candidate]:
    """The partitions as optimize seeds them (around the primitives that run alone), in order."""
    found = enumerate_candidates(graph, CandidateOptions(max_size=1))
    add_seeds(graph, found, unfused(graph, ["inductor"]))
    return [c for c in found.candidates if c.seed and len(c.nodes) < len(graph.nodes)]


def crossing_mb(graph: Graph, cands: list[Candidate]) -> float:
    outputs = set(graph.outputs)
    return sum(graph.types[v].nbytes for c in cands for v in c.outputs if v not in outputs) / 1e6


def kinds(graph: Graph, cand: Candidate) -> dict[str, int]:
    return dict(Counter(graph.nodes[i].prim.kind.name.lower() for i in cand.nodes))


def run_model(name: str, args) -> dict:
    path = zoo.build(name, args.dir)
    graph, model = korch_graph(path, Path(args.out).with_suffix(".sqlite"))
    feeds = want = None
    seeds = partition_seeds(graph)
    whole = make_candidate(graph, range(len(graph.nodes)))
    print(f"{name}: {len(graph.nodes)} primitives, {len(seeds)} partitions", flush=True)
    plans, doc, in_place = {}, {}, {}

    def add(label: str, backends: list[str], cands: list[Candidate]):
        start = time.perf_counter()
        try:
            plan = build_plan(graph, Solution([Choice(c, b, 0.0) for c, b in zip(cands, backends)]), "cpu")
            nonlocal feeds, want
            if feeds is None:  # (ONNX Runtime on the source model: the oracle, run once)
                feeds = plan.random_inputs()
                want = check.onnxruntime_outputs(model, feeds)
            error = check.compare_outputs(plan.run(feeds), want)
            measured = measure_in_place(plan, repeats=5, spread_s=1.0)
        except Exception as e:  # a backend that cannot run a region: said, and the rest go on
            print(f"  {label}: failed ({str(e).splitlines()[0][:160]})", flush=True)
            return None
        plans[label] = plan
        doc[label] = {"kernels": len(cands), "crossing_mb": round(crossing_mb(graph, cands[:-1]), 2)}
        doc[label]["verify_error"] = error
        print(f"  {label}: {measured['ms']:.2f} ms in place, {time.perf_counter() - start:.0f} s", flush=True)
        return measured

    # (a primitive that runs alone, an opaque operator, is in no partition seed)
    parts = sum(len(s.nodes) for s in seeds) == len(graph.nodes)
    for b in args.backends.split(","):
        add(f"whole {b}", [b], [whole])
        measured = add(f"parts {b}", [b] * len(seeds), seeds) if parts else None
        if measured:
            in_place[b] = measured["kernels_ms"]
    best = [min(in_place, key=lambda b: in_place[b][i]) for i in range(len(seeds))] if in_place else []
    if best:
        add("mix", best, seeds)
    for k in args.splits:
        n = len(graph.nodes)
        cuts = [round(i * n / k) for i in range(k + 1)]
        pieces = [make_candidate(graph, range(a, b)) for a, b in zip(cuts, cuts[1:])]
        add(f"cut {k}", [args.split_backend] * k, pieces)
    callers = {label: plan.executable().caller(plan.random_inputs()) for label, plan in plans.items()}
    for label, timing in side_by_side(callers, args).items():
        doc[label].update(timing)
    partitions = [
        {
            "primitives": len(seed.nodes),
            "kinds": kinds(graph, seed),
            "in_place_ms": {b: round(t[i], 4) for b, t in in_place.items()},
            "fastest": best[i],
        }
        for i, seed in enumerate(seeds)
    ]
    return {"model": name, "primitives": len(graph.nodes), "plans": doc, "partitions": partitions}


def markdown(doc: dict) -> str:
    """One row per model: each backend's whole-graph median; its partitions plan's median over its
    whole graph's; the mix's median over the fastest whole graph; the cuts' medians over the whole
    graph in the cutting backend; how many partitions each backend ran fastest in place."""
    runs = list(doc["runs"].values())
    backends = list(
        dict.fromkeys(label[6:] for e in runs for label in e["plans"] if label.startswith("whole "))
    )
    cuts = list(dict.fromkeys(label for e in runs for label in e["plans"] if label.startswith("cut ")))
    split = doc.get("split_backend", "inductor-frozen")
    short = ", ".join(backends)
    head = ["model", "partitions", f"whole ms ({short})", f"parts / whole ({short})"]
    head += ["mix ms (/ fastest whole)", f"{', '.join(cuts)} / whole {split}", "partitions won"]
    lines = ["| " + " | ".join(head) + " |", "|---" * len(head) + "|"]

    def ms(plans: dict, label: str) -> float | None:
        return plans[label]["median_ms"] if label in plans else None

    for e in runs:
        plans = e["plans"]
        wholes = {b: ms(plans, f"whole {b}") for b in backends}
        fastest = min(v for v in wholes.values() if v is not None)
        parts = [
            f"{ms(plans, f'parts {b}') / wholes[b]:.2f}" if ms(plans, f"parts {b}") and wholes[b] else "-"
            for b in backends
        ]
        mix = f"{ms(plans, 'mix'):.2f} ({ms(plans, 'mix') / fastest:.2f}x)" if "mix" in plans else "-"
        base = wholes.get(split)
        cut = [f"{ms(plans, c) / base:.2f}" if base and ms(plans, c) else "-" for c in cuts]
        won = Counter(part["fastest"] for part in e["partitions"])
        cells = [e["model"], str(len(e["partitions"]))]
        cells += [" / ".join("-" if v is None else f"{v:.2f}" for v in wholes.values()), " / ".join(parts)]
        cells += [mix, " / ".join(cut), ", ".join(f"{b} {n}" for b, n in won.most_common())]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="*", default=list(PAPER_MODELS))
    parser.add_argument("--dir", help="zoo cache directory")
    parser.add_argument("--out", default="boundaries.json")
    parser.add_argument("--backends", default=BACKENDS)
    parser.add_argument("--split-backend", default="inductor-frozen")
    parser.add_argument("--splits", default="2,4,8,16", type=lambda s: [int(k) for k in s.split(",") if k])
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--block-s", type=float, default=0.5)
    args = parser.parse_args()
    out = Path(args.out)
    doc = json.loads(out.read_text()) if out.exists() else {"runs": {}}
    doc["split_backend"] = args.split_backend
    for name in args.models:
        doc["runs"][name] = run_model(name, args)
        save(out, doc)
    print(markdown(doc))


if __name__ == "__main__":
    main()
