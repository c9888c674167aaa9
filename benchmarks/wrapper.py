"""Inductor's C++ wrapper against its Python wrapper for korch's Inductor kernels on CPU: korch's
rewritten primitive graph of each zoo model as one kernel in each Inductor backend, compiled with
the code that calls its kernels and the libraries' in C++ (what korch compiles) and in Python
(Inductor's default), each checked against ONNX Runtime on the source model, then timed side by
side as a caller calls them (runtime.interleave: alternating blocks with pauses).

    python benchmarks/wrapper.py [MODEL ...] --dir ZOO --out FILE [--backends a,b] [--rounds 8]
"""

from __future__ import annotations

import math
import time
from pathlib import Path

from boundaries import korch_graph
from zoo_bench import run_zoo, side_by_side

from korch.backends import inductor
from korch.cli import zoo
from korch.measure import check
from korch.orchestrate.solver import Choice, Solution
from korch.plan.plan import build_plan
from korch.search.candidates import make_candidate


def run_model(name: str, args) -> dict:
    graph, model = korch_graph(zoo.build(name, args.dir), Path(args.out).with_suffix(".sqlite"))
    whole = make_candidate(graph, range(len(graph.nodes)))
    feeds = want = None
    doc, callers = {}, {}
    threshold = inductor.CPP_WRAPPER_FROM
    try:
        for backend in args.backends.split(","):
            for wrapper in ("python", "cpp"):  # (the C++ wrapper for no kernel, then for every one)
                inductor.CPP_WRAPPER_FROM = 0 if wrapper == "cpp" else math.inf
                start = time.perf_counter()
                plan = build_plan(graph, Solution([Choice(whole, backend, 0.0)]), "cpu")
                executable = plan.executable()  # (compiles)
                compile_s = time.perf_counter() - start
                if feeds is None:
                    feeds = plan.random_inputs()
                    want = check.onnxruntime_outputs(model, feeds)
                label = f"{backend} {wrapper}"
                doc[label] = {
                    "compile_s": round(compile_s, 1),
                    "launches": executable.launches,
                    "verify_error": check.compare_outputs(plan.run(feeds), want),
                }
                callers[label] = executable.caller(plan.random_inputs())
                print(f"  {name} {label}: compiled in {compile_s:.0f} s", flush=True)
    finally:
        inductor.CPP_WRAPPER_FROM = threshold
    for label, timing in side_by_side(callers, args).items():
        doc[label].update(timing)
    for backend in args.backends.split(","):
        python, cpp = doc[f"{backend} python"], doc[f"{backend} cpp"]
        print(
            f"{name} {backend}: python {python['median_ms']:.2f} ({python['min_ms']:.2f}) ms, "
            f"cpp {cpp['median_ms']:.2f} ({cpp['min_ms']:.2f}) ms: python / cpp "
            f"{python['median_ms'] / cpp['median_ms']:.3f} (minima {python['min_ms'] / cpp['min_ms']:.3f})",
            flush=True,
        )
    return {"model": name, "plans": doc}


def main() -> None:
    run_zoo(__doc__.splitlines()[0], run_model, "wrapper.json", backends="inductor-frozen,inductor")


if __name__ == "__main__":
    main()
