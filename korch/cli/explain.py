"""`korch explain`: what a plan chose and why, as a JSON-able report and as text."""

from __future__ import annotations

from collections import Counter

from korch.ir.prims import DTYPES
from korch.measure.roofline import flops_ceiling, matmul_dtype, node_flops, traffic_bytes
from korch.orchestrate.solve_measure import node_indices
from korch.plan.plan import Plan, PlanKernel
from korch.search.kernel import SOURCE_MODEL_PREFIX


def kernel_nodes(plan: Plan, kernel: PlanKernel) -> tuple[list, dict]:
    """(the kernel's primitives, the types they use): from the plan's whole primitive graph when it
    has one, else from the kernel's own graph (a plan saved without its graph)."""
    graph = plan.graph
    if graph is not None and kernel.nodes:
        return [graph.nodes[i] for i in kernel.nodes], graph.types
    return list(kernel.spec.graph.nodes), kernel.spec.graph.types


def _rates(kernel: PlanKernel, flops: int, peak_gflops: float | None, ceilings: dict) -> dict:
    graph = kernel.spec.graph
    moved = traffic_bytes([graph.types[v] for v in (*graph.inputs, *graph.outputs)])
    seconds = kernel.cost_ms / 1e3
    out = {"bytes": moved, "flops": flops, "gbs": None, "gflops": None, "bw_frac": None, "flop_frac": None}
    if seconds > 0:
        out["gbs"] = round(moved / seconds / 1e9, 3)
        out["gflops"] = round(flops / seconds / 1e9, 3) if flops else None
    if out["gbs"] is not None and ceilings.get("bandwidth_gbs"):
        out["bw_frac"] = round(out["gbs"] / ceilings["bandwidth_gbs"], 4)
    if out["gflops"] is not None and peak_gflops:
        out["flop_frac"] = round(out["gflops"] / peak_gflops, 4)
    return out


def _kernel_report(plan: Plan, index: int, kernel: PlanKernel, alternatives: list, ceilings: dict) -> dict:
    nodes, types = kernel_nodes(plan, kernel)
    total = plan.predicted_ms or sum(k.cost_ms for k in plan.kernels)
    in_place = plan.meta.measured["kernels_ms"] if plan.meta.measured else []
    return {
        "index": index,
        "backend": kernel.backend,
        "ms": round(kernel.cost_ms, 6),
        "in_place_ms": in_place[index] if len(in_place) == len(plan.kernels) else None,
        "share": round(kernel.cost_ms / total, 4) if total else None,
        "primitives": len(kernel.nodes) or len(nodes),
        "nodes": list(kernel.nodes),
        "names": [n.prim.value for n in nodes],
        "origins": list(dict.fromkeys(n.origin for n in nodes if n.origin)),
        "seed": kernel.spec.seed or kernel.spec.key.startswith(SOURCE_MODEL_PREFIX),
        **_rates(
            kernel,
            sum(node_flops(n, types) for n in nodes),
            flops_ceiling(ceilings, matmul_dtype(nodes, types)),
            ceilings,
        ),
        "alternatives": alternatives[index] if index < len(alternatives) else [],
    }


def report(plan: Plan, source: str = "", pruned: bool = False) -> dict:
    """Everything `korch explain` shows, as one JSON-able dictionary; with `pruned`, the search's
    list of each pruned candidate too ("pruned_candidates": why -> partition -> primitives, as
    korch.orchestrate.solve_measure.SearchReport keeps them)."""
    meta = plan.meta
    kernels = [
        _kernel_report(plan, i, k, meta.alternatives, meta.ceilings) for i, k in enumerate(plan.kernels)
    ]
    # (a plan assembled by hand, not by korch.optimize, has empty summaries: the .get()s)
    return {
        "plan": source,
        "device": plan.device,
        "device_name": meta.device_name,
        "predicted_ms": round(plan.predicted_ms, 6),
        "kernels": kernels,
        "backends": dict(Counter(k.backend for k in plan.kernels)),
        "primitives": meta.fission.get("primitives"),
        "has_graph": plan.graph is not None,
        "solver": meta.solver,
        "greedy_ms": meta.greedy_ms,
        "greedy_kernels": meta.greedy_kernels,
        "measured": meta.measured,  # the plan run whole, each kernel timed in place
        "candidates": {k: v for k, v in meta.candidates.items() if k != "pruned"},
        "pruned": meta.candidates.get("pruned", {}),
        "profiling": meta.profiling,
        "ceilings": meta.ceilings,
        "opaque_ops": meta.fission.get("opaque_ops", []),
        "rewrites": meta.rewrites,
        "search": search_totals(meta.search),
        "decided_by": meta.decided_by,
        # (asked for: each pruned candidate; None where the plan records none, an older korch's)
        **({"pruned_candidates": (meta.search or {}).get("pruned_candidates")} if pruned else {}),
    }


def search_totals(search: dict | None) -> dict | None:
    """The search's summary without its list of each pruned candidate (optimize --json's, and
    explain's unless asked)."""
    return None if search is None else {k: v for k, v in search.items() if k != "pruned_candidates"}


def _fmt_ms(ms) -> str:
    return "-" if ms is None else f"{ms:.4f} ms"


def rate_text(k: dict) -> str:
    """FLOP rate for kernels with linear primitives, bandwidth otherwise, with the ceiling fraction."""
    if k["gflops"] is not None:
        frac = f" ({k['flop_frac']:.0%} of peak)" if k["flop_frac"] is not None else ""
        return f"{k['gflops']:.2f} GFLOP/s{frac}"
    if k["gbs"] is not None:
        frac = f" ({k['bw_frac']:.0%} of peak)" if k["bw_frac"] is not None else ""
        return f"{k['gbs']:.2f} GB/s{frac}"
    return "-"


def names_text(names: list[str], limit: int = 8) -> str:
    shown = ", ".join(names[:limit])
    return shown + (f", ... (+{len(names) - limit})" if len(names) > limit else "")


def alternative_text(a: dict) -> str:
    backend = f" [{a['backend']}]" if a.get("backend") else ""
    return f"{a['what']}{backend}: {a['ms']:.4f} ms"


def greedy_text(r: dict) -> str:
    greedy = r["greedy_ms"]
    if greedy is None:
        return "none (some primitive has no profiled kernel of its own)"
    ratio = f" ({greedy / r['predicted_ms']:.2f}x the plan's time)" if r["predicted_ms"] else ""
    return f"{greedy:.4f} ms in {r['greedy_kernels']} kernels{ratio}"


def measured_text(r: dict) -> str:
    m = r["measured"]
    ratio = m.get("predicted_over_measured")
    return f"{m['ms']:.4f} ms" + (f" (predicted / measured {ratio:.2f})" if ratio else "")


def profiling_text(p: dict) -> str:
    keys = ("profiled", "cache_hits", "failed", "skipped")
    return ", ".join(f"{k.replace('_', ' ')} {p[k]}" for k in keys if k in p) or "-"


def search_lines(search: dict, decided_by: str) -> list[str]:
    """The search's totals, then each partition's: measured, bounded, and why pairs were pruned."""
    gap = search["certified_gap"]
    certified = (
        "not certified" if gap is None else "certified optimal" if gap == 0 else f"certified gap {gap:.1%}"
    )
    bound = "-" if search["lower_bound_ms"] is None else f"{search['lower_bound_ms']:.4f} ms"
    lines = [
        f"search: {search['measured']} (kernel, backend) pairs measured, {search['bounded']} priced by "
        f"lower bounds, {search['pruned']} pruned, {search['rounds']} solve-measure rounds; lower bound "
        f"{bound}, plan {_fmt_ms(search['plan_ms'])}: {certified} (decided by {decided_by})"
    ]
    for p in search.get("partitions", []):
        where = "whole graph" if p["partition"] < 0 else f"partition {p['partition']}"
        pruned = "; ".join(f"{why} ({n})" for why, n in p["pruned"].items()) or "none"
        lines.append(f"  {where}: {p['measured']} measured, {p['bounded']} bounded, pruned: {pruned}")
    return lines


def pruned_lines(listed: dict | None, graph) -> list[str]:
    """Each reason a (candidate, backend) pair was pruned, then one line per candidate: where, its
    primitives (their kinds where the plan has its graph)."""
    if listed is None:
        return ["pruned candidates: not recorded in this plan (an older korch's, or not optimize's)"]
    lines = ["pruned candidates, by backend and why (partition, primitives):"]
    for why, parts in listed.items():
        lines.append(f"  {why}:")
        for part, ranges in sorted(parts.items(), key=lambda kv: int(kv[0])):
            where = "whole" if int(part) < 0 else f"p{part}"
            for nodes in ranges.split(";"):
                kinds = ""
                if graph is not None and nodes[0].isdigit():
                    kinds = f" ({names_text([graph.nodes[i].prim.value for i in node_indices(nodes)], 4)})"
                lines.append(f"    {where:5s} {nodes}{kinds}")
    return lines


def ceilings_text(c: dict) -> str:
    half = [(k.removeprefix("gflops_"), v) for k, v in c.items() if k.startswith("gflops_")]
    matmuls = [("float32", c["gflops"]), *half]
    return f"{c['bandwidth_gbs']:.1f} GB/s copy, " + ", ".join(
        f"{v:.1f} GFLOP/s {DTYPES[d]} matmul" for d, v in matmuls
    )


def _header(r: dict) -> list[str]:
    solver = r["solver"]
    lines = [
        f"plan {r['plan']}: {len(r['kernels'])} kernels over {r['primitives']} primitives, "
        f"predicted {_fmt_ms(r['predicted_ms'])} on {r['device']} ({r['device_name'] or 'unknown device'})",
        f"solver: {solver.get('status', '?')}, gap {solver.get('gap', 0):g}, "
        f"{solver.get('seconds', 0):.2f}s; greedy fusion baseline {greedy_text(r)}",
    ]
    if r["measured"]:
        lines.append(f"measured in place: {measured_text(r)}")
    c = r["candidates"]
    if c:
        lines.append(
            f"candidates: {c.get('candidates')} ({c.get('unique_candidates')} unique, "
            f"{c.get('seeds', 0)} seeds) in {c.get('partitions')} partitions"
        )
    lines += [f"rewrite: {line}" for line in r["rewrites"]]
    pruned = ", ".join(f"{k} {v}" for k, v in r["pruned"].items()) or "none"
    lines.append(f"pruned: {pruned}")
    lines.append(f"profiling: {profiling_text(r['profiling'])}")
    if r["search"]:
        lines += search_lines(r["search"], r["decided_by"])
    if r["ceilings"]:
        lines.append(f"ceilings: {ceilings_text(r['ceilings'])}")
    return lines


def text(r: dict, graph=None) -> str:
    """The report as text; its list of pruned candidates last, where it holds one (their kinds of
    primitive from `graph`, the plan's, where given)."""
    lines = _header(r)
    lines.append(
        f"{'#':>4s}  {'backend':12s} {'ms':>9s} {'share':>6s} {'prims':>5s}  {'rate':28s} primitives"
    )
    for k in r["kernels"]:
        share = f"{k['share']:.1%}" if k["share"] is not None else "-"
        lines.append(
            f"{k['index']:4d}  {k['backend']:12s} {k['ms']:9.4f} {share:>6s} {k['primitives']:5d}  "
            f"{rate_text(k):28s} {names_text(k['names'])}"
        )
        if k["origins"]:
            lines.append(f"{'':6s}from: {names_text(k['origins'], 6)}")
        for a in k["alternatives"]:
            lines.append(f"{'':6s}rejected: {alternative_text(a)}")
    if "pruned_candidates" in r:
        lines += pruned_lines(r["pruned_candidates"], graph)
    return "\n".join(lines)
