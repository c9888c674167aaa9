"""The Ray executor: the same profiles as the local pool on a real (local) Ray cluster, faulty
kernels isolated, unschedulable jobs failed, and the local pool when Ray is absent."""

import logging
import os
import sys
from pathlib import Path

import pytest
from faulty_backends import HangBackend, SegfaultBackend
from test_profiler import _small_graph

from korch.backends import get_backends
from korch.profile.database import ProfileDB
from korch.profile.profiler import ProfileOptions, profile
from korch.search.candidates import CandidateOptions, enumerate_candidates

OPTS = dict(min_time=0.002, progress=False, compile_timeout=20, executor="ray")


@pytest.mark.e2e
def test_without_ray_profiling_falls_back_to_the_local_pool(tmp_path, monkeypatch, caplog):
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` now raises ImportError
    graph = _small_graph()
    cands = enumerate_candidates(graph, CandidateOptions(max_size=1))
    with caplog.at_level(logging.WARNING, logger="korch"):
        result = profile(
            graph,
            cands,
            get_backends(["onnxruntime"]),
            ProfileDB(tmp_path / "p.sqlite"),
            ProfileOptions(**OPTS),
        )
    assert "Ray is not installed" in caplog.text
    assert result.profiled == cands.unique_keys and result.failed == 0


@pytest.fixture(scope="module")
def ray_cluster():
    ray = pytest.importorskip("ray")
    tests = str(Path(__file__).parents[1])  # Ray workers import the faulty test backends from here
    ray.init(
        num_cpus=2,
        include_dashboard=False,
        log_to_driver=False,
        configure_logging=False,
        runtime_env={"env_vars": {"PYTHONPATH": os.pathsep.join([tests, os.environ.get("PYTHONPATH", "")])}},
    )
    yield ray
    ray.shutdown()


@pytest.mark.e2e
def test_ray_profiles_match_the_local_pool_and_isolate_faults(ray_cluster, tmp_path):
    graph = _small_graph()
    cands = enumerate_candidates(graph, CandidateOptions(max_size=2))
    backends = get_backends(["onnxruntime"])
    local = profile(
        graph,
        cands,
        backends,
        ProfileDB(tmp_path / "a.sqlite"),
        ProfileOptions(**{**OPTS, "executor": "local"}),
    )
    remote = profile(graph, cands, backends, ProfileDB(tmp_path / "b.sqlite"), ProfileOptions(**OPTS))
    assert remote.profiled == local.profiled == cands.unique_keys
    assert {k: v["onnxruntime"].status for k, v in remote.profiles.items()} == {
        k: v["onnxruntime"].status for k, v in local.profiles.items()
    }
    cands.candidates = cands.candidates[:1]
    # a crash costs its own job only; the next job waits for a new Ray worker to start and
    # import torch, which counts against its time limit (Ray's clock starts at submission)
    faulty = profile(
        graph,
        cands,
        [SegfaultBackend(), *backends],
        ProfileDB(tmp_path / "c.sqlite"),
        ProfileOptions(**{**OPTS, "compile_timeout": 60}),
    )
    (got,) = faulty.profiles.values()
    assert got["onnxruntime"].status == "ok"
    assert "Ray worker failed" in got["segfault"].reason
    assert "ModuleNotFound" not in got["segfault"].reason and "WorkerCrashed" in got["segfault"].reason
    hung = profile(
        graph,
        cands,
        [HangBackend()],
        ProfileDB(tmp_path / "d.sqlite"),
        ProfileOptions(**{**OPTS, "compile_timeout": 6}),
    )
    (got,) = hung.profiles.values()
    assert "timed out" in got["hang"].reason


def test_jobs_the_cluster_cannot_schedule_fail_fast(ray_cluster):
    from korch.profile.ray_pool import RayPool

    pool = RayPool("cuda", threads=1)  # this cluster has no GPU
    results = []
    pool.run([{"key": "a"}, {"key": "b"}], 5, lambda j, r: results.append((j["key"], r)))
    assert [k for k, _ in results] == ["a", "b"]
    assert all("no GPU" in r["reason"] for _, r in results)
