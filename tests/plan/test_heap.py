"""korch.measure.heap: once korch has built a plan's executable, timed a rewrite or started a
profiling worker, a call that allocates and frees the same 24 MiB faults no pages in; with
`KORCH_KEEP_HEAP=0` (glibc's defaults) it faults them in again every call. Page faults as the
kernel counts them (getrusage)."""

import os
import platform
import subprocess
import sys
from pathlib import Path

import heap_calls
import pytest

from korch.profile.workers import WorkerPool

TESTS = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's malloc only")


@pytest.fixture
def keep(monkeypatch, request):
    monkeypatch.setenv("KORCH_KEEP_HEAP", request.param)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(TESTS), *sys.path]))
    return request.param == "1"


def check(faults: float, kept: bool) -> None:
    if kept:
        assert faults < 16, f"{faults} page faults per call with the heap kept"
    else:  # (glibc gives back the top of the heap beyond its trim threshold, which it adjusts)
        assert faults > 1024, f"only {faults} page faults per call with glibc's defaults"


@pytest.mark.parametrize("keep", ["1", "0"], indirect=True)
@pytest.mark.parametrize("after", ["executable", "rewrite"])
def test_after_a_plan_executable_or_a_rewrite_timing(keep, after):
    out = subprocess.run(
        [sys.executable, str(TESTS / "heap_calls.py"), after],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    check(float(out.stdout.split()[-1]), keep)


@pytest.mark.parametrize("keep", ["1", "0"], indirect=True)
def test_in_a_profiling_worker(keep):
    pool = WorkerPool(1, 1, heap_calls.faults_job)
    try:
        results = []
        pool.run([{"id": 0}], 120.0, lambda job, outcome: results.append(outcome))
    finally:
        pool.close()
    assert results[0]["status"] == "ok", results[0]
    check(results[0]["faults"], keep)
