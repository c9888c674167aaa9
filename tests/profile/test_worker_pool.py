"""korch.profile.workers: a job's time limit counts from when its worker is ready, not from when the
job is handed to a worker that is still importing; a job that overruns is failed and its worker
replaced."""

import time

import pytest
import slow_start

from korch.errors import KorchError
from korch.profile.workers import WorkerPool


def run(jobs, timeout):
    pool = WorkerPool(1, 1, slow_start.echo)
    results = []
    try:
        started = time.time()
        pool.run(jobs, timeout, lambda job, result: results.append(result))
        return results, time.time() - started
    finally:
        pool.close()


@pytest.mark.e2e
def test_a_workers_start_does_not_count_against_its_jobs_time_limit():
    """Each job takes 1.5 of its 2.5 s; counted from the handover, the first would overrun."""
    results, seconds = run([{"n": 1, "nap": 1.5}, {"n": 2, "nap": 1.5}], timeout=2.5)
    assert [r["status"] for r in results] == ["ok", "ok"] and [r["n"] for r in results] == [1, 2]
    assert seconds > slow_start.IMPORT_S + 3.0


@pytest.mark.e2e
def test_a_job_that_overruns_fails_and_the_next_runs_on_a_new_worker():
    results, _ = run([{"n": 1, "nap": 30.0}, {"n": 2}], timeout=2.5)
    assert results[0] == {"status": "failed", "reason": "timed out after 2s", "environmental": True}
    assert results[1] == {"status": "ok", "n": 2}


@pytest.mark.e2e
def test_past_stop_at_no_job_starts_and_the_rest_come_back_in_order():
    """(A --time-budget that ends inside a chunk of compiles.) The job running at the deadline
    finishes; the two never started are returned, not run."""
    pool = WorkerPool(1, 1, slow_start.echo)
    results = []
    try:
        pool.run([{"n": 0}], 60, lambda job, result: None)  # (the worker's imports, out of the way)
        jobs = [{"n": 1, "nap": 1.0}, {"n": 2}, {"n": 3}]
        left = pool.run(jobs, 60, lambda job, result: results.append(result), stop_at=time.time() + 0.5)
        assert pool.run([{"n": 4}], 60, lambda job, result: results.append(result), stop_at=time.time()) == [
            {"n": 4}
        ]
    finally:
        pool.close()
    assert results == [{"status": "ok", **jobs[0]}] and left == jobs[1:]


def test_a_worker_compiles_with_its_share_of_the_cores():
    """Inductor compiles in a pool of min(32, cores) processes of its own, in every process: in
    each of 16 profiling workers on the 16-core GPU machine, 256 in all. A worker given one thread
    compiles in itself."""
    import helpers

    pool = WorkerPool(2, 1, helpers.inductor_compile_threads)
    results = []
    try:
        pool.run([{}, {}], 60, lambda job, result: results.append(result))
    finally:
        pool.close()
    assert results == [{"status": "ok", "compile": 1, "kernels": 1}] * 2


@pytest.mark.e2e
def test_workers_that_cannot_start_end_the_run_with_one_line():
    """(torch.set_num_threads(0) raises in every worker before it is ready.) The jobs of workers
    lost while starting are failed as "startup" (the profiler does not store them: they say
    nothing about the kernel), and when none ever starts the run ends instead of failing every
    kernel."""
    pool = WorkerPool(1, 0, slow_start.echo)
    results = []
    try:
        with pytest.raises(KorchError, match=r"^profiling workers cannot start: worker died \(exit code 1\)"):
            pool.run([{"n": i} for i in range(5)], 60, lambda job, result: results.append(result))
    finally:
        pool.close()
    lost = {"status": "failed", "reason": "worker died (exit code 1)", "environmental": True, "startup": True}
    assert results == [lost] * 2


def test_idle_workers_leave_at_once_without_the_interpreters_teardown(tmp_path):
    """With torch and Inductor loaded the teardown takes a core for 1-2 s, which close() waited
    for once per worker. Both leave, exit code 0, and no exit handler of theirs runs."""
    import helpers

    pool = WorkerPool(2, 1, helpers.exit_marker)
    jobs = [{"path": str(tmp_path / f"worker{i}")} for i in range(2)]
    try:
        pool.run(jobs, 60, lambda job, result: None)
        procs = [w.proc for w in pool.workers]
    finally:
        pool.close()
    assert [p.exitcode for p in procs] == [0, 0]
    assert list(tmp_path.iterdir()) == []
