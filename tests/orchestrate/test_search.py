"""Solve, measure, re-solve (korch.orchestrate.solve_measure) against brute force, and the bounds
(korch.orchestrate.bounds)
against every kernel a real run measured."""

import json
import math
import sqlite3
import time

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper
from test_solver import _brute_force, _instance

from korch.cli import commands as cli
from korch.ir.work import Work, kernel_work
from korch.orchestrate.bounds import Observation, Rates, violations
from korch.orchestrate.solve_measure import (
    PROBE_PREFIX,
    SearchReport,
    certify,
    database_observations,
    measured_ms,
    search,
)
from korch.orchestrate.solver import Choice, Solution
from korch.profile.database import Profile
from korch.profile.profiler import ProfileResult
from korch.search.candidates import Candidate, CandidateSet


class SyntheticPrices:
    """Two backends per key with true costs; each pair is priced at a lower bound (the truth
    times a factor in [low, 1]) until measured, as korch.orchestrate.solve_measure.Prices prices
    pending pairs."""

    def __init__(self, truth: dict, seed: int, low: float = 0.2):
        rng = np.random.default_rng(seed)
        self.truth = truth  # (key, backend) -> ms
        self.bound = {pair: ms * rng.uniform(low, 1.0) for pair, ms in truth.items()}
        self.known: set = set()

    def __call__(self, key):
        priced = [
            (self.truth[(k, b)] if (k, b) in self.known else self.bound[(k, b)], b)
            for (k, b) in self.truth
            if k == key
        ]
        return min(priced)

    def measured(self, key, backend):
        return (key, backend) in self.known

    def measure(self, pairs):
        self.known.update(pairs)

    def refresh(self):
        pass


class GuidedPrices(SyntheticPrices):
    """With estimates (the truth, off by up to 30% either way) that order the measuring."""

    def estimates(self):
        rng = np.random.default_rng(len(self.known))
        guess = {pair: ms * rng.uniform(0.7, 1.3) for pair, ms in self.truth.items()}
        return lambda key: min(
            (self.truth[(k, b)] if (k, b) in self.known else guess[(k, b)], b)
            for (k, b) in self.truth
            if k == key
        )


def _searched(seed: int, guided: bool) -> tuple[float, float, int, int]:
    """(the search's last lower bound, the brute-force optimum, pairs measured, pairs) on one
    random instance with two backends per key."""
    graph, partitions, candidates, costs = _instance(seed)
    rng = np.random.default_rng(100 + seed)
    truth = {}
    for key in {c.key for c in candidates}:
        truth[(key, "a")] = costs(key)[0]
        truth[(key, "b")] = costs(key)[0] * float(rng.uniform(0.7, 1.5))
    prices = (GuidedPrices if guided else SyntheticPrices)(truth, seed)
    found = CandidateSet(graph, partitions, candidates)
    lower, rounds = search(graph, found, prices, prices.measure, deadline=None)
    assert rounds >= 1

    def true_cost(key):
        return min((ms, b) for (k, b), ms in truth.items() if k == key)

    return lower, _brute_force(graph, partitions, candidates, true_cost), len(prices.known), len(truth)


@pytest.mark.parametrize("guided", [False, True], ids=["bounds", "estimates"])
def test_the_search_reaches_the_true_optimum_measuring_less_than_everything(guided):
    measured = pairs = 0
    for seed in range(12):
        lower, optimum, known, total = _searched(seed, guided)
        assert lower == pytest.approx(optimum), seed  # all measured at the end: the bound is the optimum
        measured, pairs = measured + known, pairs + total
    assert measured < 0.8 * pairs, (measured, pairs)


def test_the_search_stops_at_its_deadline_with_a_lower_bound():
    graph, partitions, candidates, costs = _instance(3)
    truth = {(c.key, "a"): costs(c.key)[0] for c in candidates}
    prices = SyntheticPrices(truth, 3, low=0.05)
    found = CandidateSet(graph, partitions, candidates)
    lower, rounds = search(graph, found, prices, prices.measure, deadline=time.time() - 1)
    assert rounds == 0 and not prices.known
    assert lower <= _brute_force(graph, partitions, candidates, lambda k: (truth[(k, "a")], "a"))


def _mlp():
    """x @ w1 + b -> relu -> @ w2 -> softmax: linear and memory-bound kernels of several sizes."""
    rng = np.random.default_rng(0)
    weights = [
        numpy_helper.from_array(rng.standard_normal(shape).astype("float32"), name)
        for name, shape in (("w1", (64, 256)), ("b", (256,)), ("w2", (256, 32)))
    ]
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["h"]),
        helper.make_node("Add", ["h", "b"], ["hb"]),
        helper.make_node("Relu", ["hb"], ["r"]),
        helper.make_node("MatMul", ["r", "w2"], ["o"]),
        helper.make_node("Softmax", ["o"], ["y"], axis=-1),
    ]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [16, 64])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [16, 32])
    graph = helper.make_graph(nodes, "mlp", [x], [y], weights)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.fixture(scope="module")
def optimized(tmp_path_factory):
    """A small model optimized with every candidate measured (no budget): its database and JSON."""
    import onnx

    root = tmp_path_factory.mktemp("search")
    onnx.save(_mlp(), root / "m.onnx")
    argv = ["optimize", str(root / "m.onnx"), "-o", str(root / "plan"), "--json", "--quiet"]
    argv += ["--backends", "onnxruntime,vendor", "--cache", str(root / "db.sqlite"), "--max-size", "3"]
    return root, argv


@pytest.mark.e2e
def test_every_measured_kernel_respects_the_bound_the_others_give_it(optimized, capsys):
    root, argv = optimized
    assert cli.main(argv) == 0
    report = json.loads(capsys.readouterr().out)
    rows = database_observations(root / "db.sqlite")
    kernels = [(key, o) for key, o in rows if not key.startswith(PROBE_PREFIX)]
    observations = [o for _, o in kernels]
    floors = [o for key, o in rows if key.startswith(PROBE_PREFIX)]
    assert len(observations) >= 10 and len(floors) == 2  # onnxruntime's and vendor's least kernels
    # (a failure names each kernel faster than its bound: key, backend, bound / measured)
    broken = [(kernels[i][0], kernels[i][1].backend, r) for i, r in violations(observations, floors=floors)]
    assert broken == []
    # a kernel planted twice as fast as the bound of the rest is found, and named by its index
    rates = Rates(observations)
    work = observations[0].work
    fast = Observation(observations[0].backend, work, rates.bound_ms(work, observations[0].backend) / 4)
    assert [i for i, _ in violations([*observations, fast], floors=floors)] == [len(observations)]
    search = report["search"]
    contract = {"candidates", "measured", "bounded", "pruned", "rounds", "lower_bound_ms", "plan_ms"}
    assert contract | {"certified_gap", "profiling_seconds"} <= set(search)  # (../shared/CONTRACT.md)
    assert 0 < search["profiling_seconds"] <= report["seconds"]
    assert search["candidates"] == search["measured"] + search["bounded"] + search["pruned"]
    assert search["bounded"] == 0  # no budget: all measured, the bound is the optimum over them
    # the gap is the kept plan's (the runoff may keep another), at its kernels' isolated timings
    conn = sqlite3.connect(root / "db.sqlite")
    alone = {(k, b): ms for k, b, ms in conn.execute("SELECT key, backend, median_ms FROM profiles")}
    conn.close()
    kept = json.loads((root / "plan" / "plan.json").read_text())["kernels"]
    plan_ms = sum(alone[k["key"], k["backend"]] for k in kept)
    assert search["plan_ms"] == pytest.approx(plan_ms, rel=1e-5, abs=1e-6)  # (6 decimals)
    assert search["lower_bound_ms"] <= plan_ms + 1e-6
    gap = (search["plan_ms"] - search["lower_bound_ms"]) / search["plan_ms"]
    assert search["certified_gap"] == pytest.approx(max(gap, 0.0), abs=1e-5 + 1e-6 / search["plan_ms"])
    assert report["decided_by"] in ("source-model", "whole-graph", "solver")


@pytest.mark.e2e
def test_a_warm_run_with_no_budget_left_certifies_from_the_database(optimized, capsys):
    """At --time-budget 0 with every price in the database nothing is measured, and the lower
    bound is the optimum over all the candidates, as the run that measured them found it."""
    root, argv = optimized
    assert cli.main(argv) == 0
    cold = json.loads(capsys.readouterr().out)["search"]
    assert cli.main([*argv, "--time-budget", "0"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["profiled"] == 0 and report["search"]["rounds"] == 0
    warm = report["search"]
    assert warm["bounded"] == 0 and warm["lower_bound_ms"] == pytest.approx(cold["lower_bound_ms"])
    assert warm["certified_gap"] is not None


def test_bounds_grow_with_work_and_never_undercut_the_launch_floor():
    seen = [Observation("x", Work(0, 1000), 0.01), Observation("x", Work(2_000_000, 10**6), 1.0)]
    rates = Rates(seen)
    small, big = rates.bound_ms(Work(0, 10), "x"), rates.bound_ms(Work(0, 10**7), "x")
    assert small == pytest.approx(0.005)  # half the least call seen
    assert big > small and math.isfinite(big)
    assert rates.bound_ms(Work(0, 10), "other") < small  # no call seen for it: no floor


def test_a_copy_of_a_kernels_size_bounds_it_as_a_measured_kernel_would():
    """A small concat (a copy) ran 1.08x faster than the bound the larger, slower kernels gave it:
    the device's copies of a few sizes count among the kernels that set the byte rate."""
    from korch.config import SAFETY

    slow = [Observation("x", Work(0, 10**6), 0.1)]  # 10 GB/s at 1 MB
    copies = {"bandwidth_gbs": 5.0, "bandwidth_gbs@100000": 50.0}
    small, large = Work(0, 100_000), Work(0, 10**6)  # (in a backend with no launch floor seen)
    without, with_copies = Rates(slow), Rates(slow, copies)
    assert without.bound_ms(small, "y") == pytest.approx(100_000 / (SAFETY * 10e6))
    assert with_copies.bound_ms(small, "y") == pytest.approx(100_000 / (SAFETY * 50e6))
    # a kernel over SIZE_WINDOW times the copy's size: bounded by the kernels of its own size
    assert with_copies.bound_ms(large, "y") == pytest.approx(without.bound_ms(large, "y"))
    assert violations([*slow, Observation("y", small, 100_000 / 30e6)]) != []
    assert violations([*slow, Observation("y", small, 100_000 / 30e6)], copies) == []


def _matmul_work(n: int, tanh: bool = False) -> Work:
    from korch.ir.graph import GraphBuilder
    from korch.ir.prims import Prim, TensorType

    b = GraphBuilder()
    x, w = b.input("x", TensorType((n, n), "float32")), b.input("w", TensorType((n, n), "float32"))
    (y,) = b.emit(Prim.MATMUL, (x, w))
    if tanh:
        (y,) = b.emit(Prim.TANH, (y,))
    return kernel_work(b.build([y], ["out0"]))


def test_a_linear_primitive_is_bounded_by_its_class_once_every_backend_ran_it_alone():
    """A 64x64 matmul's class ran at 1/100 of the device's fastest rate: a kernel holding two of
    them is bounded by twice its class's time over CLASS_MARGIN, and one holding one of them by
    its class's time over CLASS_MARGIN_ONE, not by the fastest rate, but only once each backend
    that can run the class has run it alone (the oracle: the FLOP counts and the rates written
    out)."""
    from korch.config import CLASS_MARGIN, CLASS_MARGIN_ONE
    from korch.orchestrate.bounds import capable_backends

    small, big, fused = _matmul_work(64), _matmul_work(1024), _matmul_work(64, tanh=True)
    assert small.alone and not fused.alone and small.linear == fused.linear
    two = Work(2 * small.flops, small.bytes, small.linear * 2)
    fastest = big.flops / 1.0  # FLOPs per ms
    ceilings = {"gflops": fastest / 1e6, "bandwidth_gbs": 100.0}
    small_ms = small.flops / (fastest / 100)
    seen = [Observation("a", big, 1.0), Observation("a", small, small_ms)]
    capable = capable_backends([(small, "a"), (fused, "b"), (small, "b")])
    plain = Rates(seen, ceilings).bound_ms(two, "c")  # the fastest rate, no class's
    tight = 2 * small_ms / CLASS_MARGIN
    assert tight > 10 * plain
    # backend b can run the class alone and has not: the class's rate is not used
    assert Rates(seen, ceilings, capable).bound_ms(two, "c") == pytest.approx(plain)
    # where b cannot run it alone (as inductor-frozen a matmul reading no weight), it is not waited for
    only_held = capable_backends([(small, "a"), (fused, "b")])
    assert only_held == {small.linear[0][0]: {"a"}}
    assert Rates(seen, ceilings, only_held).bound_ms(two, "c") == pytest.approx(tight)
    # b ran it only with a tanh: still not alone
    with_fused = [*seen, Observation("b", fused, small_ms)]
    assert Rates(with_fused, ceilings, capable).bound_ms(two, "c") == pytest.approx(plain)
    # b ran it alone, slower than a: the fastest of the class counts, over the margin
    both = [*with_fused, Observation("b", small, 3 * small_ms)]
    assert Rates(both, ceilings, capable).bound_ms(two, "c") == pytest.approx(tight)
    # a class's rate is its kernels' fastest call: a slow stretch of the machine inflates medians
    # (a Segformer-B0 matmul alone: median 1.75x its fastest call, and a kernel holding it then
    # ran 2.02x faster than that median)
    noisy = [seen[0], Observation("a", small, 2 * small_ms, small_ms), Observation("b", small, 3 * small_ms)]
    assert Rates(noisy, ceilings, capable).bound_ms(two, "c") == pytest.approx(tight)
    # without knowing which backends can run it, no class rate
    assert Rates(both, ceilings).bound_ms(two, "c") == pytest.approx(plain)
    # leave-one-out: the measured kernels hold against it; one that beats its class by more than
    # the margin is a violation
    floors = [Observation(b, Work(0, 8), 1e-4) for b in "ab"]  # (each backend's least call)
    assert violations(both, ceilings, floors) == []
    assert [i for i, _ in violations([*both, Observation("a", two, tight / 1.1)], ceilings, floors)] == [4]
    # a kernel holding that one matmul (with a tanh) takes the tighter margin: a matmul + tanh
    # faster than that is a violation, though within CLASS_MARGIN of its class
    assert CLASS_MARGIN_ONE < CLASS_MARGIN
    one = small_ms / CLASS_MARGIN_ONE
    assert Rates(both, ceilings, capable).bound_ms(fused, "c") == pytest.approx(one)
    fast_fused = Observation("a", fused, one / 1.1)
    assert fast_fused.ms > small_ms / CLASS_MARGIN
    assert [i for i, _ in violations([*both, fast_fused], ceilings, floors)] == [4]


def test_views_move_no_bytes():
    """A broadcast returned as torch's expand ran 6.4 MB in 7.5 us on this CPU (860 GB/s): views
    neither read nor write, so a kernel of views alone is bounded by its launch floor only."""
    from korch.ir.graph import GraphBuilder
    from korch.ir.prims import Prim, TensorType

    b = GraphBuilder()
    x, y = b.input("x", TensorType((32, 1), "float32")), b.input("y", TensorType((32, 64), "float32"))
    (wide,) = b.emit(Prim.BROADCAST, (x,), shape=(32, 64))
    (total,) = b.emit(Prim.ADD, (wide, y))
    assert kernel_work(b.build([wide], ["out0"])).bytes == 0
    # x reaches the add only through the view: counted are y read and the sum written
    assert kernel_work(b.build([total], ["out0"])).bytes == 2 * 32 * 64 * 4


def test_estimates_price_a_backend_with_nothing_measured_as_far_from_its_bounds_as_the_furthest():
    """A backend new to the database (none of its kernels measured) must not look cheapest to
    the measuring order merely because its bounds are not yet scaled like the others': it takes
    the largest of the measured backends' ratios of measured to bound."""
    import statistics
    from types import SimpleNamespace

    from korch.ir.graph import GraphBuilder
    from korch.ir.prims import Prim, TensorType
    from korch.orchestrate.solve_measure import Prices
    from korch.profile.database import Profile
    from korch.profile.profiler import ProfileResult

    def spec(n: int):
        b = GraphBuilder()
        x, w = b.input("x", TensorType((n, n), "float32")), b.input("w", TensorType((n, n), "float32"))
        (y,) = b.emit(Prim.MATMUL, (x, w))
        return SimpleNamespace(graph=b.build([y], ["out0"]))

    specs = {f"k{n}": spec(n) for n in (64, 128, 256)}
    result = ProfileResult()
    measured = {("k64", "near"): 0.5, ("k128", "near"): 0.9, ("k64", "far"): 5.0, ("k128", "far"): 9.0}
    for (key, backend), ms in measured.items():
        result.profiles.setdefault(key, {})[backend] = Profile(key, backend, "ok", median_ms=ms)
    profiler = SimpleNamespace(
        specs=specs, result=result, backend_names=["near", "far", "new"], pending={("k256", "new"): None}
    )
    prices = Prices(profiler, ceilings=None)
    work = {key: kernel_work(s.graph) for key, s in specs.items()}

    def scale(backend: str) -> float:
        ratios = [ms / prices.rates.bound_ms(work[k], b) for (k, b), ms in measured.items() if b == backend]
        return statistics.median(ratios)

    assert 1.2 < scale("near") < scale("far") / 1.5  # (the median of the two would be neither)
    bound = prices.rates.bound_ms(work["k256"], "new")
    assert prices("k256") == (bound, "new")  # certifying: the bare bound
    estimate, backend = prices.estimates()("k256")
    assert backend == "new" and estimate == pytest.approx(bound * scale("far"))


def test_the_search_measures_a_class_alone_before_the_kernels_that_hold_it():
    """A matmul + tanh that backend b has not measured is bounded by the fastest rate until b has
    run the matmul alone; the round measures that single (the probe) first, and the pair's bound
    then rises to the class's fastest time over the margin (the oracle: the rates written out)."""
    from types import SimpleNamespace

    from korch.config import CLASS_MARGIN_ONE
    from korch.ir.graph import GraphBuilder
    from korch.ir.prims import Prim, TensorType
    from korch.orchestrate.solve_measure import Prices
    from korch.profile.database import Profile
    from korch.profile.profiler import ProfileResult

    def spec(n: int, tanh: bool = False):
        b = GraphBuilder()
        x, w = b.input("x", TensorType((n, n), "float32")), b.input("w", TensorType((n, n), "float32"))
        (y,) = b.emit(Prim.MATMUL, (x, w))
        if tanh:
            (y,) = b.emit(Prim.TANH, (y,))
        return SimpleNamespace(graph=b.build([y], ["out0"]))

    specs = {"big": spec(1024), "mm": spec(64), "mm+tanh": spec(64, tanh=True)}
    work = {key: kernel_work(s.graph) for key, s in specs.items()}
    big_ms = 1.0
    mm_ms = work["mm"].flops / (work["big"].flops / big_ms) * 100  # 1/100 of the fastest rate
    result = ProfileResult()
    for key, backend, ms in (("big", "a", big_ms), ("mm", "a", mm_ms)):
        result.profiles.setdefault(key, {})[backend] = Profile(key, backend, "ok", median_ms=ms)
    pending = {("mm", "b"): None, ("mm+tanh", "b"): None, ("big", "b"): None}
    profiler = SimpleNamespace(specs=specs, result=result, backend_names=["a", "b"], pending=pending)
    ceilings = {"gflops": work["big"].flops / big_ms / 1e6, "bandwidth_gbs": 100.0}
    floors = [Observation(b, Work(0, 8), 1e-4) for b in "ab"]  # (each backend's least call)
    prices = Prices(profiler, ceilings, floors)
    assert prices.probes([("mm+tanh", "b")]) == [("mm", "b")]
    assert prices.probes([("big", "b")]) == []  # (the pair is its class's probe itself)
    loose = prices.rates.bound_ms(work["mm+tanh"], "b")
    # b runs the matmul alone, twice as slow as a: the class is complete
    del pending[("mm", "b")]
    result.profiles["mm"]["b"] = Profile("mm", "b", "ok", median_ms=2 * mm_ms)
    prices.refresh()
    assert prices.probes([("mm+tanh", "b")]) == []
    assert prices.rates.bound_ms(work["mm+tanh"], "b") == pytest.approx(mm_ms / CLASS_MARGIN_ONE)
    assert mm_ms / CLASS_MARGIN_ONE > 10 * loose

    # in the search loop: the first round measures the probe alone, not the kernel holding it
    class Probed(SyntheticPrices):
        def probes(self, pairs):
            return [
                p for p in [("probe", "a")] if p not in self.known and any(k != "probe" for k, _ in pairs)
            ]

    graph, partitions, candidates, costs = _instance(1)
    truth = {(c.key, "a"): costs(c.key)[0] for c in candidates}
    truth[("probe", "a")] = 1.0
    prices = Probed(truth, 1)
    rounds = []
    search(
        graph,
        CandidateSet(graph, partitions, candidates),
        prices,
        lambda p: (rounds.append(p), prices.measure(p)),
        None,
    )
    assert rounds[0] == [("probe", "a")] and len(rounds) > 1


def test_a_round_measures_the_bounds_solution_beside_the_estimates_one():
    """The estimates order the measuring, but the lower bound rises only when the kernels of the
    bounds' own solution are measured: a round measures both solutions' unmeasured kernels (the
    oracle: each solved on its own, before the round)."""
    from korch.orchestrate.solve_measure import _solve, _unmeasured

    for seed in range(12):
        graph, partitions, candidates, costs = _instance(seed)
        truth = {(c.key, b): costs(c.key)[0] * (1.0 if b == "a" else 1.3) for c in candidates for b in "ab"}
        prices = GuidedPrices(truth, seed, low=0.05)
        found = CandidateSet(graph, partitions, candidates)
        bound = set(_unmeasured(_solve(graph, found, prices, 60.0), prices))
        guided = set(_unmeasured(_solve(graph, found, prices.estimates(), 60.0), prices))
        if bound - guided:
            break
    else:
        pytest.fail("no instance where the two solutions differ")
    rounds = []
    search(graph, found, prices, lambda p: (rounds.append(p), prices.measure(p)), None)
    assert set(rounds[0]) == bound | guided


def test_a_round_measures_the_heaviest_kernels_first_each_with_its_rivals():
    """A kernel's bounds in two backends are nearly equal, so a round that measured only the
    chosen backend would leave the other for the next round: each pair comes with the same key's
    pending pair in the other backend, the keys the solution prices highest first (the oracle: the
    bound's solution solved on its own, its costs summed per key)."""
    from korch.orchestrate.solve_measure import _solve

    class WithRivals(SyntheticPrices):
        def rivals(self, key, backend):
            return [(k, b) for (k, b) in self.truth if k == key and b != backend and (k, b) not in self.known]

    graph, partitions, candidates, costs = _instance(5)
    truth = {(c.key, b): costs(c.key)[0] * (1.0 if b == "a" else 1.2) for c in candidates for b in "ab"}
    prices = WithRivals(truth, 5)
    found = CandidateSet(graph, partitions, candidates)
    solution = _solve(graph, found, prices, 60.0)
    weight = {}
    for choice in solution.chosen:
        weight[choice.candidate.key] = weight.get(choice.candidate.key, 0.0) + choice.cost_ms
    assert len(set(weight.values())) > 2  # (an order to check)
    rounds = []
    lower, _ = search(graph, found, prices, lambda p: (rounds.append(p), prices.measure(p)), None)
    first = rounds[0]
    assert {k for k, _ in first} == set(weight) and len(first) == 2 * len(weight)  # both backends of each
    keys = list(dict.fromkeys(k for k, _ in first))
    assert [weight[k] for k in keys] == sorted(weight.values(), reverse=True)
    assert all(first[2 * i][0] == first[2 * i + 1][0] for i in range(len(keys)))  # each beside its rival
    optimum = _brute_force(graph, partitions, candidates, lambda k: min((truth[(k, b)], b) for b in "ab"))
    assert lower == pytest.approx(optimum)


def test_a_round_measures_at_most_round_most_pairs_and_the_search_still_reaches_the_optimum(monkeypatch):
    """Rounds capped at a few pairs re-solve more often; the last solution is still all measured,
    so its objective is the true optimum (brute force)."""
    from korch.orchestrate import solve_measure

    monkeypatch.setattr(solve_measure, "ROUND_MOST", 3)
    graph, partitions, candidates, costs = _instance(7)
    truth = {(c.key, b): costs(c.key)[0] * (1.0 if b == "a" else 1.1) for c in candidates for b in "ab"}
    prices = SyntheticPrices(truth, 7, low=0.05)
    found = CandidateSet(graph, partitions, candidates)
    rounds = []
    lower, _ = search(graph, found, prices, lambda p: (rounds.append(p), prices.measure(p)), None)
    assert max(len(r) for r in rounds) == 3 and len(rounds) > 1
    optimum = _brute_force(graph, partitions, candidates, lambda k: min((truth[(k, b)], b) for b in "ab"))
    assert lower == pytest.approx(optimum)


def test_the_gap_is_the_kept_plans_priced_by_its_kernels_measured_alone():
    """The plan kept may not be the optimum over measured costs (in-place timings and the runoff
    chose it), and its choices may carry in-place costs: the gap is certified for that plan, at
    what its kernels cost as each was measured alone; none where one of them was not measured."""
    a, b = (Candidate((i,), ("x",), (f"y{i}",), f"k{i}", 0) for i in range(2))
    profiles = ProfileResult(
        {
            "k0": {"inductor": Profile("k0", "inductor", "ok", median_ms=3.0)},
            "k1": {"inductor": Profile("k1", "inductor", "ok", median_ms=2.0)},
        }
    )
    kept = Solution([Choice(a, "inductor", 1.0), Choice(b, "inductor", 1.5)], objective_ms=2.5)
    report = SearchReport(lower_bound_ms=4.0)
    certify(report, measured_ms(kept, profiles))
    assert report.plan_ms == 5.0 and report.certified_gap == pytest.approx(0.2)
    unmeasured = Solution([Choice(a, "inductor", 1.0), Choice(b, "vendor", 1.0)])
    report = SearchReport(lower_bound_ms=4.0)
    certify(report, measured_ms(unmeasured, profiles))
    assert report.plan_ms is None and report.certified_gap is None
