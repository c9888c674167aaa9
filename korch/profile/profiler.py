"""Profiling: compile every unique candidate with every backend that supports it, check it against
the reference executor, time it, and keep the result in the profile database.

Compilation and checking run in a pool of worker processes (korch.profile.workers: a crash or a hang
costs one kernel, not the run); timing then runs in a single worker so kernels are never timed
while others compile. What a worker does with a job is korch.profile.jobs; this module decides
which jobs run, in what order, and keeps their results."""

from __future__ import annotations

import os
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import torch

from korch.backends import Backend, class_path
from korch.config import SOURCE_DISCRETE_MISMATCH, SPREAD
from korch.errors import KorchError
from korch.ir.graph import Graph
from korch.ir.work import node_flops
from korch.measure import check
from korch.measure.device import device_name
from korch.measure.tolerance import graph_tolerance
from korch.profile.database import Profile, ProfileDB
from korch.profile.jobs import run_job, spill_activations, write_blobs
from korch.profile.ray_pool import make_ray_pool
from korch.profile.scratch import scratch_directory
from korch.profile.workers import WorkerPool
from korch.search.candidates import Candidate, CandidateSet
from korch.search.kernel import (
    SOURCE_MODEL_PREFIX,
    WHOLE_GRAPH_PREFIX,
    KernelSpec,
    kernel_graph_json,
    kernel_spec,
    runs_alone,
)


def spread_s(min_time: float, time_budget: float | None) -> float:
    """Seconds a decisive timing is spread over: SPREAD times min_time, but at most a quarter of
    a --time-budget (a user who asks for seconds gets seconds, with timings a burst may disturb).
    Some five such timings follow profiling (korch.pipeline measures plans in place)."""
    spread = min_time * SPREAD
    return spread if time_budget is None else min(spread, time_budget / 4)


@dataclass(frozen=True)
class ProfileOptions:
    device: str = "cpu"
    jobs: int | None = None  # compile workers; default: one per core
    time_budget: float | None = None  # seconds; later jobs are skipped (and reported)
    compile_timeout: float = 300.0
    time_timeout: float = 120.0
    min_time: float = 0.05  # seconds of measured calls per kernel
    progress: bool = True
    executor: str = "local"  # "local" worker processes, or "ray" (compile jobs over a Ray cluster)
    ray_address: str | None = None  # None: a running cluster from RAY_ADDRESS, else a local one
    # the candidates cover the whole graph (korch.optimize): a primitive that no backend can run
    # is refused before any profiling, as no plan could exist
    whole_graph: bool = False
    # time a chunk's kernels while the next chunk compiles; None: on a GPU only (on a CPU the
    # compiles would take the cores the timing needs)
    overlap: bool | None = None

    def overlapping(self) -> bool:
        return self.device.startswith("cuda") if self.overlap is None else self.overlap


@dataclass
class ProfileResult:
    """profiles[key][backend] for every candidate key; counts of what happened."""

    profiles: dict[str, dict[str, Profile]] = field(default_factory=dict)
    profiled: int = 0
    cache_hits: int = 0
    failed: int = 0
    skipped: int = 0
    failures: Counter = field(default_factory=Counter)
    retimed: int = 0  # kernels timed again because other processes were using the CPU
    disturbed: int = 0  # ... and busy in every try: their timings may be too slow
    seconds: float = 0.0
    pruned: dict[tuple[str, str], str] = field(default_factory=dict)  # (key, backend) -> why not

    @property
    def unsupported(self) -> Counter:
        """Pairs no backend could run, by reason."""
        return Counter(self.pruned.values())

    def cost(self, key: str, adjust=None) -> tuple[float, str | None]:
        """(best median latency in ms, its backend); infinite when nothing ran. `adjust(key,
        backend, ms)` may replace each measured latency (korch.pipeline's in-place calibration)."""
        ran = [(p.cost_ms, b) for b, p in self.profiles.get(key, {}).items() if p.cost_ms < float("inf")]
        if adjust is not None:
            ran = [(adjust(key, b, ms), b) for ms, b in ran]
        return min(ran, key=lambda c: c[0], default=(float("inf"), None))

    def summary(self) -> dict:
        return {
            "profiled": self.profiled,
            "cache_hits": self.cache_hits,
            "failed": self.failed,
            "skipped": self.skipped,
            "failures": dict(self.failures.most_common(10)),
            "retimed": self.retimed,
            "disturbed": self.disturbed,
            "seconds": round(self.seconds, 3),
        }


def _compile_pool(options: ProfileOptions, workers: int, threads: int):
    if options.executor == "ray":
        pool = make_ray_pool(options.device, options.ray_address, threads)
        if pool is not None:
            return pool
    return WorkerPool(workers, threads, run_job)


# ------------------------------------------------------------------ orchestration


class _Progress:
    """The profiling line on stderr, over every round of a Profiler (add)."""

    def __init__(self, enabled: bool):
        self.enabled = enabled
        self.total, self.done, self.failed, self.start, self.last = 0, 0, 0, time.time(), 0.0
        self.deadline: float | None = None

    def add(self, count: int, deadline: float | None) -> None:
        """Another round of `count` jobs, ending at `deadline`."""
        self.total += count
        self.deadline = deadline
        self.last = 0.0
        self._show()  # (the first results take seconds: workers start and import first)

    def skip(self, count: int) -> None:
        """Jobs dropped at the deadline: the count (and the finished line) no longer waits for them."""
        self.total -= count
        self.deadline = None
        self._show()

    def step(self, failed: bool) -> None:
        self.done += 1
        self.failed += failed
        self._show()

    def _show(self) -> None:
        now = time.time()
        tty = sys.stderr.isatty()
        if self.enabled and (now - self.last > (0.5 if tty else 15) or self.done == self.total):
            self.last = now
            eta = (now - self.start) / max(self.done, 1) * (self.total - self.done)
            if self.deadline is not None:  # a --time-budget ends it sooner (then skip says how many)
                eta = min(eta, max(self.deadline - now, 0.0))
            # too few done to extrapolate from (the first include the workers' start)
            guess = f"{eta:5.0f}s" if self.done >= min(10, self.total) else "    ?"
            line = f"profiling: {self.done}/{self.total} ({self.failed} failed), ETA {guess}"
            end = "\n" if self.done == self.total or not tty else ""
            sys.stderr.write(("\r" if tty else "") + line + " " + end)
            sys.stderr.flush()


def _require_every_primitive(
    graph: Graph, candidates: CandidateSet, runnable: set[str], refusals: dict
) -> None:
    """A one-line error before any profiling when some primitive is in no kernel that any of the
    backends runs (`--backends vendor` and an elementwise primitive, an opaque operator without
    ONNX Runtime): no plan could exist, whatever the budget."""
    covered = set().union(*(c.nodes for c in candidates.candidates if c.key in runnable))
    missing = [i for i in range(len(graph.nodes)) if i not in covered]
    if missing:
        node = graph.nodes[missing[0]]
        what = dict(node.attrs).get("op_type", node.prim.value)
        what += f" of {node.origin.rstrip(':')}" if node.origin else ""  # (op:node name)
        why = "; ".join(refusals.get(missing[0], ["no kernel holds it"]))
        raise KorchError(
            f"no backend given can run {len(missing)} primitive(s), the first {what} ({why}); "
            "add a backend (--backends)"
        )


def _priority(job: tuple[KernelSpec, Backend], lead: frozenset[str] = frozenset()) -> tuple:
    """Under a time budget what matters most is profiled first: the source model run whole and
    the whole primitive graph in every backend (each a complete plan on its own; the whole graph's
    compile is the longest of a run), every single primitive in a cheap-to-compile backend and
    every whole-partition seed (a complete plan needs them), then larger fusions first. Inductor's
    single-primitive kernels (on CUDA a Triton compile each) come after the fusions of their size:
    a cheaper backend already gives every primitive a kernel; but not its linear primitives alone,
    which make their classes' bounds (essential). The keys in `lead` come next after
    the whole graphs: the seeds where no source model runs whole (on CUDA, where ONNX Runtime has
    no provider), compiled in parallel: the partitions' seeds together make the first complete
    plan, where the hundreds of single primitives timed one by one would take a short budget on
    their own."""
    spec, backend = job
    source = spec.key.startswith(SOURCE_MODEL_PREFIX)
    return (
        not source,
        not spec.key.startswith(WHOLE_GRAPH_PREFIX),
        spec.key not in lead,
        not essential(job),
        backend.name == "inductor",
        -len(spec.graph.nodes),
    )


def essential(job: tuple[KernelSpec, Backend]) -> bool:
    """A kernel that makes plans with no fusion beside it: the source model, a whole-partition
    seed, or a single primitive in a cheap-to-compile backend (not Inductor); and a linear
    primitive alone in any backend: its class's rate bounds every kernel holding one only once
    each backend that can run it alone has (korch.orchestrate.bounds)."""
    spec, backend = job
    nodes = spec.graph.nodes
    linear = len(nodes) == 1 and node_flops(nodes[0], spec.graph.types) > 0
    single = len(nodes) == 1 and backend.name != "inductor"
    return spec.seed or single or linear or spec.key.startswith(SOURCE_MODEL_PREFIX)


def _representatives(candidates: CandidateSet) -> dict[str, Candidate]:
    """One candidate per key; a seed where a seed's key is also an enumerated candidate's."""
    representative: dict[str, Candidate] = {}
    for c in candidates.candidates:
        if c.key not in representative or c.seed and not representative[c.key].seed:
            representative[c.key] = c
    return representative


Job = tuple[KernelSpec, Backend]


class Profiler:
    """One profiling session over a candidate set: every (key, backend) pair a backend supports is
    looked up in the database (`result`) or left `pending`; `measure` compiles, checks and times
    pending pairs, as many rounds as the caller wants (korch.orchestrate.solve_measure asks for the
    kernels its solutions use), with one pool of compile workers and one timing worker kept between rounds.
    A context manager: leaving it stops the workers and removes the scratch files."""

    def __init__(
        self,
        graph: Graph,
        candidates: CandidateSet,
        backends: list[Backend],
        db: ProfileDB,
        options: ProfileOptions = ProfileOptions(),
        specs: dict[str, KernelSpec] | None = None,
    ):
        """`specs` overrides the kernel of a candidate key (the original-model seed)."""
        self.graph, self.db, self.options = graph, db, options
        self.backend_names = [b.name for b in backends]
        self.started = time.time()
        self.device = device_name(options.device)
        self.result = ProfileResult()
        self.representative = _representatives(candidates)
        self.specs: dict[str, KernelSpec] = {}
        self.pending: dict[tuple[str, str], Job] = {}
        runnable, refusals = set(), {}
        for key, cand in self.representative.items():
            spec = self.specs[key] = specs[key] if specs and key in specs else kernel_spec(graph, cand)
            self.result.profiles[key] = {}
            for backend in backends:
                reason = backend.supports(spec, options.device)
                if reason:
                    self.result.pruned[(key, backend.name)] = reason
                    if len(cand.nodes) == 1:
                        refusals.setdefault(next(iter(cand.nodes)), []).append(f"{backend.name}: {reason}")
                    continue
                runnable.add(key)
                hit = db.lookup(key, backend.name, backend.version(), self.device)
                if hit is not None:
                    self.result.profiles[key][backend.name] = hit
                    self.result.cache_hits += 1
                else:
                    self.pending[(key, backend.name)] = (spec, backend)
        if options.whole_graph:
            _require_every_primitive(graph, candidates, runnable, refusals)
        self.computes: dict[str, set[int]] = {}  # the primitives each key's kernel computes
        for c in candidates.candidates:
            self.computes.setdefault(c.key, set()).update(c.nodes)
        # seeds (the source model too) and singles: kernels that make a plan with no fusion beside them
        self.complete = {k for k, c in self.representative.items() if c.seed or len(c.nodes) == 1}
        self._scratch = None  # activations and source models on disk, and the workers: at first use
        self._progress = _Progress(options.progress)
        self._workers = options.jobs or os.cpu_count() or 1  # compile workers
        self._job_s: float | None = None  # wall seconds per job of the last chunk (all workers)
        self._timing: tuple | None = None  # (thread, results): a chunk timed while the next compiles

    def __enter__(self) -> Profiler:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def ran(self, key: str) -> bool:
        """Some backend's kernel for this key is profiled and correct."""
        return self.result.cost(key)[0] < float("inf")

    def queue(self) -> list[Job]:
        """The pending jobs, what matters most first (_priority)."""
        jobs = list(self.pending.values())
        runs_whole = any(
            k.startswith(SOURCE_MODEL_PREFIX) and (self.ran(k) or any(s.key == k for s, _ in jobs))
            for k in self.result.profiles
        )
        seeds = frozenset(k for k, c in self.representative.items() if c.seed)
        return sorted(jobs, key=lambda job: _priority(job, frozenset() if runs_whole else seeds))

    def measure(self, jobs: list[Job], deadline: float | None, cover: bool = True) -> None:
        """Compile, check and time `jobs` in order, a chunk at a time (compiled in parallel, then
        timed alone). Past `deadline` (a time.time()) no compile starts: those under way finish,
        and with `cover` the jobs a complete plan still needs run (a seed or a single primitive
        that computes something no profiled seed or single computes yet); the rest stay pending."""
        ids = dict.fromkeys((spec.key, backend.name) for spec, backend in jobs)  # (in order, once)
        jobs = [self.pending[i] for i in ids if i in self.pending]
        if not jobs:
            return
        progress = self._progress
        progress.add(len(jobs), deadline)
        queue, first, late = list(jobs), 0, False
        while first < len(queue):
            if not late and deadline is not None and time.time() > deadline:
                rest = self._coverage(queue[first:]) if cover else []
                self.result.skipped += len(queue) - first - len(rest)
                progress.skip(len(queue) - first - len(rest))
                queue, first, late = rest, 0, True
                continue
            chunk = self._chunk(None if late else deadline)
            batch, first = queue[first : first + chunk], first + chunk
            started = time.time()
            left = self._run_chunk(batch, None if late else deadline)
            if len(batch) > len(left):
                self._job_s = (time.time() - started) / (len(batch) - len(left))
            # the deadline passed inside the chunk: the jobs it did not start go back to the queue,
            # where only those a plan needs survive
            queue[first:first] = left
        self._wait()

    def _chunk(self, deadline: float | None) -> int:
        """How many jobs to compile before timing them: 8 per worker, fewer when the deadline
        is near, so that the kernels compiled when it passes are few to time (their compiles are
        paid for): about what the workers finish in the time left, at the last chunk's pace."""
        most = max(16, 8 * self._workers)
        if deadline is None or self._job_s is None:
            return most if deadline is None else self._workers
        left = max(deadline - time.time(), 0.0)
        return max(self._workers, min(most, int(left / self._job_s)))

    def cover(self) -> None:
        """Measure what a plan still needs, whatever the time: the seeds or single primitives, in
        queue order, that compute something no measured seed or single computes yet."""
        self.measure(self._coverage(self.queue()), None)

    def _coverage(self, jobs: list[Job]) -> list[Job]:
        """What still runs after the deadline: each seed or single primitive that computes
        something no profiled seed or single computes yet, in queue order, so that a plan exists."""
        covered = set().union(*(self.computes[k] for k in self.complete if self.ran(k)))
        keep = []
        for spec, backend in jobs:
            if spec.key in self.complete and not self.computes[spec.key] <= covered:
                covered |= self.computes[spec.key]
                keep.append((spec, backend))
        return keep

    def _run_chunk(self, batch: list[Job], stop_at: float | None) -> list[Job]:
        """Compile `batch` in parallel and time what compiled; the jobs not started by `stop_at`."""
        self._start()  # (here, not before: a deadline past before any chunk starts no worker)
        s = self._scratch
        # a source model goes straight to the timing worker (which compiles and checks it too):
        # one ONNX Runtime session of a large model fewer, in a process that stays; so does a
        # kernel whose compile no cache would spare the timing worker (it would compile it twice)
        device = self.options.device
        alone = {(spec.key, b.name) for spec, b in batch if spec.key in s.sources or b.compiles_again(device)}
        timing = [self._job(spec, b, "time") for spec, b in batch if (spec.key, b.name) in alone]

        def compiled(job: dict, outcome: dict) -> None:
            if outcome["status"] == "ok":  # checked by the compile worker: the timing worker,
                # which runs one job at a time for all the others, does not compute the reference again
                # the compile worker's compile is the real one (the timing worker's finds
                # Inductor's caches warm): it is the compile time recorded
                timing.append(
                    {
                        **self._job(*self._by_id(job), "time"),
                        "checked": True,
                        "compiled_s": outcome["compile_s"],
                    }
                )
            else:
                self._record(job, outcome)

        left = s.compile_pool.run(
            [self._job(spec, b, "compile") for spec, b in batch if (spec.key, b.name) not in alone],
            self.options.compile_timeout,
            compiled,
            stop_at=stop_at,
        )
        self._time(timing)
        return [self._by_id(job) for job in left]

    def _time(self, jobs: list[dict]) -> None:
        """Time compiled jobs in the timing worker: now, or with overlap in a thread of this process
        while the next chunk compiles (its results recorded here, by _wait: the database's
        connection and the bookkeeping belong to this thread)."""
        self._wait()
        timer, timeout = self._scratch.timer, self.options.time_timeout
        if not self.options.overlapping():
            timer.run(jobs, timeout, self._record)
            return
        done: list = []

        def run() -> None:
            try:
                timer.run(jobs, timeout, lambda job, outcome: done.append((job, outcome)))
            except BaseException as e:  # (raised again where the results are recorded)
                done.append((None, e))

        thread = threading.Thread(target=run, name="korch-timing", daemon=True)
        thread.start()
        self._timing = (thread, done)

    def _wait(self) -> None:
        """The timing under way in the background (overlap) finished, and its results recorded."""
        if self._timing is None:
            return
        (thread, done), self._timing = self._timing, None
        thread.join()
        for job, outcome in done:
            if job is None:
                raise outcome
            self._record(job, outcome)

    def _by_id(self, job: dict) -> Job:
        return self.pending[(job["key"], job["backend"])]

    def _start(self) -> None:
        """Spill the activations every pending job reads and start the workers, once."""
        if self._scratch is not None:
            return
        jobs = list(self.pending.values())
        sources = {spec.key: spec for spec, _ in jobs if spec.key.startswith(SOURCE_MODEL_PREFIX)}
        needed = {v for spec, _ in jobs for v in spec.inputs}
        needed |= {v for spec in sources.values() for v in spec.outputs}
        directory = scratch_directory()
        try:
            values = spill_activations(self.graph, needed, Path(directory.name))
            blob_data, blob_paths = write_blobs(sources.values(), Path(directory.name))
        except BaseException:
            directory.cleanup()
            raise
        cores = os.cpu_count() or 1
        compile_pool = _compile_pool(self.options, self._workers, threads=max(1, cores // self._workers))
        timer = WorkerPool(1, torch.get_num_threads(), run_job)
        self._scratch = _Scratch(directory, values, sources, blob_data, blob_paths, compile_pool, timer)
        timer.start()  # its imports overlap the first chunk's compiles

    def _job(self, spec: KernelSpec, backend: Backend, phase: str, inputs: list | None = None) -> dict:
        """The job for a worker; `inputs` (arrays) where the kernel reads none of the graph's values."""
        s, options = self._scratch, self.options
        job = {
            "key": spec.key,
            "backend": backend.name,
            "backend_class": class_path(backend),
            "spec": kernel_graph_json(spec.graph, s.blob_data.get(spec.key, {})),
            "device": options.device,
            "inputs": [s.values[v] for v in spec.inputs] if inputs is None else inputs,
            "weights": list(spec.weights),
            "phase": phase,
            "min_time": options.min_time,
            "kernel_threads": torch.get_num_threads(),  # (what the timing worker and the plan run with)
        }
        if runs_alone(spec.key) and phase == "compile":  # the longest compile: all the cores for it
            job["compile_threads"] = os.cpu_count() or 1
        if spec.key in s.sources:  # the model travels as a file, its check against the primitive graph
            job["blob_files"] = s.blob_paths.get(spec.key, {})
            job["want"] = {n: s.values[v] for n, v in zip(spec.graph.output_names, spec.outputs)}
            # the plan that may win alone: timed carefully
            job["spread_s"] = spread_s(options.min_time, options.time_budget)
            job["discrete_mismatch"] = SOURCE_DISCRETE_MISMATCH
            # (its one opaque node hides what the model computes)
            job["tolerance"] = graph_tolerance(self.graph)
        return job

    def measure_alone(self, spec: KernelSpec, backend: Backend) -> Profile:
        """Compile, check and time a kernel that is none of the graph's (each backend's least
        kernel, korch.orchestrate.solve_measure.least_calls) on seeded inputs, in the timing worker
        (a backend that crashes costs a worker, not the run), and keep the result in the database
        like any other."""
        self._start()
        self._wait()  # (the timing worker runs one thing at a time)
        arrays = check.random_inputs(spec.graph)
        job = self._job(spec, backend, "time", [arrays[v] for v in spec.graph.inputs])
        outcome: dict = {}
        self._scratch.timer.run([job], self.options.time_timeout, lambda _, o: outcome.update(o))
        return self._keep(spec, backend, job, outcome)

    def _keep(self, spec: KernelSpec, backend: Backend, job: dict, outcome: dict) -> Profile:
        """A job's outcome as a Profile, stored in the database. A source model is in the job (and
        the database) by its sha256, not a copy of its bytes; a worker lost while starting says
        nothing about the kernel: not stored."""
        prof = _profile(spec.key, backend.name, outcome)
        if not outcome.get("startup"):
            self.db.store(prof, backend.version(), self.device, spec.signature, job["spec"])
        return prof

    def _record(self, job: dict, outcome: dict) -> None:
        spec, backend = self.pending.pop((job["key"], job["backend"]))
        if "compiled_s" in job:
            outcome = {**outcome, "compile_s": job["compiled_s"]}
        result, failed = self.result, outcome["status"] != "ok"
        self._progress.step(failed)
        prof = self._keep(spec, backend, job, outcome)
        result.profiles[spec.key][backend.name] = prof
        result.profiled += 1
        result.retimed += outcome.get("tries", 1) > 1
        result.disturbed += bool(outcome.get("disturbed"))
        if failed:
            result.failed += 1
            result.failures[f"{backend.name}: {(prof.reason or '')[:60]}"] += 1

    def close(self) -> None:
        s, self._scratch = self._scratch, None
        if s is not None:
            try:
                if self._timing is not None:  # (an error while it ran: its results are not kept)
                    self._timing[0].join()
                s.compile_pool.close()
                s.timer.close()
            finally:
                s.directory.cleanup()
        self.result.seconds = time.time() - self.started


@dataclass
class _Scratch:
    """What a Profiler holds while it measures: files on disk and the worker pools."""

    directory: tempfile.TemporaryDirectory
    values: dict[str, str]  # value -> .npy path (korch.profile.jobs.spill_activations)
    sources: dict[str, KernelSpec]  # the source models among the pending jobs
    blob_data: dict[str, dict[str, bytes]]
    blob_paths: dict[str, dict[str, str]]
    compile_pool: object
    timer: WorkerPool


def _profile(key: str, backend: str, outcome: dict) -> Profile:
    """A job's outcome as the database keeps it."""
    return Profile(
        key,
        backend,
        outcome["status"],
        outcome.get("median_ms"),
        outcome.get("min_ms"),
        outcome.get("max_ms"),
        outcome.get("kernels"),
        outcome.get("compile_s"),
        outcome.get("reason"),
        transient=bool(outcome.get("environmental")),
    )


def profile(*args, **kwargs) -> ProfileResult:
    """Every pending candidate of a Profiler(*args, **kwargs), what matters most first (_priority),
    within its options.time_budget (korch.orchestrate.solve_measure prices the rest)."""
    with Profiler(*args, **kwargs) as profiler:
        budget = profiler.options.time_budget
        deadline = profiler.started + budget if budget is not None else None
        profiler.measure(profiler.queue(), deadline)
    return profiler.result
