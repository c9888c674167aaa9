"""Would mixing ONNX Runtime with korch's kernels pay? For every partition of a model, ONNX Runtime
run on the partition's original ONNX nodes (a "region", cut out with onnx.utils.Extractor) against
what korch has for that partition: the per-partition optimum of the kernels profiled so far and
the whole-partition seed. Each region's outputs are checked against the primitive graph's values.

    python benchmarks/regions_vs_ort.py MODEL.onnx [--cache DB] [--time-budget S]

A partition has no region when one ONNX operator's primitives fall into two partitions ("split
op") or a value crossing its boundary has no ONNX name (an operator lowered into several).
"""

from __future__ import annotations

import argparse
import math
import tempfile
from collections import defaultdict
from pathlib import Path

import onnx
import onnxruntime as ort
import torch

from korch.backends import get_backends
from korch.frontend import import_onnx
from korch.measure import check
from korch.measure.timing import time_fn
from korch.orchestrate.solver import solve
from korch.pipeline import WHOLE_GRAPH, add_seeds, original_model_seed
from korch.profile.database import ProfileDB
from korch.profile.jobs import load_array, spill_activations
from korch.profile.profiler import ProfileOptions, profile
from korch.search.candidates import CandidateOptions, enumerate_candidates


def regions(fission, partitions) -> dict[int, tuple | str]:
    """partition index -> (region model, input values, output values), or why there is none."""
    graph, model = fission.graph, onnx.shape_inference.infer_shapes(fission.model)
    by_origin: dict[str, set[int]] = defaultdict(set)
    consumers: dict[str, set[int]] = defaultdict(set)
    for i, node in enumerate(graph.nodes):
        by_origin[node.origin].add(i)
        for v in node.inputs:
            consumers[v].add(i)
    names = fission.onnx_names
    out: dict[int, tuple | str] = {}
    for part in partitions:
        inside = set(range(part.start, part.stop))
        origins = {graph.nodes[i].origin for i in inside}
        if any(not by_origin[o] <= inside for o in origins):
            out[part.index] = "split op"
            continue
        made = {v for i in inside for v in graph.nodes[i].outputs}
        ins = sorted({v for i in inside for v in graph.nodes[i].inputs} - made - set(graph.constants))
        outs = sorted(v for v in made if consumers[v] - inside or v in graph.outputs)
        if any(v not in names for v in ins + outs):
            out[part.index] = "unnamed boundary"
            continue
        sub = onnx.utils.Extractor(model).extract_model([names[v] for v in ins], [names[v] for v in outs])
        outside = [
            n
            for n in sub.graph.node
            if by_origin.get(f"{n.op_type}:{n.name}") and (f"{n.op_type}:{n.name}" not in origins)
        ]
        out[part.index] = f"pulls in {len(outside)} outside nodes" if outside else (sub, ins, outs)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("--cache", default=None, help="profile database (default korch's)")
    parser.add_argument("--time-budget", type=float, default=0.0, help="seconds of new profiling")
    args = parser.parse_args()
    fission = import_onnx(args.model)
    graph = fission.graph
    found = enumerate_candidates(graph, CandidateOptions(max_size=12))
    add_seeds(graph, found)
    seed = original_model_seed(graph, fission.model)
    if seed is None:
        raise SystemExit("the source model cannot run as one kernel (an output is an input or a constant)")
    source, source_spec = seed
    found.candidates.append(source)
    db = ProfileDB(args.cache)
    options = ProfileOptions(time_budget=args.time_budget, progress=False)
    result = profile(graph, found, get_backends(None), db, options, {source.key: source_spec})
    db.close()
    parts = [c for c in found.candidates if c.partition != WHOLE_GRAPH]
    solution = solve(graph, found.partitions, parts, result.cost, 60)
    optimum: dict[int, float] = defaultdict(float)
    for choice in solution.chosen:
        optimum[choice.candidate.partition] += choice.cost_ms
    seeds = {c.partition: c for c in parts if c.seed}
    cut = regions(fission, found.partitions)
    scratch = tempfile.TemporaryDirectory()
    needed = {v for r in cut.values() if not isinstance(r, str) for v in r[1] + r[2]}
    values = spill_activations(graph, needed, Path(scratch.name))
    print(f"{'part':>4} {'prims':>5} {'korch best ms':>13} {'seed ms':>8} {'ORT region ms':>13}  check")
    total = {"korch": 0.0, "ort": 0.0, "mix": 0.0}
    for part in found.partitions:
        best = optimum[part.index]
        seed = result.cost(seeds[part.index].key)[0] if part.index in seeds else math.nan
        region = cut[part.index]
        if isinstance(region, str):
            print(f"{part.index:4d} {part.stop - part.start:5d} {best:13.3f} {seed:8.3f} {'-':>13}  {region}")
            ort_ms = best
        else:
            sub, ins, outs = region
            opts = ort.SessionOptions()
            opts.log_severity_level = 3
            opts.intra_op_num_threads = torch.get_num_threads()
            opts.add_session_config_entry("session.intra_op.allow_spinning", "0")  # as in a plan
            sess = ort.InferenceSession(sub.SerializeToString(), opts, providers=["CPUExecutionProvider"])
            feeds = {fission.onnx_names[v]: load_array(values[v]) for v in ins}
            got = sess.run(None, feeds)
            err = max(check.rel_err(g, load_array(values[v])) for g, v in zip(got, outs))
            ort_ms = time_fn(lambda f: sess.run(None, f), [feeds], "cpu", 0.2)[0]  # noqa: B023 (called here)
            print(
                f"{part.index:4d} {part.stop - part.start:5d} {best:13.3f} {seed:8.3f} {ort_ms:13.3f}  "
                f"{'ok' if err <= 1e-4 else 'WRONG'} (rel err {err:.1e})"
            )
        total["korch"] += best
        total["ort"] += ort_ms
        total["mix"] += min(best, ort_ms)
    whole = result.cost(source.key)[0]
    print(
        f"sums (isolated, ms): korch's kernels {total['korch']:.2f}, ONNX Runtime regions "
        f"{total['ort']:.2f}, the better of the two per partition {total['mix']:.2f}; "
        f"the source model run whole {whole:.2f}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
