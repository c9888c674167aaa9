"""korch.profile.workers and Ctrl-C, which a terminal sends to the whole process group: the workers
ignore it (no traceback from each), whether they are still importing or running a job, and the
parent, which handles it, stops them at once."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

TESTS = Path(__file__).parents[1]  # (slow_start)
HERE = Path(__file__).parent  # (this module's mark_and_nap)

# A parent that runs two 60 s jobs and, interrupted, closes its pool and says how long that took.
PARENT = textwrap.dedent("""
    import signal, sys, time
    signal.signal(signal.SIGINT, signal.default_int_handler)  # even if the test runner ignores it
    from korch.profile.workers import WorkerPool
    mode, marks = sys.argv[1], sys.argv[2]
    if mode == "importing":
        import slow_start  # its workers sleep in this import before serving
        job = slow_start.echo
    else:
        from test_worker_pool_signals import mark_and_nap as job
    pool = WorkerPool(2, 1, job)
    print("started", flush=True)
    try:
        pool.run([{"n": n, "nap": 60.0, "marks": marks} for n in range(2)], 120.0, print)
    except KeyboardInterrupt:
        stopping = time.time()
        pool.close()
        print(f"closed in {time.time() - stopping:.2f}", flush=True)
        sys.exit(130)
""")


def mark_and_nap(job: dict) -> dict:
    """A job that says it has started, then outlasts the test."""
    (Path(job["marks"]) / str(job["n"])).touch()
    time.sleep(job["nap"])
    return {"status": "ok"}


def _wait_for(condition, limit_s: float, what: str) -> None:
    deadline = time.time() + limit_s
    while not condition():
        assert time.time() < deadline, what
        time.sleep(0.1)


def _group_gone(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return True
    return False


@pytest.mark.e2e
@pytest.mark.parametrize("mode", ["importing", "running"])
def test_ctrl_c_stops_the_workers_at_once_and_quietly(mode, tmp_path):
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(TESTS), str(HERE), os.environ.get("PYTHONPATH")])),
    }
    proc = subprocess.Popen(
        [sys.executable, "-c", PARENT, mode, str(tmp_path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        start_new_session=True,  # its own process group, as a terminal's foreground job has
    )
    try:
        assert proc.stdout.readline().strip() == "started"
        if mode == "importing":
            time.sleep(1.0)  # the workers are importing (slow_start alone takes 3 s)
        else:
            _wait_for(lambda: len(list(tmp_path.iterdir())) == 2, 90, "the jobs never started")
        os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C does
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130, (out, err)
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    closed = [line for line in out.splitlines() if line.startswith("closed in")]
    # waiting for a worker that ignores Ctrl-C to finish its job would take close 5 s per worker
    assert closed and float(closed[0].split()[-1]) < 4.0, out
    # no worker outlives its parent (multiprocessing's resource tracker leaves just after it)
    _wait_for(lambda: _group_gone(proc.pid), 10, "a process of the group outlived the parent")
