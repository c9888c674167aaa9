"""Markdown tables, target checks and the bar chart from the results zoo_bench.py collected.

python benchmarks/zoo_report.py OUT/results.json [MORE/results.json ...] [--markdown FILE] [--chart PNG]

Several results files (the GPU run's two calls, say) are reported as one: their models merged,
the machine of the first.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

from zoo_bench import MEMORY_BOUND, PAPER_MODELS

PEER_ORDER = (
    "onnxruntime",
    "torch-compile",
    "torch-compile-max-autotune",
    "torch-compile-cudagraphs",
    "eager",
)


SOURCE_MODEL_NOTE = (
    "\n\\* the plan is the source model run whole by ONNX Runtime (nothing korch profiled within "
    "the budget beat it): korch and the onnxruntime peer run the same graph, so their ratio "
    "is no speed-up of korch."
)


def geomean(values: list[float]) -> float | None:
    return math.exp(sum(map(math.log, values)) / len(values)) if values else None


def speedup(r: dict, stat: str, peers: str = "") -> float | None:
    """The fastest peer's `stat` over korch's, among the peers whose names start with `peers`
    (every peer by default; None if none was timed). By minima ("min_ms") it shows what each
    system can do: noise on a shared machine only ever adds time, where medians also show how the
    machine behaved."""
    res = r["bench"]["results"]
    times = [res[p][stat] for p in res if p != "korch" and p.startswith(peers)]
    return min(times) / res["korch"][stat] if times else None


def _peers(runs: list[dict]) -> list[str]:
    seen = {p for r in runs for p in r["bench"]["results"] if p != "korch"}
    return [p for p in PEER_ORDER if p in seen]


def _optimize_times(r: dict) -> str:
    if r["optimize_warm_s"] is None:
        return f"{r['optimize_cold_s']:.0f} / -"
    return f"{r['optimize_cold_s']:.0f} / {r['optimize_warm_s']:.1f} ({r['warm_cache_hit_rate']:.0%} hits)"


def table(runs: list[dict]) -> list[str]:
    peers = _peers(runs)
    head = ["model", "prims", "kernels (greedy)", "korch ms", "predicted ms", *[f"{p} ms" for p in peers]]
    head += ["vs best peer", "(minima)", "floor ms", "optimize cold / re-run s", "verify err"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in runs:
        res = r["bench"]["results"]
        korch = res["korch"]["median_ms"]
        cells = [
            r["model"],
            str(r["primitives"]),
            f"{r['kernels']} ({r['greedy_kernels'] if r['greedy_kernels'] is not None else '-'})",
            f"{korch:.3f}" + (" *" if r.get("source_model_only") else ""),
            # (the ratio only for a prediction from isolated timings; files before it say nothing)
            f"{r['predicted_ms']:.3f}"
            + (
                f" ({r['predicted_ms'] / korch:.2f}x)" if r.get("prediction_checked", True) else " (in place)"
            ),
            *[f"{res[p]['median_ms']:.3f}" if p in res else "-" for p in peers],
            f"{r['bench']['speedup_vs_best_peer']:.2f}x",
            f"{by_min:.2f}x" if (by_min := speedup(r, "min_ms")) else "-",
            f"{r['roofline']['floor_ms']:.3f}",
            _optimize_times(r),
            f"{r['max_rel_err']:.1e}",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def targets(runs: list[dict], device: str) -> list[str]:
    speed = {r["model"]: r["bench"]["speedup_vs_best_peer"] for r in runs}
    lines = []
    if device == "cpu":
        slower = ", ".join(f"{m} ({s:.2f}x)" for m, s in speed.items() if s < 1.0)
        lines.append(
            f"- korch at least as fast as the best peer on every model: "
            f"{'missed on ' + slower if slower else 'met'}"
        )
        mem = [speed[m] for m in MEMORY_BOUND if m in speed]
        g = geomean(mem)
        if g is not None:
            by_min = geomean([m for r in runs if r["model"] in MEMORY_BOUND if (m := speedup(r, "min_ms"))])
            lines.append(
                f"- geomean speedup on the memory-bound models ({len(mem)} measured): {g:.2f}x "
                f"(target 1.2x: {'met' if g >= 1.2 else 'missed'}; by minima {by_min or 0:.2f}x)"
            )
    else:
        # torch.compile's fastest mode per model: the default alone would flatter korch on a GPU,
        # where CUDA graphs take most of a small model's launch cost away
        paper = [r for r in runs if r["model"] in PAPER_MODELS and speedup(r, "median_ms", "torch-compile")]
        g = geomean([speedup(r, "median_ms", "torch-compile") for r in paper])
        if g is not None:
            by_min = geomean([speedup(r, "min_ms", "torch-compile") for r in paper])
            lines.append(
                f"- geomean speedup over torch.compile (its fastest mode per model) on the paper's "
                f"models ({len(paper)} measured): {g:.2f}x (target 1.3x: {'met' if g >= 1.3 else 'missed'}; "
                f"by minima {by_min:.2f}x)"
            )
    return lines


def breakdown(runs: list[dict]) -> list[str]:
    lines = []
    for r in runs:
        if r["bench"]["speedup_vs_best_peer"] >= 1.0:
            continue
        speedup = r["bench"]["speedup_vs_best_peer"]
        lines.append(f"\n**{r['model']}** (korch {speedup:.2f}x of the best peer):\n")
        lines.append("| backend | predicted ms | share | primitives | ops |")
        lines.append("|---|---|---|---|---|")
        for k in r["top_kernels"]:
            lines.append(
                f"| {k['backend']} | {k['ms']:.3f} | {k['share']:.0%} | {k['primitives']} | "
                f"{', '.join(k['ops'])} |"
            )
    return lines


def render_markdown(doc: dict) -> str:
    m = doc["machine"]
    out = [
        f"Machine: {m['cpu']}, {m['cores']} threads, GPU {m['gpu'] or 'none'}; Python {m['python']}, "
        f"korch {m['korch']}, torch {m['torch']}, onnxruntime {m['onnxruntime']}; run {m['date']}.",
    ]
    for device in sorted({r["device"] for r in doc["runs"].values()}):
        runs = [r for r in doc["runs"].values() if r["device"] == device]
        ceil = runs[0].get("ceilings", {})
        out += [
            f"\n### {device.upper()}\n",
            f"Measured ceilings: copy {ceil.get('bandwidth_gbs')} GB/s, fp32 matmul {ceil.get('gflops')} "
            f"GFLOP/s. Profiling budget {runs[0]['time_budget']} s per model, korch's backends "
            f"{', '.join(runs[0].get('backends') or ['the default'])}. Medians of interleaved "
            "blocks; 'predicted' is the solver's sum of kernel latencies (ratio to measured).\n",
            *table(runs),
            *([SOURCE_MODEL_NOTE] if any(r.get("source_model_only") for r in runs) else []),
            "\nTargets:\n",
            *targets(runs, device),
            *breakdown(runs),
        ]
    out += unfinished(doc.get("unfinished", {}).values())
    return "\n".join(out) + "\n"


def unfinished(entries) -> list[str]:
    """Models optimized and verified whose peers were not timed (the run's time limit)."""
    lines = [
        f"- {r['model']} ({r['device']}): optimized in {r['optimize_cold_s']} s, {r['kernels']} kernels, "
        f"in place {r['in_place_ms'] or float('nan'):.3f} ms (predicted {r['predicted_ms']:.3f}), "
        f"verify err {r['max_rel_err']:.1e}; the peers were not timed"
        for r in entries
    ]
    if not lines:
        return []
    return ["\nUnfinished (stopped by the time limit while the peers compiled or ran):\n", *lines]


def render_chart(doc: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = list(doc["runs"].values())
    systems = ["korch", *_peers(runs)]
    fig, ax = plt.subplots(figsize=(max(6, 1.4 * len(runs)), 3.6))
    width = 0.8 / len(systems)
    for i, name in enumerate(systems):
        rel = [
            r["bench"]["results"][name]["median_ms"] / r["bench"]["results"]["korch"]["median_ms"]
            if name in r["bench"]["results"]
            else 0.0
            for r in runs
        ]
        ax.bar([j + i * width for j in range(len(runs))], rel, width, label=name)
    ax.set_xticks([j + width * (len(systems) - 1) / 2 for j in range(len(runs))])
    ax.set_xticklabels([f"{r['model']}\n({r['device']})" for r in runs], fontsize=8)
    ax.set_ylabel("execution time relative to korch")
    ax.axhline(1.0, color="black", linewidth=0.6)
    ax.legend(fontsize=8, ncol=len(systems))
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def merged(paths) -> dict:
    """One results document from several: later files' entries replace earlier ones' per model."""
    docs = [json.loads(Path(p).read_text()) for p in paths]
    doc = {"machine": docs[0]["machine"], "runs": {}, "unfinished": {}}
    for d in docs:
        for part in ("runs", "unfinished"):
            for key, entry in d.get(part, {}).items():
                doc["runs"].pop(key, None)
                doc["unfinished"].pop(key, None)
                doc[part][key] = entry
    return doc


def render(results, markdown: str | None, chart: str | None) -> None:
    """`results`: a results.json path, or a list of them."""
    doc = merged(results if isinstance(results, list) else [results])
    if markdown:
        Path(markdown).write_text(render_markdown(doc))
    if chart:
        render_chart(doc, chart)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", nargs="+")
    parser.add_argument("--markdown")
    parser.add_argument("--chart")
    args = parser.parse_args()
    render(args.results, args.markdown, args.chart)
