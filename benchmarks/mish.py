"""Mish made cheaper (korch.rewrite.mish), measured: a zoo model's primitive graph as imported and
with only that rewrite applied, each run whole in each backend, checked against ONNX Runtime on the
source model and timed side by side (runtime.interleave: alternating blocks with pauses).

    python benchmarks/mish.py [MODEL ...] --out FILE [--dir ZOO] [--backends a,b] [--rounds 8]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from zoo_bench import save, side_by_side

from korch.cli import zoo
from korch.frontend import import_onnx
from korch.measure import check
from korch.orchestrate.solver import Choice, Solution
from korch.plan.plan import build_plan
from korch.rewrite import cheaper_mish
from korch.search.candidates import make_candidate


def run_model(name: str, args) -> dict:
    fission = import_onnx(zoo.build(name, args.dir))
    cheaper, notes = cheaper_mish(fission.graph)
    graphs = {"imported": fission.graph, "cheaper mish": cheaper}
    print(f"{name}: {len(notes)} Mish made cheaper", flush=True)
    plans, doc = {}, {"model": name, "rewritten": len(notes), "plans": {}}
    feeds = want = None
    for b in args.backends:
        for form, graph in graphs.items():
            whole = make_candidate(graph, range(len(graph.nodes)))
            plan = build_plan(graph, Solution([Choice(whole, b, 0.0)]), "cpu")
            if feeds is None:
                feeds = plan.random_inputs()
                want = check.onnxruntime_outputs(fission.model, feeds)
            label = f"{b} {form}"
            plans[label] = plan
            doc["plans"][label] = {"verify_error": check.compare_outputs(plan.run(feeds), want)}
            print(f"  {label}: verify {doc['plans'][label]['verify_error']:.1e}", flush=True)
    callers = {label: plan.executable().caller(plan.random_inputs()) for label, plan in plans.items()}
    for label, timing in side_by_side(callers, args).items():
        doc["plans"][label].update(timing)
    for b in args.backends:
        old, new = (doc["plans"][f"{b} {form}"] for form in graphs)
        print(f"  {b}: {old['median_ms']:.2f} -> {new['median_ms']:.2f} ms", flush=True)
    return doc


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="*", default=["yolov4"])
    parser.add_argument("--dir", help="zoo cache directory")
    parser.add_argument("--out", default="mish.json")
    backends = "inductor-frozen,onnxruntime,openvino"
    parser.add_argument("--backends", default=backends, type=lambda s: s.split(","))
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--block-s", type=float, default=0.5)
    args = parser.parse_args()
    out = Path(args.out)
    doc = json.loads(out.read_text()) if out.exists() else {"runs": {}}
    doc["date"] = time.strftime("%Y-%m-%d")
    for name in args.models:
        doc["runs"][name] = run_model(name, args)
        save(out, doc)


if __name__ == "__main__":
    main()
