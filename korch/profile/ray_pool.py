"""The optional Ray executor: the profiler's compile-and-check jobs spread over a Ray cluster (one
GPU per task on CUDA) with the local pool's interface and timeouts. Timing stays on this machine,
the target device, in the profiler's single timing worker."""

from __future__ import annotations

import logging
import time

from korch.errors import first_line
from korch.profile.jobs import load_array, run_job
from korch.profile.workers import use_threads

log = logging.getLogger("korch")


def _ray_job(job: dict, threads: int) -> dict:
    use_threads(threads)
    return run_job(job)


class RayPool:
    """run(jobs, timeout, on_result), like korch.profile.workers.WorkerPool. A job
    still unfinished `timeout` seconds after submission (running too long, or never scheduled
    because the cluster lacks what it asks for) is cancelled and recorded as failed."""

    def __init__(self, device: str, address: str | None = None, threads: int = 1):
        import ray

        self.ray = ray
        self.started_here = not ray.is_initialized()
        if self.started_here:
            ray.init(address=address, include_dashboard=False, log_to_driver=False, configure_logging=False)
        self.gpu = device.startswith("cuda")
        resources = {"num_cpus": threads, "num_gpus": 1 if self.gpu else 0}
        self.task = ray.remote(max_retries=0, **resources)(_ray_job)
        self.threads = threads
        total = ray.cluster_resources()
        self.slots = int(total.get("GPU" if self.gpu else "CPU", 0) // (1 if self.gpu else threads))

    def run(self, jobs, timeout: float, on_result, stop_at: float | None = None) -> list:
        """As WorkerPool.run: past `stop_at` no job is submitted, and those left are returned."""
        pending, left = list(reversed(jobs)), []
        if self.slots < 1:
            for job in jobs:
                reason = "the Ray cluster has no GPU for this job"
                on_result(job, {"status": "failed", "reason": reason, "environmental": True})
            return left
        in_flight: dict = {}  # object ref -> (job, submitted at)
        while pending or in_flight:
            if pending and stop_at is not None and time.time() > stop_at:
                left, pending = pending[::-1], []
            while pending and len(in_flight) < self.slots:
                job = pending.pop()
                in_flight[self.task.remote(self._portable(job), self.threads)] = (job, time.time())
            if not in_flight:
                break
            ready, _ = self.ray.wait(list(in_flight), num_returns=1, timeout=1.0)
            for ref in ready:
                job, _ = in_flight.pop(ref)
                on_result(job, self._result(ref))
            for ref, (job, submitted) in list(in_flight.items()):
                if time.time() - submitted > timeout:
                    self.ray.cancel(ref, force=True)
                    del in_flight[ref]
                    reason = f"timed out (or never scheduled) after {timeout:.0f}s"
                    on_result(job, {"status": "failed", "reason": reason, "environmental": True})
        return left

    def _portable(self, job: dict) -> dict:
        """The job without paths on this machine: its arrays read from their files. (Source-model
        jobs, which carry a model file, are timed locally and never come here.)"""
        job = {**job, "inputs": [load_array(x) for x in job["inputs"]]}
        if "want" in job:
            job["want"] = {name: load_array(x) for name, x in job["want"].items()}
        return job

    def _result(self, ref) -> dict:
        try:
            return self.ray.get(ref)
        except Exception as e:  # the worker died (a crashing kernel) or the task was lost
            line = first_line(e, 200)
            reason = f"Ray worker failed: {type(e).__name__}: {line}"
            # (the cluster's failure, not the kernel's: a later run profiles it again)
            return {"status": "failed", "reason": reason, "environmental": True}

    def close(self) -> None:
        if self.started_here:
            self.ray.shutdown()


def make_ray_pool(device: str, address: str | None, threads: int):
    """A RayPool, or None (with a warning) when Ray is not installed or cannot start."""
    try:
        import ray  # noqa: F401
    except ImportError:
        log.warning("korch: Ray is not installed (pip install ray); profiling with the local pool")
        return None
    try:
        return RayPool(device, address, threads)
    except Exception as e:
        line = first_line(e, 200)
        log.warning("korch: Ray did not start (%s); profiling with the local pool", line)
        return None
