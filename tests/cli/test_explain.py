"""`korch explain`: the report, its text/JSON/HTML forms, rejected alternatives, and the drawing
rendered by headless Chromium (skipped where no chromium binary is installed)."""

import json
import re
import shutil
import struct
import subprocess
import time
from collections import Counter
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from helpers import onnx_model
from onnx import TensorProto, helper, numpy_helper

from korch.cli import commands as cli
from korch.cli import explain
from korch.cli.explain_html import page
from korch.cli.explain_svg import DrawNode, layout, plan_nodes
from korch.frontend import import_onnx
from korch.orchestrate.alternatives import rejected_alternatives
from korch.orchestrate.solver import Choice, Solution, greedy
from korch.pipeline import OptimizeOptions, optimize
from korch.plan.meta import PlanMeta
from korch.plan.plan import Plan, build_plan
from korch.profile.database import Profile
from korch.search.candidates import Candidate, CandidateOptions, enumerate_candidates

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
needs_chromium = pytest.mark.skipif(CHROMIUM is None, reason="no chromium binary (apt-get install chromium)")


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.fc = torch.nn.Linear(8, 8)

    def forward(self, x):
        t = torch.relu(self.conv(x)).flatten(2).transpose(1, 2)
        return torch.softmax(self.fc(t), -1) + t


@pytest.fixture(scope="module")
def plan_dir(tmp_path_factory):
    """A small real plan: several kernels (no whole-model seed), ONNX Runtime and vendor only."""
    tmp = tmp_path_factory.mktemp("explain")
    torch.manual_seed(0)
    with torch.no_grad():
        torch.onnx.export(Block().eval(), (torch.randn(1, 3, 6, 6),), str(tmp / "m.onnx"), dynamo=False,
                          opset_version=17, input_names=["x"], output_names=["y"])  # fmt: skip
    options = OptimizeOptions(
        backends=("onnxruntime", "vendor"), cache=tmp / "c.sqlite", max_size=4, seeds=False,
        min_time=0.002, progress=False,
    )  # fmt: skip
    optimize(tmp / "m.onnx", options=options).save(tmp / "plan")
    return tmp / "plan"


@pytest.mark.e2e
def test_report_matches_the_plan(plan_dir):
    plan = Plan.load(plan_dir)
    r = explain.report(plan, str(plan_dir))
    assert len(r["kernels"]) == len(plan.kernels) > 1
    assert sum(k["ms"] for k in r["kernels"]) == pytest.approx(
        plan.predicted_ms, rel=1e-4, abs=5e-7 * len(plan.kernels)
    )  # (each at 6 decimals)
    assert sum(k["share"] for k in r["kernels"]) == pytest.approx(1.0, abs=1e-3)
    covered = {n for k in r["kernels"] for n in k["nodes"]}
    assert covered == set(range(r["primitives"]))
    for k, pk in zip(r["kernels"], plan.kernels):
        assert k["backend"] == pk.backend and len(k["names"]) == len(pk.nodes) == k["primitives"]
        assert k["gbs"] > 0 and k["bytes"] > 0
        if any(name in ("conv", "matmul") for name in k["names"]):
            assert k["flops"] > 0 and k["gflops"] > 0
        for a in k["alternatives"]:
            assert a["ms"] > 0 and a["what"]
    ceilings = plan.meta.ceilings
    assert ceilings["bandwidth_gbs"] > 0 and ceilings["gflops"] > 0
    assert len(plan.meta.alternatives) == len(plan.kernels)
    assert r["pruned"] == plan.meta.candidates["pruned"] and r["solver"]["status"] == "optimal"
    measured = plan.meta.measured  # the plan timed in place, where optimize measured it
    if measured:
        assert [k["in_place_ms"] for k in r["kernels"]] == measured["kernels_ms"]
        assert f"measured in place: {measured['ms']:.4f} ms" in explain.text(r)


def test_cli_text_json_and_html(plan_dir, tmp_path, capsys):
    html = tmp_path / "report.html"
    assert cli.main(["explain", str(plan_dir), "--json", "--html", str(html), "--quiet"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["html"] == str(html)
    plan = Plan.load(plan_dir)
    assert [k["backend"] for k in doc["kernels"]] == [k.backend for k in plan.kernels]
    assert cli.main(["explain", str(plan_dir)]) == 0
    text = capsys.readouterr().out
    assert f"{len(plan.kernels)} kernels" in text and "solver: optimal" in text
    rows = [line for line in text.splitlines() if re.match(r"\s+\d+\s+(onnxruntime|vendor)\s", line)]
    assert len(rows) == len(plan.kernels)
    body = html.read_text()
    assert "http://" not in body.replace("http://www.w3.org/2000/svg", "")  # self-contained
    for i in range(len(plan.kernels)):
        assert f'<tr data-kernel="{i}">' in body and f'data-k="{i}' in body
    embedded = re.search(r'<script type="application/json" id="report">(.*?)</script>', body).group(1)
    assert json.loads(embedded)["kernels"] == doc["kernels"]
    assert cli.main(["explain", str(tmp_path / "missing")]) == 2


def test_old_plans_without_the_graph_draw_each_kernel(plan_dir):
    plan = Plan.load(plan_dir)
    plan.graph = None
    nodes = plan_nodes(plan)
    assert len(nodes) == sum(len(k.spec.graph.nodes) for k in plan.kernels)
    assert Counter(n.kernels[0] for n in nodes) == Counter(
        {i: len(k.nodes) for i, k in enumerate(plan.kernels)}
    )
    assert any(n.deps for n in nodes if n.kernels[0] > 0)  # kernels are wired to each other
    assert "no saved primitive graph" in page(plan, explain.report(plan))
    plan.meta.alternatives, plan.meta.ceilings = [], {}  # plans made by hand record neither
    r = explain.report(plan)
    assert all(k["alternatives"] == [] and k["bw_frac"] is None for k in r["kernels"])
    assert "ceilings" not in explain.text(r) and "<table" in page(plan, r)


def _fake_profiles(costs: dict[str, dict[str, float]]):
    profiles = {k: {b: Profile(k, b, "ok", ms) for b, ms in by.items()} for k, by in costs.items()}

    def cost(key):
        best = min(profiles[key].values(), key=lambda p: p.cost_ms)
        return best.cost_ms, best.backend

    return SimpleNamespace(profiles=profiles, cost=cost)


def test_alternatives_price_other_backends_splits_and_singles():
    def cand(nodes, key):
        return Candidate(nodes, (), (), key, 0)

    chosen = cand((0, 1, 2), "abc")
    cands = [
        chosen,
        cand((0,), "a"),
        cand((1,), "b"),
        cand((2,), "c"),
        cand((0, 1), "ab"),
        cand((0, 1, 2, 3), "big"),
    ]
    profiles = _fake_profiles(
        {"abc": {"onnxruntime": 1.0, "inductor": 1.5}, "a": {"x": 0.5}, "b": {"x": 0.5}, "c": {"x": 0.5},
         "ab": {"y": 0.6}, "big": {"z": 0.1}}
    )  # fmt: skip
    solution = Solution([Choice(chosen, "onnxruntime", 1.0)])
    (alts,) = rejected_alternatives(solution, cands, profiles, top=4)
    assert [a["ms"] for a in alts] == [1.1, 1.5, 1.5, 0.1]
    assert alts[0]["what"].startswith("split into 2 smaller kernels") and alts[0]["kernels"] == 2
    assert {alts[1]["backend"], alts[2]["backend"]} == {"inductor", None}  # another backend; unfused
    assert alts[3]["backend"] == "z" and alts[3]["primitives"] == 4  # a different set, listed last
    assert len(rejected_alternatives(solution, cands, profiles)[0]) == 3


def test_layout_layers_edges_downward_without_overlap():
    rng = np.random.default_rng(0)
    nodes = [DrawNode("in", "input")]
    for i in range(1, 700):
        deps = {i - 1} | ({int(rng.integers(max(0, i - 30), i))} if rng.random() < 0.3 else set())
        nodes.append(DrawNode("add", "t", (i // 5,), tuple(sorted(deps))))
    positions = layout(nodes)
    assert len(set(positions)) == len(nodes)
    for i, n in enumerate(nodes):
        assert all(positions[d][0] < positions[i][0] for d in n.deps)
    assert max(c for _, c in positions) < 20  # chains stay in a few columns, not one per node


# ------------------------------------------------------------------- headless chromium


def _render(html_path, tmp_path, name: str) -> tuple[bytes, str]:
    png = tmp_path / f"{name}.png"
    base = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars"]
    url = html_path.resolve().as_uri()
    subprocess.run(
        [*base, f"--screenshot={png}", "--window-size=1400,1000", url], capture_output=True, timeout=120
    )
    dom = subprocess.run([*base, "--dump-dom", url], capture_output=True, text=True, timeout=120).stdout
    assert png.exists(), "chromium wrote no screenshot"
    return png.read_bytes(), dom


def _png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", data[16:24])


def _check_rendered(html_path, tmp_path, nodes: int) -> None:
    blank = tmp_path / "blank.html"
    blank.write_text("<!DOCTYPE html><html><body></body></html>")
    empty, _ = _render(blank, tmp_path, "blank")
    data, dom = _render(html_path, tmp_path, "report")
    assert _png_size(data) == (1400, 1000)
    # a white page compresses to almost nothing; coloured boxes, text and curves do not
    assert len(data) > 8 * len(empty), (len(data), len(empty))
    assert f'data-explain="ready:{nodes}"' in dom, "the page script did not finish"


@needs_chromium
def test_html_renders_in_chromium(plan_dir, tmp_path):
    plan = Plan.load(plan_dir)
    html = tmp_path / "report.html"
    html.write_text(page(plan, explain.report(plan, str(plan_dir))))
    _check_rendered(html, tmp_path, len(plan_nodes(plan)))


def _stacked_blocks(blocks: int):
    """A real ONNX model: `blocks` x (LayerNorm, MatMul, Softmax, residual Add) on [16, 32]."""
    rng = np.random.default_rng(0)
    nodes, inits, x = [], [], "x"
    for b in range(blocks):
        w = numpy_helper.from_array(rng.standard_normal((32, 32)).astype("float32") * 0.1, f"w{b}")
        scale = numpy_helper.from_array(np.ones(32, "float32"), f"s{b}")
        inits += [w, scale]
        nodes += [
            helper.make_node("LayerNormalization", [x, f"s{b}"], [f"n{b}"], axis=-1),
            helper.make_node("MatMul", [f"n{b}", f"w{b}"], [f"m{b}"]),
            helper.make_node("Softmax", [f"m{b}"], [f"p{b}"], axis=-1),
            helper.make_node("Add", [x, f"p{b}"], [f"y{b}"]),
        ]
        x = f"y{b}"
    graph = helper.make_graph(
        nodes, "blocks", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [16, 32])],
        [helper.make_tensor_value_info(x, TensorProto.FLOAT, [16, 32])], inits,
    )  # fmt: skip
    return onnx_model(graph)


@needs_chromium
def test_700_node_graph_renders_quickly(tmp_path):
    """A real ~700-primitive graph, grouped by the greedy baseline (priced by a synthetic cost
    model: profiling it would take minutes), drawn and rendered within a time bound."""
    graph = import_onnx(_stacked_blocks(30)).graph
    assert 600 <= len(graph.nodes) <= 900, len(graph.nodes)
    found = enumerate_candidates(graph, CandidateOptions(max_size=3))
    chosen = greedy(
        graph, found.partitions, found.candidates, lambda key: (1 + int(key[:2], 16) % 7, "inductor")
    )
    plan = build_plan(graph, chosen, "cpu", PlanMeta(fission={"primitives": len(graph.nodes)}))
    start = time.perf_counter()
    html = tmp_path / "big.html"
    html.write_text(page(plan, explain.report(plan, "synthetic")))
    assert time.perf_counter() - start < 10
    assert html.stat().st_size < 2_000_000
    start = time.perf_counter()
    _check_rendered(html, tmp_path, len(plan_nodes(plan)))
    assert time.perf_counter() - start < 45


def test_the_search_is_shown_in_all_and_per_partition():
    """explain's search lines: the totals with the bound, the plan kept and its gap (or that it is
    certified optimal, or not certified), then each partition's counts and why pairs were pruned."""
    from korch.cli.explain import search_lines

    why = "vendor: not a single linear primitive"
    search = {
        "measured": 7, "bounded": 3, "pruned": 2, "rounds": 4, "lower_bound_ms": 1.75, "plan_ms": 2.0,
        "certified_gap": 0.125,
        "partitions": [
            {"partition": -1, "measured": 2, "bounded": 0, "pruned": {}},
            {"partition": 0, "measured": 5, "bounded": 3, "pruned": {why: 2}},
        ],
    }  # fmt: skip
    total, whole, part = search_lines(search, "solver")
    assert "7 (kernel, backend) pairs measured, 3 priced by lower bounds, 2 pruned, 4" in total
    assert "lower bound 1.7500 ms" in total and "certified gap 12.5%" in total and "solver" in total
    assert whole == "  whole graph: 2 measured, 0 bounded, pruned: none"
    assert part == f"  partition 0: 5 measured, 3 bounded, pruned: {why} (2)"
    assert "certified optimal" in search_lines({**search, "certified_gap": 0.0}, "whole-graph")[0]
    assert "not certified" in search_lines({**search, "certified_gap": None}, "whole-graph")[0]


def test_each_pruned_candidate_is_listed_with_its_backends_reason(plan_dir, capsys):
    """explain --pruned lists each candidate that a backend refused, under the backend's own
    reason (oracle: Backend.supports asked again of every candidate of the plan's graph), its
    primitives and their kinds; optimize --json and explain without --pruned leave it out."""
    from korch.backends import get_backends
    from korch.orchestrate.solve_measure import node_indices, node_ranges
    from korch.search.kernel import kernel_spec

    plan = Plan.load(plan_dir)
    backends = get_backends(["onnxruntime", "vendor"], "cpu")
    want = set()
    for c in enumerate_candidates(plan.graph, CandidateOptions(max_size=4)).candidates:
        for b in backends:
            why = b.supports(kernel_spec(plan.graph, c), "cpu")
            if why:
                want.add((f"{b.name}: {why}", str(c.partition), frozenset(c.nodes)))
    listed = explain.report(plan, pruned=True)["pruned_candidates"]
    got = {
        (why, part, frozenset(node_indices(nodes)))
        for why, parts in listed.items()
        for part, ranges in parts.items()
        for nodes in ranges.split(";")
    }
    assert want and got == want  # (nothing failed when measured in this model)
    assert "pruned_candidates" not in explain.report(plan)
    assert "pruned_candidates" not in explain.report(plan, pruned=True)["search"]

    assert cli.main(["explain", str(plan_dir), "--pruned"]) == 0
    out = capsys.readouterr().out
    why, part, nodes = min(want, key=lambda row: (row[0], row[1], sorted(row[2])))
    nodes = node_ranges(nodes)
    kinds = ", ".join(plan.graph.nodes[i].prim.value for i in node_indices(nodes))
    assert f"  {why}:\n" in out and f"    p{part}    {nodes} ({kinds}" in out


def test_node_ranges_round_trip():
    """node_ranges' text lists exactly the given primitives (oracle: the set), in runs."""
    from korch.orchestrate.solve_measure import node_indices, node_ranges

    rng = np.random.default_rng(0)
    for _ in range(200):
        nodes = set(rng.choice(40, size=rng.integers(1, 12), replace=False).tolist())
        text = node_ranges(nodes)
        assert node_indices(text) == sorted(nodes)
        assert text.count(",") + 1 == sum(1 for i in nodes if i - 1 not in nodes)  # one run per gap
    assert node_ranges((9, 3, 4, 5)) == "3-5,9"
