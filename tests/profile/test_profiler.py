"""The profiling harness and the profile database: isolation of faulty kernels, caching, crashes."""

import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest
import torch
from faulty_backends import HangBackend, RaiseBackend, SegfaultBackend, WrongBackend
from helpers import Const, neighbours, one_node_model, onnx_model, rand, spin
from onnx import TensorProto, helper, numpy_helper

import korch
from korch.backends import get_backends
from korch.config import RETIMES
from korch.measure import busy
from korch.measure.timing import time_fn
from korch.pipeline import add_seeds
from korch.profile.database import ProfileDB
from korch.profile.profiler import ProfileOptions, Profiler, profile
from korch.search.candidates import CandidateOptions, enumerate_candidates
from korch.search.kernel import kernel_spec
from korch.search.partition import PartitionOptions

FAST = ProfileOptions(min_time=0.002, progress=False, compile_timeout=20, time_timeout=20)


def _small_graph():
    model, _ = one_node_model(
        "LayerNormalization", [rand(2, 4, 8), Const(rand(8, seed=1)), Const(rand(8, seed=2))]
    )
    return korch.fission(model).graph


def test_time_fn_reports_sane_statistics():
    a = torch.randn(64, 64)
    median, lo, hi, n, *_ = time_fn(lambda x: [x @ x], [a], "cpu", min_time=0.01)
    assert 0 < lo <= median <= hi and n >= 5


def test_time_fn_spreads_its_samples_over_time():
    """Samples in slices over spread_s: a burst of interference cannot cover all of them."""
    a = torch.randn(64, 64)
    start = time.perf_counter()
    median, lo, hi, n, *_ = time_fn(lambda x: [x @ x], [a], "cpu", min_time=0.01, spread_s=0.4)
    assert time.perf_counter() - start >= 0.4
    assert 0 < lo <= median <= hi and n >= 5


@pytest.mark.skipif(not os.path.exists("/proc/stat"), reason="korch.measure.busy reads Linux's /proc/stat")
def test_busy_window_sees_other_processes_and_not_this_one():
    """The oracle: neighbours known to spin on every core for the whole window."""
    with neighbours(), busy.Window() as w:
        spin(0.3)
    assert w.others_cores >= 0.5 and w.disturbed
    # a core of this process's own work is not counted as another's: beside the same background
    # (whatever the test machine runs), spinning does not add a core to what a sleep sees
    for _ in range(3):  # a neighbour of the test machine may come and go between the two
        with busy.Window() as idle:
            time.sleep(0.3)
        with busy.Window() as own:
            spin(0.3)
        if own.others_cores < idle.others_cores + 0.5:
            break
    assert own.others_cores < idle.others_cores + 0.5


def _core_share_over(seconds: float) -> float:
    """Cores this process's threads used, on average, over the next `seconds` (the caller asleep)."""
    cpu, wall = time.process_time(), time.perf_counter()
    time.sleep(seconds)
    return (time.process_time() - cpu) / (time.perf_counter() - wall)


@pytest.mark.skipif(not os.path.exists("/proc/self/task"), reason="busy.settle reads Linux's /proc")
def test_settle_waits_for_this_process_s_own_threads():
    """The oracle: a thread known to hash (GIL released) until told to stop, then the process's
    CPU time: settle returns only when it stopped, and at once when nothing runs."""
    import hashlib
    import threading

    stop = threading.Event()
    data = bytes(2**22)

    def work() -> None:
        while not stop.is_set():
            hashlib.sha256(data).digest()

    thread = threading.Thread(target=work)
    thread.start()
    threading.Timer(0.15, stop.set).start()
    waited = busy.settle(at_most_s=2.0)
    thread.join()
    assert 0.1 <= waited < 1.5
    assert busy.settle() < 0.05
    stop.clear()
    thread = threading.Thread(target=work)
    thread.start()
    try:  # a thread that never stops: settle gives up at at_most_s
        assert 0.2 <= busy.settle(at_most_s=0.2) < 0.5
    finally:
        stop.set()
        thread.join()


@pytest.mark.skipif(not os.path.exists("/proc/self/task"), reason="busy.settle reads Linux's /proc")
def test_settle_outlasts_onnxruntime_s_spinning_thread_pool():
    """ONNX Runtime's intra-op threads spin on after a call (allow_spinning, its default): a timing
    that starts then shares a core with them. After settle, nothing of the process runs."""
    import onnxruntime as ort

    model, feeds = one_node_model("MatMul", [rand(64, 256), rand(256, 256, seed=1)])
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 2
    sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])

    def run() -> None:
        for _ in range(3):
            sess.run(None, feeds)

    spinning = []
    for _ in range(5):
        run()
        spinning.append(_core_share_over(0.02))
        run()
        busy.settle()
        assert _core_share_over(0.02) < 0.2
    # the oracle that there was something to wait for: right after a call, a thread ran on
    assert max(spinning) > 0.3


@pytest.mark.skipif(not os.path.exists("/proc/stat"), reason="korch.measure.busy reads Linux's /proc/stat")
def test_time_fn_times_again_while_the_machine_is_busy():
    a = torch.randn(64, 64)
    with neighbours():
        timing = time_fn(lambda x: [x @ x], [a], "cpu", min_time=0.05)
    assert timing.tries == 1 + RETIMES and timing.disturbed
    assert 0 < timing.min_ms <= timing.median_ms <= timing.max_ms


def test_check_kernel_tolerates_a_few_flipped_indices_only_when_asked():
    """The source model is checked against the primitive graph computed another way: an argmax
    over near-ties may flip a few indices, which a 1% allowance accepts (and nothing more)."""
    from korch.ir.graph import GraphBuilder, TensorType
    from korch.profile.jobs import check_kernel

    b = GraphBuilder()
    graph = b.build([b.input("y", TensorType((1000,), "int64"))], ["out0"])
    want = {"out0": np.arange(1000)}
    one_flip = np.arange(1000)
    one_flip[7] = 8
    assert "wrong result" in check_kernel([torch.as_tensor(one_flip)], want, graph)
    assert check_kernel([torch.as_tensor(one_flip)], want, graph, discrete_mismatch=0.01) is None
    many = np.zeros(1000, dtype=np.int64)
    assert "differs in" in check_kernel([torch.as_tensor(many)], want, graph, discrete_mismatch=0.01)


@pytest.mark.e2e
def test_faulty_kernels_are_recorded_and_the_run_survives(tmp_path):
    graph = _small_graph()
    cands = enumerate_candidates(graph, CandidateOptions(max_size=1))
    cands.candidates = cands.candidates[:2]
    db = ProfileDB(tmp_path / "p.sqlite")
    backends = [SegfaultBackend(), HangBackend(), WrongBackend(), RaiseBackend()] + get_backends(
        ["onnxruntime"]
    )
    opts = ProfileOptions(min_time=0.002, progress=False, compile_timeout=8, jobs=2)
    result = profile(graph, cands, backends, db, opts)
    for key in {c.key for c in cands.candidates}:
        got = result.profiles[key]
        assert got["onnxruntime"].status == "ok" and got["onnxruntime"].median_ms > 0
        assert "died" in got["segfault"].reason or "timed out" in got["segfault"].reason
        assert "timed out" in got["hang"].reason
        assert "wrong result" in got["wrong"].reason
        assert "no kernel for you" in got["raise"].reason
        assert all(p.cost_ms == float("inf") for name, p in got.items() if name != "onnxruntime")
    assert db.integrity_ok()


@pytest.mark.e2e
def test_second_run_hits_the_cache(tmp_path):
    graph = _small_graph()
    cands = enumerate_candidates(graph, CandidateOptions(max_size=3))
    backends = get_backends(["onnxruntime", "vendor"])
    first = profile(graph, cands, backends, ProfileDB(tmp_path / "p.sqlite"), FAST)
    assert first.profiled > 0 and first.cache_hits == 0
    second = profile(graph, cands, backends, ProfileDB(tmp_path / "p.sqlite"), FAST)
    assert second.profiled == 0 and second.cache_hits == first.profiled
    for key, per_backend in first.profiles.items():
        assert {b: p.median_ms for b, p in per_backend.items()} == {
            b: p.median_ms for b, p in second.profiles[key].items()
        }


@pytest.mark.e2e
def test_time_budget_skips_and_reports(tmp_path):
    graph = _small_graph()
    cands = enumerate_candidates(graph, CandidateOptions(max_size=4))
    # one worker: the first chunk (always profiled) is 16 jobs, fewer than this graph's 53 keys
    opts = ProfileOptions(min_time=0.002, progress=False, time_budget=0.0, jobs=1)
    result = profile(graph, cands, get_backends(["onnxruntime"]), ProfileDB(tmp_path / "p.sqlite"), opts)
    # past the deadline only single primitives still run (so a plan can be made); the rest is
    # skipped and counted
    singles = {c.key for c in cands.candidates if len(c.nodes) == 1}
    assert singles <= set(result.profiles)
    assert 0 < result.profiled < cands.unique_keys
    assert result.profiled + result.skipped == cands.unique_keys


def _layernorm_softmax_gelu():
    """26 primitives, 20 distinct single-primitive kernels, one partition."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4, 8])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4, 8])
    weights = [numpy_helper.from_array(rand(8, seed=1), "s"), numpy_helper.from_array(rand(8, seed=2), "b")]
    nodes = [
        helper.make_node("LayerNormalization", ["x", "s", "b"], ["n"]),
        helper.make_node("Softmax", ["n"], ["p"], axis=1),
        helper.make_node("Gelu", ["p"], ["y"]),
    ]
    return onnx_model(helper.make_graph(nodes, "g", [x], [y], weights), opset=20)


@pytest.mark.e2e
def test_without_a_source_model_the_seeds_lead_and_cover(tmp_path):
    """On CUDA no backend runs the source model whole and a single primitive costs tens of
    milliseconds to time, so a short budget went to singles and no fusion was ever profiled (the
    H200 run: 600 single-primitive kernels per plan). The seeds (Inductor here, as on CUDA) now
    come first, the whole graph's first (what torch.compile would run), and past the deadline no
    single they cover is profiled: at a budget of 0 no compile starts but what a plan needs, and
    the whole graph's seed, first in line, covers every primitive on its own."""
    graph = korch.fission(_layernorm_softmax_gelu()).graph
    parts = PartitionOptions(min_nodes=8, max_nodes=12)
    cands = enumerate_candidates(graph, CandidateOptions(max_size=4, partition=parts))
    assert add_seeds(graph, cands) == len(cands.partitions) + 1 > 2  # the partitions' and the whole graph's
    seeds = [c.key for c in cands.candidates if c.seed]
    assert any(len(c.nodes) == len(graph.nodes) for c in cands.candidates if c.seed)
    singles = {c.key for c in cands.candidates if len(c.nodes) == 1}
    assert len(singles) > 16  # more than the first chunk (one worker), which is always profiled
    opts = ProfileOptions(min_time=0.002, progress=False, time_budget=0.0, jobs=1)
    backends = get_backends(["eager", "inductor"])
    result = profile(graph, cands, backends, ProfileDB(tmp_path / "p.sqlite"), opts)
    (whole,) = [c.key for c in cands.candidates if c.seed and len(c.nodes) == len(graph.nodes)]
    assert result.profiles[whole]["inductor"].status == "ok"
    assert [k for k in [*seeds, *singles] if result.profiles[k] and k != whole] == []
    assert result.profiled + result.skipped == sum(
        b.supports(kernel_spec(graph, c), "cpu") is None
        for c in {c.key: c for c in cands.candidates}.values()
        for b in backends
    )


def test_the_whole_graph_in_every_backend_is_queued_before_anything_but_the_source_model(tmp_path):
    """Each backend's whole graph is a plan on its own: under a budget it comes before the seeds and
    singles of the other backends. Inductor's whole graph sorted after every other essential job
    (Segformer-B0 with Inductor, Inductor frozen and vendor at a 60 s budget: never measured)."""
    graph = korch.fission(_layernorm_softmax_gelu()).graph
    parts = PartitionOptions(min_nodes=8, max_nodes=12)
    cands = enumerate_candidates(graph, CandidateOptions(max_size=2, partition=parts))
    add_seeds(graph, cands)
    backends = get_backends(["onnxruntime", "inductor"])
    opts = ProfileOptions(min_time=0.002, progress=False, jobs=1)
    with Profiler(graph, cands, backends, ProfileDB(tmp_path / "p.sqlite"), opts) as profiler:
        queue = [(spec.key, backend.name) for spec, backend in profiler.queue()]
    (whole,) = [c.key for c in cands.candidates if len(c.nodes) == len(graph.nodes)]
    assert sorted(queue[:2]) == [(whole, "inductor"), (whole, "onnxruntime")]
    assert len(queue) > 2 and all(key != whole for key, _ in queue[2:])


def test_a_linear_primitive_alone_is_essential_in_inductor_too():
    """A class of linear primitive bounds the kernels holding one only once every backend that can
    run it ran it alone: Inductor's matmul alone is measured with the essential jobs, its other
    single primitives after the fusions (a cheaper backend gives them a kernel)."""
    from korch.ir.graph import GraphBuilder
    from korch.ir.prims import Prim, TensorType
    from korch.profile.profiler import essential

    b = GraphBuilder()
    x, w = b.input("x", TensorType((8, 16), "float32")), b.input("w", TensorType((16, 4), "float32"))
    (y,) = b.emit(Prim.MATMUL, (x, w))
    (z,) = b.emit(Prim.TANH, (y,))
    graph = b.build([z], ["out0"])
    cands = enumerate_candidates(graph, CandidateOptions(max_size=2))
    ones = [c for c in cands.candidates if len(c.nodes) == 1]
    singles = {graph.nodes[c.nodes[0]].prim: kernel_spec(graph, c) for c in ones}
    pair = next(kernel_spec(graph, c) for c in cands.candidates if len(c.nodes) == 2)
    inductor, ort = get_backends(["inductor", "onnxruntime"])
    assert essential((singles[Prim.MATMUL], inductor)) and essential((singles[Prim.MATMUL], ort))
    assert not essential((singles[Prim.TANH], inductor)) and essential((singles[Prim.TANH], ort))
    assert not essential((pair, inductor)) and not essential((pair, ort))


@pytest.mark.e2e
def test_a_seed_that_is_also_an_enumerated_candidate_is_profiled_as_a_seed(tmp_path):
    """Seeds as small as the enumerated fusions share their keys: the seed must be what is
    profiled (first), not the enumerated twin (a fusion like any other, skipped past the
    deadline). The run between a Mixtral layer's two grouped matmuls was never profiled so."""
    graph = korch.fission(_layernorm_softmax_gelu()).graph
    cands = enumerate_candidates(graph, CandidateOptions(max_size=4, partition=PartitionOptions(3, 4)))
    add_seeds(graph, cands)
    # without the whole graph's seed, which alone would cover every primitive at a budget of 0
    cands.candidates = [c for c in cands.candidates if len(c.nodes) < len(graph.nodes)]
    enumerated = {c.key for c in cands.candidates if not c.seed}
    twins = [c.key for c in cands.candidates if c.seed and c.key in enumerated]
    assert len(twins) >= 2
    opts = ProfileOptions(min_time=0.002, progress=False, time_budget=0.0, jobs=1)
    result = profile(
        graph, cands, get_backends(["eager", "inductor"]), ProfileDB(tmp_path / "p.sqlite"), opts
    )
    assert all(result.profiles[key]["inductor"].status == "ok" for key in twins)


@pytest.mark.skipif(
    (os.cpu_count() or 1) < 2 or torch.get_num_threads() != os.cpu_count(),
    reason="needs two cores to tell the shares apart, and the timing worker's threads on all of them",
)
@pytest.mark.e2e
def test_the_whole_graph_compiles_with_all_the_cores_other_kernels_with_their_workers_share(
    tmp_path, monkeypatch
):
    """The whole graph's compile is the longest of a run, and a worker's share of the cores is one
    on a machine with a worker per core: its Inductor kernels compiled one after another."""
    from faulty_backends import CompileThreadsBackend

    log = tmp_path / "threads.log"
    monkeypatch.setenv("KORCH_TEST_THREADS_LOG", str(log))
    graph = korch.fission(_layernorm_softmax_gelu()).graph
    parts = PartitionOptions(min_nodes=8, max_nodes=12)
    cands = enumerate_candidates(graph, CandidateOptions(max_size=2, partition=parts))
    add_seeds(graph, cands)
    opts = ProfileOptions(min_time=0.002, progress=False, jobs=2)
    profile(graph, cands, [CompileThreadsBackend()], ProfileDB(tmp_path / "p.sqlite"), opts)
    seen: dict[str, set[int]] = {}  # key -> threads in the compile worker and in the timing worker
    for line in log.read_text().splitlines():
        key, threads = line.split()
        seen.setdefault(key, set()).add(int(threads))
    (whole,) = [c.key for c in cands.candidates if len(c.nodes) == len(graph.nodes)]
    share = max(1, os.cpu_count() // 2)  # two compile workers; the timing worker has every core
    assert seen.pop(whole) == {os.cpu_count()}
    assert len(seen) > 10 and all(share in threads for threads in seen.values())


@pytest.mark.e2e
def test_progress_counts_to_what_was_left_at_the_deadline(tmp_path, capsys):
    graph = _small_graph()
    cands = enumerate_candidates(graph, CandidateOptions(max_size=4))
    opts = ProfileOptions(min_time=0.002, progress=True, time_budget=0.0, jobs=1)
    result = profile(graph, cands, get_backends(["onnxruntime"]), ProfileDB(tmp_path / "p.sqlite"), opts)
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert result.skipped > 0
    assert last.startswith(f"profiling: {result.profiled}/{result.profiled} "), last


SCRIPT = textwrap.dedent("""
    import sys
    import korch
    from korch.backends import get_backends
    from korch.search.candidates import CandidateOptions, enumerate_candidates
    from korch.profile.database import ProfileDB
    from korch.profile.profiler import ProfileOptions, profile
    if __name__ == "__main__":
        graph = korch.fission(sys.argv[1]).graph
        cands = enumerate_candidates(graph, CandidateOptions(max_size=4))
        profile(graph, cands, get_backends(["onnxruntime"]), ProfileDB(sys.argv[2]),
                ProfileOptions(min_time=0.2, progress=False, jobs=1))
""")


@pytest.mark.e2e
def test_sigkill_leaves_the_database_intact_and_resumable(tmp_path):
    import onnx

    model, _ = one_node_model(
        "LayerNormalization", [rand(4, 16, 32), Const(rand(32, seed=1)), Const(rand(32, seed=2))]
    )
    onnx.save(model, tmp_path / "m.onnx")
    (tmp_path / "run.py").write_text(SCRIPT)
    db_path = tmp_path / "p.sqlite"
    proc = subprocess.Popen(
        [sys.executable, str(tmp_path / "run.py"), str(tmp_path / "m.onnx"), str(db_path)],
        start_new_session=True,
    )
    deadline = time.time() + 120
    rows = 0
    while time.time() < deadline and rows < 5:
        time.sleep(0.2)
        if db_path.exists():
            try:
                rows = ProfileDB(db_path).count()
            except Exception:
                rows = 0
    assert proc.poll() is None, "finished before it could be killed"
    os.killpg(proc.pid, signal.SIGKILL)  # the run and its workers
    proc.wait()
    db = ProfileDB(db_path)
    assert db.integrity_ok()
    done = db.count()
    assert done >= 5
    graph = korch.fission(tmp_path / "m.onnx").graph
    cands = enumerate_candidates(graph, CandidateOptions(max_size=4))
    result = profile(graph, cands, get_backends(["onnxruntime"]), db, FAST)
    assert result.cache_hits == done
    assert result.cache_hits + result.profiled == cands.unique_keys
    assert all(p["onnxruntime"].status == "ok" for p in result.profiles.values())


@pytest.mark.e2e
def test_the_deadline_holds_from_the_first_job(tmp_path):
    """No chunk of compiles runs whole past the deadline: with one worker and compiles of a second
    each, the first chunk alone (16 jobs) took 16 s whatever the budget. Now at most the compile
    in flight finishes after it (and what compiled is timed)."""
    from faulty_backends import SlowBackend

    from korch.profile.profiler import Profiler

    graph = _small_graph()
    cands = enumerate_candidates(graph, CandidateOptions(max_size=4))
    opts = ProfileOptions(min_time=0.002, progress=False, jobs=1)
    with Profiler(graph, cands, [SlowBackend()], ProfileDB(tmp_path / "p.sqlite"), opts) as profiler:
        jobs = profiler.queue()
        assert len(jobs) > 16
        profiler.measure(jobs[:1], None, cover=False)  # (the workers started: a slow machine's imports)
        budget = 6.0
        deadline = time.time() + budget
        profiler.measure(jobs[1:], deadline, cover=False)
        overrun = time.time() - deadline
    assert overrun < 0.1 * budget + 1.0 + 1.0  # 10%, the compile in flight, timing what compiled
    assert (
        1 < profiler.result.profiled < len(jobs)
        and len(profiler.pending) == len(jobs) - profiler.result.profiled
    )


@pytest.mark.e2e
def test_a_job_asked_for_twice_is_measured_once(tmp_path):
    """Identical blocks share a key, so one solution may use a (key, backend) pair twice: it is
    compiled and timed once (the second ask raised KeyError when its result came back)."""
    from korch.profile.profiler import Profiler

    graph = _small_graph()
    cands = enumerate_candidates(graph, CandidateOptions(max_size=2))
    with Profiler(graph, cands, get_backends(["onnxruntime"]), ProfileDB(tmp_path / "p.sqlite"), FAST) as p:
        jobs = p.queue()[:3]
        p.measure([*jobs, *jobs], None)
    assert p.result.profiled == 3 and p.result.failed == 0


def test_the_compile_time_recorded_is_the_compile_workers(tmp_path, monkeypatch):
    """A kernel is compiled by a compile worker, then again by the timing worker, which finds
    the compiler's caches warm: the database keeps the first, real, compile time."""
    from faulty_backends import SlowFirstBackend

    monkeypatch.setenv("KORCH_TEST_COMPILED_DIR", str(tmp_path))
    graph = _small_graph()
    cands = enumerate_candidates(graph, CandidateOptions(max_size=1))
    cands.candidates = cands.candidates[:2]
    opts = ProfileOptions(min_time=0.002, progress=False, jobs=1)
    result = profile(graph, cands, [SlowFirstBackend()], ProfileDB(tmp_path / "p.sqlite"), opts)
    for key in {c.key for c in cands.candidates}:
        prof = result.profiles[key]["slow-first"]
        assert prof.status == "ok" and prof.compile_s >= 1.0, key


def test_a_kernel_no_cache_serves_twice_is_compiled_once_and_still_checked(tmp_path, monkeypatch):
    """Inductor with frozen weights on a CPU (oneDNN prepacked weights keep its graphs out of
    the FX cache) would pay a whole compile in the compile worker and another in the timing
    worker: such a backend's kernels are compiled, checked and timed in the timing worker alone."""
    from faulty_backends import UncachedBackend, WrongUncachedBackend

    log = tmp_path / "compiles.log"
    monkeypatch.setenv("KORCH_TEST_THREADS_LOG", str(log))
    graph = _small_graph()
    cands = enumerate_candidates(graph, CandidateOptions(max_size=2))
    keys = {c.key for c in cands.candidates}
    opts = ProfileOptions(min_time=0.002, progress=False, jobs=2)
    backends = [UncachedBackend(), WrongUncachedBackend()]
    result = profile(graph, cands, backends, ProfileDB(tmp_path / "p.sqlite"), opts)
    compiles = [line.split() for line in log.read_text().splitlines()]
    assert sorted(key for key, _ in compiles) == sorted(keys)  # once each
    assert len({pid for _, pid in compiles}) == 1  # all in the one timing worker
    for key in keys:
        assert result.profiles[key]["uncached"].median_ms > 0
        assert "wrong result" in result.profiles[key]["wrong-uncached"].reason


def test_a_deadline_already_past_starts_no_worker_unless_a_plan_needs_a_kernel(tmp_path, monkeypatch):
    """At --time-budget 0 on a warm database nothing is compiled: the activations are not written
    out and no worker starts (YOLOv4: 3.3 s of spilling for nothing); when nothing is profiled yet,
    the kernels a plan needs still run."""
    import korch.profile.profiler as profiler_module

    graph = _small_graph()
    cands = enumerate_candidates(graph, CandidateOptions(max_size=2))
    opts = ProfileOptions(min_time=0.002, progress=False, jobs=1)
    backends = get_backends(["onnxruntime"])
    db = ProfileDB(tmp_path / "p.sqlite")
    with Profiler(graph, cands, backends, db, opts) as profiler:  # the kernels a plan needs: run
        queue = profiler.queue()
        profiler.measure(queue, time.time() - 1)
        assert profiler.result.skipped < len(queue) and profiler.result.profiled > 0
    spilled = []
    monkeypatch.setattr(profiler_module, "spill_activations", lambda *a: spilled.append(a))
    with Profiler(graph, cands, backends, db, opts) as profiler:  # warm: nothing a plan needs
        queue = profiler.queue()
        assert queue
        profiler.measure(queue, time.time() - 1)
        assert profiler.result.skipped == len(queue) and profiler.result.profiled == 0
    assert not spilled


@pytest.mark.parametrize("overlap", [False, True])
def test_kernels_are_timed_while_the_next_chunk_compiles_only_with_overlap(overlap, tmp_path, monkeypatch):
    """With overlap (by default on a GPU only) the timing worker times a chunk while the compile
    workers compile the next; without, never during a compile. Either way every kernel is profiled,
    checked and kept, failures too."""
    from faulty_backends import LoggedCompilesBackend

    log, marks = tmp_path / "compiles.log", tmp_path / "marks"
    marks.mkdir()
    monkeypatch.setenv("KORCH_TEST_THREADS_LOG", str(log))
    monkeypatch.setenv("KORCH_TEST_COMPILED_DIR", str(marks))
    graph = _small_graph()
    cands = enumerate_candidates(graph, CandidateOptions(max_size=3))
    keys = {c.key for c in cands.candidates}
    opts = ProfileOptions(min_time=0.002, progress=False, jobs=1, overlap=overlap)
    db = ProfileDB(tmp_path / "p.sqlite")
    result = profile(graph, cands, [LoggedCompilesBackend(), WrongBackend()], db, opts)
    assert len(keys) > 32  # (three chunks of 16)
    for key in keys:
        assert result.profiles[key]["logged"].median_ms > 0
        assert "wrong result" in result.profiles[key]["wrong"].reason
    assert db.count() == 2 * len(keys)
    compiles = [line.split() for line in log.read_text().splitlines()]
    timer = compiles[-1][0]  # (the last compile is a timing worker's: it times what was compiled)
    spans = [(float(a), float(b)) for pid, a, b in compiles if pid != timer]
    during = [float(a) for pid, a, _ in compiles if pid == timer and any(s < float(a) < e for s, e in spans)]
    assert bool(during) == overlap


def test_kernels_compile_for_the_threads_they_run_with(tmp_path, monkeypatch):
    """Inductor specializes a CPU kernel on torch's thread count and keys its caches on it: a
    compile worker (its share of the cores) compiles with the threads the timing worker and the
    plan run with, so their compiles of the same kernel find it in the cache."""
    from faulty_backends import KernelThreadsBackend

    log = tmp_path / "threads.log"
    monkeypatch.setenv("KORCH_TEST_THREADS_LOG", str(log))
    graph = _small_graph()
    cands = enumerate_candidates(graph, CandidateOptions(max_size=2))
    opts = ProfileOptions(min_time=0.002, progress=False, jobs=2)
    profile(graph, cands, [KernelThreadsBackend()], ProfileDB(tmp_path / "p.sqlite"), opts)
    threads = [int(line.split()[1]) for line in log.read_text().splitlines()]
    assert len(threads) >= 2 * len({c.key for c in cands.candidates})  # compile and timing workers
    assert set(threads) == {torch.get_num_threads()}
