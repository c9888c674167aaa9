"""korch's primitive graph written back as ONNX (korch.backends.onnxrt.to_onnx) with each set of
patterns (korch.backends.onnx_patterns: PATTERNS, ONNX Runtime's; OPENVINO_PATTERNS, which also
writes Softplus and Mish), in ONNX Runtime and in OpenVINO, against the source model in each: each
zoo model's rewritten graph as one kernel, checked against ONNX Runtime on the source model, then
timed side by side as a caller calls it (runtime.interleave: alternating blocks with pauses).

    python benchmarks/onnx_export.py [MODEL ...] --dir ZOO --out FILE [--rounds 8]
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from boundaries import korch_graph
from zoo_bench import run_zoo, side_by_side

from korch.backends import onnx_patterns
from korch.cli import zoo
from korch.measure import check
from korch.orchestrate.solver import Choice, Solution
from korch.pipeline import original_model_seed
from korch.plan.plan import build_plan
from korch.search.candidates import make_candidate
from korch.search.kernel import WHOLE_GRAPH_PREFIX

PATTERN_SETS = {
    "onnxruntime's patterns": onnx_patterns.PATTERNS,
    "openvino's patterns": onnx_patterns.OPENVINO_PATTERNS,
}


def run_model(name: str, args) -> dict:
    graph, model = korch_graph(zoo.build(name, args.dir), Path(args.out).with_suffix(".sqlite"))
    whole = make_candidate(graph, range(len(graph.nodes)))
    # (keyed as optimize keys the whole graph: a kernel that is a plan alone, whose threads may spin)
    whole = dataclasses.replace(whole, key=WHOLE_GRAPH_PREFIX + whole.key)
    source, source_spec = original_model_seed(graph, model)
    plans = {}
    for backend in ("onnxruntime", "openvino"):
        plans[f"{backend}, source model"] = build_plan(
            graph, Solution([Choice(source, backend, 0.0)]), "cpu", specs={source.key: source_spec}
        )
        for label, patterns in PATTERN_SETS.items():
            # each backend writes its graph with its own set (onnxrt: PATTERNS, openvino:
            # OPENVINO_PATTERNS): both names stand for `patterns` while the plan compiles
            kept = onnx_patterns.PATTERNS, onnx_patterns.OPENVINO_PATTERNS
            onnx_patterns.PATTERNS = onnx_patterns.OPENVINO_PATTERNS = patterns
            try:
                plan = build_plan(graph, Solution([Choice(whole, backend, 0.0)]), "cpu")
                plan.executable()  # (compiles)
            finally:
                onnx_patterns.PATTERNS, onnx_patterns.OPENVINO_PATTERNS = kept
            plans[f"{backend}, korch's graph, {label}"] = plan
    feeds = next(iter(plans.values())).random_inputs()
    want = check.onnxruntime_outputs(model, feeds)
    doc, callers = {}, {}
    for label, plan in plans.items():
        executable = plan.executable()
        doc[label] = {
            "launches": executable.launches,
            "verify_error": check.compare_outputs(plan.run(feeds), want),
        }
        callers[label] = executable.caller(plan.random_inputs())
    for label, timing in side_by_side(callers, args).items():
        doc[label].update(timing)
        print(
            f"{name} {label}: {doc[label]['median_ms']:.2f} ({doc[label]['min_ms']:.2f}) ms, "
            f"{doc[label]['launches']} launches, err {doc[label]['verify_error']:.1e}",
            flush=True,
        )
    return {"model": name, "plans": doc}


def main() -> None:
    run_zoo(__doc__.splitlines()[0], run_model, "onnx_export.json")


if __name__ == "__main__":
    main()
