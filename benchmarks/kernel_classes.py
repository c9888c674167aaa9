"""Where a whole-graph compile spends its time, by kernel class: korch's rewritten primitive graph of
each zoo model run as one kernel in Inductor frozen and in OpenVINO, each call's time split into

- **linear**: the convolution and matmul calls, each with the epilogue fused into it (Inductor
  frozen: its oneDNN and MKL calls, as torch's profiler names them; OpenVINO: its Convolution,
  GroupConvolution, MatMul and FullyConnected nodes),
- **generated**: everything else the compiler runs (Inductor's C++ loops, recorded by
  `cpp.enable_kernel_profile`; OpenVINO's other nodes: eltwise subgraphs, normalizations,
  reductions, pools, resizes, concatenations),
- **layout**: the conversions the compiler inserts (OpenVINO's Reorder nodes; torch's copy
  operators in Inductor's code),
- **rest**: the call's wall time that no recorded operator accounts for (the wrapper, allocations).

Profiled calls run slower than plain ones (each recorded operator costs a little), so the table
also gives each plan's median timed without a profiler, side by side (runtime.interleave). Inductor
kernels are compiled with its Python wrapper here (korch's whole graphs use the C++ wrapper, whose
calls torch's profiler does not see; BENCHMARKS.md's design constants compare the two wrappers).

    python benchmarks/kernel_classes.py [MODEL ...] --dir ZOO --out FILE [--calls 5] [--rounds 8]
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import time
from collections import Counter
from pathlib import Path

import numpy as np
import torch
from boundaries import korch_graph
from torch._inductor import config as inductor_config
from zoo_bench import PAPER_MODELS, save, side_by_side

import korch.backends.inductor as inductor_backend
from korch.backends.onnx_patterns import OPENVINO_PATTERNS
from korch.backends.onnxrt import to_onnx
from korch.backends.openvino import _config
from korch.cli import zoo
from korch.orchestrate.solver import Choice, Solution
from korch.plan.plan import build_plan
from korch.search.candidates import make_candidate

CLASSES = ("linear", "generated", "layout", "rest")
OV_LINEAR = {"Convolution", "GroupConvolution", "MatMul", "FullyConnected", "Deconvolution"}
TORCH_LINEAR = ("convolution", "linear", "aten::mm", "bmm", "addmm", "matmul", "mkl")
TORCH_LAYOUT = ("copy", "contiguous", "clone", "reorder", "to_dense")


def torch_class(name: str) -> str:
    if name.startswith("graph_") or "cpp_fused" in name:
        return "generated"
    if any(s in name for s in TORCH_LAYOUT):
        return "layout"
    if any(s in name for s in TORCH_LINEAR):
        return "linear"
    return "rest"


def ov_class(node_type: str) -> str:
    if node_type in OV_LINEAR:
        return "linear"
    return "layout" if node_type == "Reorder" else "generated"


def split(by_op: Counter, classify, calls: int, wall_ms: float) -> tuple[Counter, Counter]:
    """Per-call milliseconds by class (the unrecorded remainder of the wall time as "rest"), and by
    (class, operator)."""
    ms, ops = Counter(), Counter()
    for op, total in by_op.items():
        c = classify(op)
        ms[c] += total / calls
        ops[c, op] += total / calls
    ms["rest"] += max(0.0, wall_ms - sum(ms.values()))
    return ms, ops


def inductor_profiler(plan):
    """Inductor frozen's one kernel: a block of calls under torch's profiler, self time by operator."""
    run = plan.executable().caller(plan.random_inputs())

    def block(calls: int) -> tuple[Counter, Counter]:
        run()
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            start = time.perf_counter()
            for _ in range(calls):
                run()
            wall_ms = (time.perf_counter() - start) * 1e3 / calls
        by_op = Counter({e.key: e.self_cpu_time_total / 1e3 for e in prof.key_averages()})
        return split(by_op, torch_class, calls, wall_ms)

    return block


def openvino_profiler(plan):
    """The same graph as korch's openvino backend compiles it: a block of calls, OpenVINO's per-node
    counters by node type."""
    import openvino
    import openvino.properties as props

    spec = plan.kernels[0].spec
    weights = {n: plan.weights[v] for n, v in zip(spec.graph.inputs, spec.inputs) if v in plan.weights}
    proto = to_onnx(spec.graph, weights, OPENVINO_PATTERNS)
    core = openvino.Core()
    compiled = core.compile_model(
        core.read_model(proto.SerializeToString()), "CPU", {**_config(), props.enable_profiling(): True}
    )
    request = compiled.create_infer_request()
    feeds = plan.random_inputs()
    pairs = zip(spec.graph.inputs, spec.inputs)
    by_name = {n: np.ascontiguousarray(feeds[v]) for n, v in pairs if v in feeds}
    for i, port in enumerate(compiled.inputs):
        request.set_input_tensor(i, openvino.Tensor(by_name[port.get_any_name()], shared_memory=True))

    def block(calls: int) -> tuple[Counter, Counter]:
        request.infer()
        by_op, wall = Counter(), 0.0
        for _ in range(calls):
            start = time.perf_counter()
            request.infer()
            wall += time.perf_counter() - start
            for info in request.get_profiling_info():
                by_op[info.node_type] += info.real_time.total_seconds() * 1e3
        return split(by_op, ov_class, calls, wall * 1e3 / calls)

    return block


PROFILERS = {"inductor-frozen": inductor_profiler, "openvino": openvino_profiler}


def profiled(blocks: dict, rounds: int, calls: int) -> dict[str, dict]:
    """Each backend's profiled blocks of `calls` calls, alternating (A B, then B A, ...) with
    pauses, so that a slow stretch of a shared machine falls on both: per class the median over the
    rounds, and each class's three costliest operators (by their median)."""
    seen = {b: ([], []) for b in blocks}
    order = list(blocks)
    for r in range(rounds):
        for b in order if r % 2 == 0 else order[::-1]:
            time.sleep(0.2)
            ms, ops = blocks[b](calls)
            seen[b][0].append(ms)
            seen[b][1].append(ops)
    out = {}
    for b, (by_class, by_op) in seen.items():
        top = {c: Counter() for c in CLASSES}
        for c, op in set().union(*by_op):
            top[c][op] = statistics.median(o[c, op] for o in by_op)
        out[b] = {
            "per_call_ms": {c: round(statistics.median(m[c] for m in by_class), 4) for c in CLASSES},
            "top": {c: {op: round(v, 4) for op, v in t.most_common(3)} for c, t in top.items() if t},
        }
    return out


def run_model(name: str, args) -> dict:
    graph, _ = korch_graph(zoo.build(name, args.dir), Path(args.out).with_suffix(".sqlite"))
    whole = make_candidate(graph, range(len(graph.nodes)))
    plans = {b: build_plan(graph, Solution([Choice(whole, b, 0.0)]), "cpu") for b in args.backends}
    print(f"{name}: {len(graph.nodes)} primitives", flush=True)
    blocks = {b: PROFILERS[b](plan) for b, plan in plans.items()}
    doc = {"model": name, "primitives": len(graph.nodes)}
    doc["backends"] = profiled(blocks, args.rounds, args.calls)
    for b, r in doc["backends"].items():
        print(f"  {b}: {r['per_call_ms']}", flush=True)
    callers = {b: plan.executable().caller(plan.random_inputs()) for b, plan in plans.items()}
    for b, timing in side_by_side(callers, args).items():
        doc["backends"][b].update(timing)
    return doc


def short(op: str, most: int = 48) -> str:
    """An operator's name for the table: Inductor's graph prefix dropped, long names cut."""
    op = re.sub(r"^graph_\d+_", "", op)
    return op if len(op) <= most else op[: most - 3] + "..."


def markdown(doc: dict) -> str:
    """One row per model and backend: the plain median, then ms per profiled call by class."""
    head = ["model", "backend", "median ms", *(f"{c} ms" for c in CLASSES), "costliest generated"]
    lines = ["| " + " | ".join(head) + " |", "|---" * len(head) + "|"]
    for e in doc["runs"].values():
        for b, r in e["backends"].items():
            top = ", ".join(f"{short(op)} {v:.2f}" for op, v in r["top"].get("generated", {}).items())
            cells = [e["model"], b, f"{r['median_ms']:.2f}", *(f"{r['per_call_ms'][c]:.2f}" for c in CLASSES)]
            lines.append("| " + " | ".join([*cells, top]) + " |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="*", default=list(PAPER_MODELS))
    parser.add_argument("--dir", help="zoo cache directory")
    parser.add_argument("--out", default="kernel-classes.json")
    parser.add_argument("--backends", default="inductor-frozen,openvino", type=lambda s: s.split(","))
    parser.add_argument("--calls", type=int, default=5, help="calls per profiled block")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--block-s", type=float, default=0.5)
    args = parser.parse_args()
    # Inductor's Python wrapper (its calls visible to torch's profiler), its C++ loops recorded
    inductor_backend.CPP_WRAPPER_FROM = 10**9
    inductor_config.cpp.enable_kernel_profile = True
    out = Path(args.out)
    doc = json.loads(out.read_text()) if out.exists() else {"runs": {}}
    doc.update(date=time.strftime("%Y-%m-%d"), threads=torch.get_num_threads(), calls=args.calls)
    for name in args.models:
        doc["runs"][name] = run_model(name, args)
        save(out, doc)
    print(markdown(doc))


if __name__ == "__main__":
    main()
