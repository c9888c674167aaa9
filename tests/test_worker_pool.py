"""korch.worker_pool: a job's time limit counts from when its worker is ready, not from when the
job is handed to a worker that is still importing; a job that overruns is failed and its worker
replaced."""

import time

import slow_start

from korch.worker_pool import WorkerPool


def run(jobs, timeout):
    pool = WorkerPool(1, 1, slow_start.echo)
    results = []
    try:
        started = time.time()
        pool.run(jobs, timeout, lambda job, result: results.append(result))
        return results, time.time() - started
    finally:
        pool.close()


def test_a_workers_start_does_not_count_against_its_jobs_time_limit():
    """Each job takes 1.5 of its 2.5 s; counted from the handover, the first would overrun."""
    results, seconds = run([{"n": 1, "nap": 1.5}, {"n": 2, "nap": 1.5}], timeout=2.5)
    assert [r["status"] for r in results] == ["ok", "ok"] and [r["n"] for r in results] == [1, 2]
    assert seconds > slow_start.IMPORT_S + 3.0


def test_a_job_that_overruns_fails_and_the_next_runs_on_a_new_worker():
    results, _ = run([{"n": 1, "nap": 30.0}, {"n": 2}], timeout=2.5)
    assert results[0] == {"status": "failed", "reason": "timed out after 2s"}
    assert results[1] == {"status": "ok", "n": 2}


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
