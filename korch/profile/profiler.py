"""Profiling: compile every unique candidate with every backend that supports it, check it against
the reference executor, time it, and keep the result in the profile database.

Compilation and checking run in a pool of worker processes (korch.profile.workers: a crash or a hang
costs one kernel, not the run); timing then runs in a single worker so kernels are never timed
while others compile."""

from __future__ import annotations

import hashlib
import os
import statistics
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch

from korch.backends import (
    WAKE_CALLS,
    Backend,
    compile_with,
    device_intervals,
    device_name,
    synchronize,
    torch_ops,
)
from korch.errors import KorchError, first_line
from korch.ir import reference, tensors
from korch.ir.graph import Graph
from korch.ir.prims import from_npy
from korch.ir.tensors import to_tensor
from korch.measure import busy, check
from korch.measure.tolerance import graph_tolerance
from korch.profile.database import Profile, ProfileDB
from korch.profile.workers import WorkerPool, compile_threads
from korch.search.candidates import Candidate, CandidateSet
from korch.search.kernel import SOURCE_MODEL_PREFIX, KernelSpec, kernel_graph_json, kernel_spec, runs_alone

# timings that decide most (the source model alone, and each plan in place in korch.pipeline) are
# spread over this many times min_time (2.5 s at korch optimize's 0.02 s): on a shared machine a
# neighbour can take a core for about 2 s, doubling every timing inside that window (seen here:
# 26.7 -> 49.8 ms for the same matmuls)
SPREAD = 125
SOURCE_DISCRETE_MISMATCH = 0.01  # integer outputs of the source model vs the primitive graph


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


# ------------------------------------------------------------------ the harness


def example_tensors(graph: Graph, device: str, seed: int = 0) -> list[torch.Tensor]:
    feeds = check.random_inputs(graph, seed)
    return [tensors.as_tensor(feeds[name]).to(device) for name in graph.inputs]


_L2_FLUSH: dict[str, torch.Tensor] = {}


def _flush_cache(device: str) -> None:
    """Overwrite a buffer larger than the GPU's L2 so every timed call starts cold."""
    if device.startswith("cuda"):
        if device not in _L2_FLUSH:
            _L2_FLUSH[device] = torch.empty(256 * 2**20 // 4, dtype=torch.float32, device=device)
        _L2_FLUSH[device].zero_()


class Timing(NamedTuple):
    median_ms: float
    min_ms: float
    max_ms: float
    samples: int
    tries: int = 1
    disturbed: bool = False  # other processes took part of the CPU in every try (korch.measure.busy)


RETIMES = 2  # a timing on a CPU that other processes were using is taken again, this many times at most
RETIME_PAUSE_S = 0.1  # before the first retry; twice that before the second


def time_fn(fn, inputs, device: str = "cpu", min_time: float = 0.05, spread_s: float = 0.0) -> Timing:
    """Median, min and max milliseconds per call and the number of samples: warm-up first, then
    samples until `min_time` has passed (at least 5); calls shorter than 50 us are batched. On
    CUDA each sample is the device's time for one call, the host's launch overhead hidden (as in
    a plan replayed from a CUDA graph), each call starting with a cold L2 cache. With
    `spread_s`, the samples come in 5 slices spread over that many seconds (each after a warm-up
    call) and the median is the fastest slice's: a burst of interference shorter than the spread
    cannot cover every slice. On CPU, a timing during which other processes took a share of the
    machine (korch.measure.busy) is taken again after a pause, up to RETIMES times, and the fastest kept;
    `disturbed` says that no try was quiet."""
    if device.startswith("cuda"):  # device time: the host's neighbours do not stretch it
        return _time_once(fn, inputs, device, min_time, spread_s)
    timing, tries, disturbed = busy.quietest(
        lambda: _time_once(fn, inputs, device, min_time, spread_s),
        RETIMES,
        key=lambda t: t.median_ms,
        pause_s=RETIME_PAUSE_S,
    )
    return timing._replace(tries=tries, disturbed=disturbed)


def _time_once(fn, inputs, device: str, min_time: float, spread_s: float) -> Timing:
    for _ in range(2):
        fn(*inputs)
    synchronize(device)
    start = time.perf_counter()
    fn(*inputs)
    queued_ms = (time.perf_counter() - start) * 1e3  # the host's part (on CPU, all of it)
    synchronize(device)
    single = max(time.perf_counter() - start, 1e-7)
    cuda = device.startswith("cuda")
    batch = 1 if cuda else max(1, int(50e-6 / single))
    slices = 5 if spread_s > 0 else 1
    samples: list[float] = []
    medians: list[float] = []
    for i in range(slices):
        if i:
            time.sleep(spread_s / (slices - 1))
            for _ in range(WAKE_CALLS):  # thread pools and clocks wake up after the pause
                fn(*inputs)
            synchronize(device)
        deadline = time.perf_counter() + min_time / slices
        first = len(samples)
        while len(samples) - first < 5 // slices or (time.perf_counter() < deadline and len(samples) < 2000):
            _flush_cache(device)
            synchronize(device)
            if cuda:
                samples.append(_device_ms(fn, inputs, device, 2 * queued_ms + 0.2))
                continue
            t0 = time.perf_counter()
            for _ in range(batch):
                fn(*inputs)
            samples.append((time.perf_counter() - t0) / batch * 1e3)
        medians.append(statistics.median(samples[first:]))
    return Timing(min(medians), min(samples), max(samples), len(samples))


def _device_ms(fn, inputs, device: str, hold_ms: float) -> float:
    """One call's milliseconds on the CUDA device, the host's launch overhead hidden behind a held
    stream (backends.device_intervals): what the call costs inside a plan replayed as a CUDA graph."""

    def run(mark) -> None:
        mark()
        fn(*inputs)
        mark()

    return device_intervals(device, hold_ms, run)[0]


def check_kernel(
    outs, want, graph: Graph, discrete_mismatch: float = 0.0, tolerance: float = 0.0
) -> str | None:
    """None when every output matches the reference within tolerance (the graph's, or the given
    one where larger), else the reason. Integer and boolean outputs must match exactly (8-bit
    integers, quantized values, are compared as numbers: check.rel_err), or up to a
    `discrete_mismatch` fraction of elements (an argmax over near-ties, after a whole model
    computed two ways)."""
    if len(outs) != len(graph.outputs):
        return f"returned {len(outs)} outputs, expected {len(graph.outputs)}"
    limit = max(graph_tolerance(graph), tolerance)
    for got, name, v in zip(outs, graph.output_names, graph.outputs):
        t = graph.types[v]
        got = tensors.to_numpy(got) if isinstance(got, torch.Tensor) else np.asarray(got)
        if tuple(got.shape) != t.shape or str(got.dtype) != t.dtype:
            return f"{name}: got {got.dtype}{list(got.shape)}, expected {t}"
        expected = np.asarray(want[name])
        if discrete_mismatch and (expected.dtype == bool or expected.dtype.kind in "iu"):
            wrong = float(np.mean(got != expected)) if expected.size else 0.0
            if wrong > discrete_mismatch and not check.rel_err(got, expected) <= limit:  # (8-bit: numbers)
                return f"wrong result: {name} differs in {wrong:.1%} of its elements"
            continue
        err = check.rel_err(got, expected)
        if not err <= limit:
            return f"wrong result: {name} relative error {err:.3g}"
    return None


def _check_job(job: dict, graph: Graph, arrays: list[np.ndarray], outs) -> str | None:
    """check_kernel against the reference: the source model's is the primitive graph's values,
    computed by the caller (checking ONNX Runtime against another ONNX Runtime session would prove
    nothing)."""
    if "want" in job:
        want = {name: _load(x) for name, x in job["want"].items()}
    else:
        want = reference.run(graph, dict(zip(graph.inputs, arrays)))
    return check_kernel(outs, want, graph, job.get("discrete_mismatch", 0.0), job.get("tolerance", 0.0))


def run_job(job: dict) -> dict:
    """Compile (and, in the timing phase, time) one (key, backend) in this process."""
    import importlib

    from korch.ir.serialize import load_graph_json

    module, _, cls = job["backend_class"].partition(":")
    backend = getattr(importlib.import_module(module), cls)()
    blobs = {digest: Path(path).read_bytes() for digest, path in job.get("blob_files", {}).items()}
    graph = load_graph_json(job["spec"], blobs=blobs)
    spec = KernelSpec(job["key"], graph, (), ())
    device = job["device"]
    started = time.perf_counter()
    try:
        arrays = [_load(x) for x in job["inputs"]]
        weights = {graph.inputs[i]: arrays[i] for i in job.get("weights", ())}  # the model's constants
        with compile_threads(job.get("compile_threads")):
            compiled = compile_with(backend, spec, device, weights)
        compile_s = time.perf_counter() - started
        inputs = [to_tensor(x, device) for x in arrays]
        reason = None if job.get("checked") else _check_job(job, graph, arrays, compiled.fn(*inputs))
        if reason:
            return {"status": "failed", "reason": reason, "compile_s": compile_s}
        result = {"status": "ok", "compile_s": compile_s, "kernels": compiled.kernels}
        if job["phase"] == "time":
            spread = job.get("spread_s", 0.0)
            timing = time_fn(compiled.fn, inputs, device, job["min_time"], spread)
            result.update(median_ms=timing.median_ms, min_ms=timing.min_ms, max_ms=timing.max_ms)
            result.update(tries=timing.tries, disturbed=timing.disturbed)
        return result
    except Exception as e:  # a backend that cannot compile or run this kernel: infinite cost
        from korch.profile.workers import environmental

        line = first_line(e, 240)
        return {
            "status": "failed",
            "reason": f"{type(e).__name__}: {line}",
            "compile_s": time.perf_counter() - started,
            "environmental": environmental(e),  # (memory ran out: profiled again by a later run)
        }


def _compile_pool(options: ProfileOptions, workers: int, threads: int):
    if options.executor == "ray":
        from korch.profile.ray_pool import make_ray_pool

        pool = make_ray_pool(options.device, options.ray_address, threads)
        if pool is not None:
            return pool
    return WorkerPool(workers, threads, run_job)


# ------------------------------------------------------------------ orchestration


class _Progress:
    def __init__(self, total: int, label: str, enabled: bool, deadline: float | None = None):
        self.total, self.label, self.enabled, self.deadline = total, label, enabled, deadline
        self.done, self.failed, self.start, self.last = 0, 0, time.time(), 0.0

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
            line = f"{self.label}: {self.done}/{self.total} ({self.failed} failed), ETA {guess}"
            end = "\n" if self.done == self.total or not tty else ""
            sys.stderr.write(("\r" if tty else "") + line + " " + end)
            sys.stderr.flush()


def _spill_activations(graph: Graph, needed: set[str], directory: Path, seed: int = 0) -> dict[str, str]:
    """Real values of `needed` (a run on seeded inputs), each written to an .npy file in
    `directory` as soon as it is computed: value -> path. Kernels are checked and timed on the data
    they will see, not on noise that makes sqrt and log produce NaN; on disk, a large model's
    activations (YOLOv4's are 1 GB) are neither held by this process nor pickled into every job.
    Torch ops compute them (numpy convolutions take minutes on large models); the reference stays
    the oracle in the checks of kernels, and these values are the oracle of the source model (ONNX
    Runtime's run of the original operators is checked against the primitive graph)."""
    paths: dict[str, str] = {}

    def save(v: str, array) -> None:
        if v in needed and v not in paths:
            paths[v] = str(directory / f"v{len(paths)}.npy")
            np.save(paths[v], np.asarray(array, dtype=graph.types[v].dtype))

    def step(node, arrays):
        try:
            tensors = [to_tensor(a) for a in arrays]
            outs = [tensors.to_numpy(o) for o in torch_ops.apply(node.prim, tensors, node.a)]
        except NotImplementedError:
            outs = node.prim.ref(arrays, node.a)
        except RuntimeError as e:  # torch raises on an integer division by zero
            if "ZeroDivisionError" not in str(e):
                raise
            raise KorchError(
                f"{node.origin.rstrip(':') or node.prim.name}: an integer division by zero on korch's seeded "
                "inputs (non-index integer inputs are 1 or 2; a divisor computed from them is 0)"
            ) from None
        for v, out in zip(node.outputs, outs):
            save(v, out)
        return outs

    feeds = check.random_inputs(graph, seed)
    for v, array in [*graph.constants.items(), *feeds.items()]:
        save(v, array)
    with torch.inference_mode():
        reference.evaluate(graph, feeds, (), step)
    return paths


def _load(value) -> np.ndarray:
    """A job's array: given, or an .npy file written by _spill_activations."""
    return from_npy(np.load(value)) if isinstance(value, str) else value


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


def _write_blobs(specs, directory: Path) -> tuple[dict[str, dict[str, bytes]], dict[str, dict[str, str]]]:
    """Each source model's bytes written once to a file: (key -> {sha256: bytes}, key -> {sha256:
    path}). Workers load the file instead of receiving hundreds of megabytes through a pipe with
    every job; the bytes let the job's graph refer to them by digest."""
    data: dict[str, dict[str, bytes]] = {}
    paths: dict[str, dict[str, str]] = {}
    for spec in specs:
        for node in spec.graph.nodes:
            for _, value in node.attrs:
                if isinstance(value, bytes):
                    digest = hashlib.sha256(value).hexdigest()
                    path = directory / f"{digest}.onnx"
                    if not path.exists():
                        path.write_bytes(value)
                    data.setdefault(spec.key, {})[digest] = value
                    paths.setdefault(spec.key, {})[digest] = str(path)
    return data, paths


def _priority(job: tuple[KernelSpec, Backend], lead: frozenset[str] = frozenset()) -> tuple:
    """Under a time budget what matters most is profiled first: the source model run whole (a
    complete plan on its own), every single primitive in a cheap-to-compile backend and every
    whole-partition seed (a complete plan needs them), then larger fusions first. Inductor's
    single-primitive kernels (on CUDA a Triton compile each) come after the fusions of their size:
    a cheaper backend already gives every primitive a kernel. The keys in `lead` come before all
    but the source model: the seeds where no source model runs whole (on CUDA, where ONNX Runtime
    has no provider), compiled in parallel, the whole graph's first (the longest compile): the
    partitions' seeds together make the first complete plan, and the whole graph in Inductor is
    what torch.compile would run, where the hundreds of single primitives timed one by one would
    take a short budget on their own."""
    spec, backend = job
    source = spec.key.startswith(SOURCE_MODEL_PREFIX)
    return (
        not source,
        spec.key not in lead,
        not essential(job),
        backend.name == "inductor",
        -len(spec.graph.nodes),
    )


def essential(job: tuple[KernelSpec, Backend]) -> bool:
    """A kernel that makes plans with no fusion beside it: the source model, a whole-partition
    seed, or a single primitive in a cheap-to-compile backend (not Inductor)."""
    spec, backend = job
    single = len(spec.graph.nodes) == 1 and backend.name != "inductor"
    return spec.seed or single or spec.key.startswith(SOURCE_MODEL_PREFIX)


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
    pending pairs, as many rounds as the caller wants (korch.orchestrate.solve_measure asks for the kernels
    its
    solutions use), with one pool of compile workers and one timing worker kept between rounds.
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
        self._progress: _Progress | None = None
        self._job_s: float | None = None  # wall seconds per job of the last chunk (all workers)

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
        self._start()
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
        s = self._scratch
        # a source model goes straight to the timing worker (which compiles and checks it too):
        # one ONNX Runtime session of a large model fewer, in a process that stays
        timing = [self._job(spec, b, "time") for spec, b in batch if spec.key in s.sources]

        def compiled(job: dict, outcome: dict) -> None:
            if outcome["status"] == "ok":  # checked by the compile worker: the timing worker,
                # which runs one job at a time for all the others, does not compute the reference again
                timing.append({**self._job(*self._by_id(job), "time"), "checked": True})
            else:
                self._record(job, outcome)

        left = s.compile_pool.run(
            [self._job(spec, b, "compile") for spec, b in batch if spec.key not in s.sources],
            self.options.compile_timeout,
            compiled,
            stop_at=stop_at,
        )
        s.timer.run(list(timing), self.options.time_timeout, self._record)
        return [self._by_id(job) for job in left]

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
        directory = tempfile.TemporaryDirectory(prefix="korch-profile-")  # $TMPDIR: on disk, not in RAM
        try:
            values = _spill_activations(self.graph, needed, Path(directory.name))
            blob_data, blob_paths = _write_blobs(sources.values(), Path(directory.name))
        except BaseException:
            directory.cleanup()
            raise
        cores = os.cpu_count() or 1
        self._workers = self.options.jobs or cores
        compile_pool = _compile_pool(self.options, self._workers, threads=max(1, cores // self._workers))
        timer = WorkerPool(1, torch.get_num_threads(), run_job)
        self._scratch = _Scratch(directory, values, sources, blob_data, blob_paths, compile_pool, timer)
        self._progress = _Progress(0, "profiling", self.options.progress)
        timer.start()  # its imports overlap the first chunk's compiles

    def _job(self, spec: KernelSpec, backend: Backend, phase: str, inputs: list | None = None) -> dict:
        """The job for a worker; `inputs` (arrays) where the kernel reads none of the graph's values."""
        s, options = self._scratch, self.options
        cls = type(backend)
        job = {
            "key": spec.key,
            "backend": backend.name,
            "backend_class": f"{cls.__module__}:{cls.__qualname__}",
            "spec": kernel_graph_json(spec.graph, s.blob_data.get(spec.key, {})),
            "device": options.device,
            "inputs": [s.values[v] for v in spec.inputs] if inputs is None else inputs,
            "weights": [i for i, v in enumerate(spec.inputs) if v in self.graph.constants],
            "phase": phase,
            "min_time": options.min_time,
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
        """Compile, check and time a kernel that is none of the graph's (korch.orchestrate.solve_measure's
        least
        kernel of each backend) on seeded inputs, in the timing worker (a backend that crashes
        costs a worker, not the run), and keep the result in the database like any other."""
        self._start()
        arrays = check.random_inputs(spec.graph)
        job = self._job(spec, backend, "time", [arrays[v] for v in spec.graph.inputs])
        outcome: dict = {}
        self._scratch.timer.run([job], self.options.time_timeout, lambda _, o: outcome.update(o))
        prof = _profile(spec.key, backend.name, outcome)
        if not outcome.get("startup"):
            self.db.store(prof, backend.version(), self.device, spec.signature, job["spec"])
        return prof

    def _record(self, job: dict, outcome: dict) -> None:
        spec, backend = self.pending.pop((job["key"], job["backend"]))
        result, failed = self.result, outcome["status"] != "ok"
        self._progress.step(failed)
        prof = _profile(spec.key, backend.name, outcome)
        # a source model is in the job (and the database) by its sha256, not a copy of its bytes;
        # a worker lost while starting says nothing about the kernel: not stored
        if not outcome.get("startup"):
            self.db.store(prof, backend.version(), self.device, spec.signature, job["spec"])
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
                s.compile_pool.close()
                s.timer.close()
            finally:
                s.directory.cleanup()
        self.result.seconds = time.time() - self.started


@dataclass
class _Scratch:
    """What a Profiler holds while it measures: files on disk and the worker pools."""

    directory: tempfile.TemporaryDirectory
    values: dict[str, str]  # value -> .npy path (_spill_activations)
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


def profile(
    graph: Graph,
    candidates: CandidateSet,
    backends: list[Backend],
    db: ProfileDB,
    options: ProfileOptions = ProfileOptions(),
    specs: dict[str, KernelSpec] | None = None,
) -> ProfileResult:
    """Every pending candidate, what matters most first (_priority), within options.time_budget
    (korch.orchestrate.solve_measure prices the rest)."""
    with Profiler(graph, candidates, backends, db, options, specs) as profiler:
        deadline = profiler.started + options.time_budget if options.time_budget is not None else None
        profiler.measure(profiler.queue(), deadline)
    return profiler.result
