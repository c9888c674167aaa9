"""korch bench: peers run on the same inputs as the plan, agree with it, and are timed."""

import json

import numpy as np
import onnxruntime as ort
import pytest
import torch

from korch.cli import zoo
from korch.cli.bench import bench, zoo_module
from korch.cli.commands import main
from korch.errors import KorchError
from korch.pipeline import OptimizeOptions, optimize
from korch.plan.plan import Plan

FAST = dict(backends=("onnxruntime",), min_time=0.002, progress=False, max_size=3)


class Attention(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = torch.nn.LayerNorm(16)
        self.qkv = torch.nn.Linear(16, 48)

    def forward(self, x):
        q, k, v = self.qkv(self.norm(x)).chunk(3, dim=-1)
        return x + torch.softmax(q @ k.transpose(1, 2) / 4, dim=-1) @ v


def attention_onnx(tmp):
    """An Attention block (seeded) and its export, tmp/attn.onnx."""
    torch.manual_seed(0)
    module = Attention().eval()
    path = tmp / "attn.onnx"
    torch.onnx.export(
        module, (torch.randn(2, 8, 16),), str(path), dynamo=False, opset_version=17, input_names=["x"]
    )
    return module, path


@pytest.fixture(scope="module")
def module_and_plan(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("bench")
    module, path = attention_onnx(tmp)
    plan = optimize(path, options=OptimizeOptions(cache=tmp / "p.sqlite", **FAST))
    plan.save(tmp / "plan")
    return module, plan, tmp


@pytest.mark.e2e
def test_peers_agree_with_korch_and_are_timed(module_and_plan):
    module, plan, _ = module_and_plan
    report = bench(plan, ("onnxruntime", "eager", "torch-compile"), rounds=2, module=module)
    results = report["results"]
    assert set(results) == {"korch", "onnxruntime", "eager", "torch-compile"}
    for name, r in results.items():
        assert 0 < r["min_ms"] <= r["median_ms"] <= r["max_ms"], name
        per_round = r["round_medians_ms"]  # (a pooled median lies between its groups' medians)
        assert len(per_round) == 2 and min(per_round) - 1e-5 <= r["median_ms"] <= max(per_round) + 1e-5
        assert r["min_ms"] - 1e-5 <= min(per_round) and max(per_round) <= r["max_ms"] + 1e-5, name
    for peer in ("onnxruntime", "eager", "torch-compile"):
        assert results[peer]["max_rel_err"] <= 1e-4, peer
    best = min(results[p]["median_ms"] for p in ("onnxruntime", "eager", "torch-compile"))
    assert report["speedup_vs_best_peer"] == pytest.approx(best / results["korch"]["median_ms"])


def test_a_wrong_module_is_caught_by_the_agreement_check(module_and_plan):
    _, plan, _ = module_and_plan
    torch.manual_seed(1)
    other = Attention().eval()  # same shapes, other weights
    report = bench(plan, ("eager",), rounds=1, module=other)
    assert report["results"]["eager"]["max_rel_err"] > 1e-2


def test_torch_peers_without_a_module_are_skipped_with_a_note(module_and_plan, capsys):
    _, plan, tmp = module_and_plan
    with pytest.raises(KorchError, match="PyTorch module.*no other peer"):
        bench(plan, ("eager",), rounds=1)
    assert main(["bench", str(tmp / "plan"), "--vs", "eager", "--json"]) == 2
    assert "PyTorch module" in json.loads(capsys.readouterr().out)["error"]
    assert main(["bench", str(tmp / "plan"), "--vs", "eager,onnxruntime", "--rounds", "1", "--json"]) == 0
    captured = capsys.readouterr()
    report = json.loads(captured.out)
    assert set(report["results"]) == {"korch", "onnxruntime"}
    assert set(report["skipped_peers"]) == {"eager"}
    assert "note: eager skipped: torch peers need the PyTorch module" in captured.err


def test_zoo_models_carry_their_pytorch_source(zoo_dir):
    """The tag in a zoo file rebuilds the module it was exported from: the same numbers as the file."""
    import onnx

    model = onnx.load(zoo.build("candy", zoo_dir))
    module = zoo_module(Plan([], [], [], {}, model=model))
    assert module is not None
    x = zoo.example_inputs("candy")[0]
    with torch.no_grad():
        want = module(x).numpy()
    got = ort.InferenceSession(model.SerializeToString()).run(None, {"image": x.numpy()})[0]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    del model.metadata_props[:]
    assert zoo_module(Plan([], [], [], {}, model=model)) is None


def test_rounds_are_spread_apart(module_and_plan):
    """Rounds round_pause_s apart: the bench outlasts a neighbour's burst on a shared machine."""
    import time

    _, plan, _ = module_and_plan
    start = time.perf_counter()
    report = bench(plan, ("onnxruntime",), rounds=3, round_pause_s=0.3)
    assert time.perf_counter() - start >= 0.6
    assert report["rounds"] == 3 and report["results"]["korch"]["min_ms"] > 0


class ConvRelu(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3)

    def forward(self, x):
        return torch.relu(self.conv(x))


@pytest.mark.e2e
def test_the_freezing_peer_compiles_the_weights_in():
    """torch-compile-freezing is a compile of its own with the weights as constants: after the
    module's weights change, the plain compile follows them and the frozen one does not (a peer
    that reused Dynamo's cached plain compile would follow them too)."""
    from korch.cli.bench import torch_peer

    torch.manual_seed(0)
    module, x = ConvRelu().eval(), torch.randn(1, 3, 16, 16)
    plain, plain_launches = torch_peer("torch-compile", module, [x], "cpu")
    frozen, frozen_launches = torch_peer("torch-compile-freezing", module, [x], "cpu")
    before = module(x).detach()
    with torch.no_grad():
        module.conv.weight.add_(1.0)
    after = module(x).detach()
    torch.testing.assert_close(plain(), after)
    torch.testing.assert_close(frozen(), before)
    assert plain_launches >= 1 and frozen_launches >= 1


def test_korch_and_openvino_are_checked_against_onnxruntime(module_and_plan):
    _, plan, _ = module_and_plan
    report = bench(plan, ("openvino",), rounds=1)
    assert report["errors_against"] == "onnxruntime"
    for name in ("korch", "openvino"):
        assert report["results"][name]["max_rel_err"] <= 1e-4, name
    assert report["results"]["korch"]["launches"] >= 1
    # (the peer's launches: the model's ONNX operators, as korch counts its own kernels of these runtimes)
    assert report["results"]["openvino"]["launches"] == len(plan.model.graph.node)


def test_ablation_needs_a_model(module_and_plan, capsys):
    _, _, tmp = module_and_plan
    assert main(["bench", str(tmp / "plan"), "--ablation", "--json"]) == 2
    assert "--ablation: only for a model" in json.loads(capsys.readouterr().out)["error"]


@pytest.mark.e2e
def test_ablation_times_korchs_variants_beside_the_plan(tmp_path, capsys):
    """`korch bench MODEL --ablation`: every variant optimized (sharing the profile database),
    checked against ONNX Runtime and timed in the same run; the whole-graph variant is one kernel
    of the whole primitive graph, the greedy one the greedy baseline the main run priced."""
    from korch.cli.bench import ABLATION

    _, path = attention_onnx(tmp_path)
    cache = tmp_path / "p.sqlite"
    args = ["bench", str(path), "--ablation", "--vs", "onnxruntime", "--rounds", "1", "--json", "-q"]
    args += ["--cache", str(cache), "--time-budget", "20", "--backends", "onnxruntime,inductor"]
    assert main(args) == 0
    report = json.loads(capsys.readouterr().out)
    assert set(report["ablation"]) == set(ABLATION)
    assert report["errors_against"] == "onnxruntime"
    for name, r in {**report["results"], **report["ablation"]}.items():
        assert r["max_rel_err"] <= 1e-4, name
        assert 0 < r["min_ms"] <= r["median_ms"], name
    options = OptimizeOptions(
        cache=cache, progress=False, time_budget=0.0, backends=("onnxruntime", "inductor")
    )
    best = optimize(path, options=options)
    greedy = optimize(path, options=OptimizeOptions(**{**options.__dict__, "selection": "greedy"}))
    assert greedy.predicted_ms == pytest.approx(best.meta.greedy_ms)
    assert len(greedy.kernels) == best.meta.greedy_kernels
    whole = optimize(path, options=OptimizeOptions(**{**options.__dict__, "selection": "whole-graph"}))
    assert [k.spec.key.startswith("graph-") for k in whole.kernels] == [True]


def test_selection_must_be_known():
    with pytest.raises(KorchError, match="selection must be one of optimal, greedy, whole-graph"):
        OptimizeOptions(selection="best")


def test_bench_gives_each_systems_median_over_the_near_rounds(module_and_plan, monkeypatch):
    """The CPUs' round trips scripted (korch.measure.placement): near before and after round 0,
    moved during round 1, far around round 2; the near median is then round 0's alone."""
    from korch.measure import placement

    _, plan, _ = module_and_plan
    trips = iter([50.0, 55.0, 400.0, 410.0])  # (before round 0, then after each)
    monkeypatch.setattr(placement, "available", lambda: True)
    monkeypatch.setattr(placement, "round_trip_ns", lambda *a, **k: next(trips))
    report = bench(plan, ("onnxruntime",), rounds=3, round_pause_s=0.0)
    assert report["round_trips_ns"] == [50.0, 55.0, 400.0, 410.0]
    assert report["far_rounds"] == [False, None, True]
    for name, r in report["results"].items():
        assert r["near_median_ms"] == pytest.approx(r["round_medians_ms"][0], rel=1e-5, abs=1e-6), name


def test_the_prediction_is_reported_only_where_kernels_timed_alone_made_it(module_and_plan):
    """A plan that refining priced by its kernels' in-place timings has no prediction that timing
    it checks (PlanMeta.measured's "predicted_over_measured" empty): the bench leaves it out."""
    from korch.cli.commands import _bench_table

    _, _, tmp = module_and_plan
    for checked in (True, False):
        plan = Plan.load(tmp / "plan")
        plan.meta.measured = {**plan.meta.measured, "predicted_over_measured": 0.9 if checked else None}
        report = bench(plan, ("onnxruntime",), rounds=1, round_pause_s=0.0)
        assert report["predicted_ms"] == (pytest.approx(plan.predicted_ms) if checked else None)
        assert ("(predicted " in _bench_table(report)) == checked
