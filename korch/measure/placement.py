"""Where the process's CPUs sit: how long a cache line takes to go from one to the other and back.

On a virtual machine the hypervisor may place two vCPUs on cores that share a cache, or on cores
that share none, and move them between the two while a process runs. Code whose threads hand data
to each other (an OpenMP kernel's barriers, ONNX Runtime's thread pool) then runs much slower,
while code on one thread does not change (BENCHMARKS.md, Method: slow episodes). round_trip_ns
measures the placement directly: two threads pinned to the process's first two CPUs pass one
atomic flag back and forth (C, built once per process with the system's C compiler, which
Inductor needs on a CPU too). Linux only: None elsewhere, with fewer than two CPUs, or without a
compiler. far_rounds reads a run's round trips as far, near or moved."""

from __future__ import annotations

import ctypes
import functools
import os
import statistics
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path

from korch.config import FAR, NEAR_NS

_SOURCE = r"""
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <time.h>
static _Atomic int flag __attribute__((aligned(64)));
static _Atomic int stop __attribute__((aligned(64)));
static int cpus[2];
static void pin(int cpu) {
    cpu_set_t set; CPU_ZERO(&set); CPU_SET(cpu, &set);
    pthread_setaffinity_np(pthread_self(), sizeof set, &set);
}
static double now_ns(void) {
    struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e9 + t.tv_nsec;
}
static void *answer(void *unused) {
    pin(cpus[1]);
    while (!atomic_load_explicit(&stop, memory_order_acquire)) {
        if (atomic_load_explicit(&flag, memory_order_acquire) == 1)
            atomic_store_explicit(&flag, 0, memory_order_release);
    }
    return 0;
}
/* nanoseconds per round trip of `flag` between a thread on CPU a and one on CPU b: n round trips,
   or as many as fit in most_ns (a core taken by another process makes each one wait for it) */
double round_trip_ns(int a, int b, int n, double most_ns) {
    cpu_set_t saved; pthread_getaffinity_np(pthread_self(), sizeof saved, &saved);
    cpus[0] = a; cpus[1] = b; atomic_store(&flag, 0); atomic_store(&stop, 0);
    pthread_t other;
    if (pthread_create(&other, 0, answer, 0)) return -1;
    pin(a);
    double start = now_ns(), end = start;
    int done = 0;
    while (done < n && end - start < most_ns) {
        atomic_store_explicit(&flag, 1, memory_order_release);
        while (atomic_load_explicit(&flag, memory_order_acquire) != 0) {}
        if (++done % 64 == 0 || done == n) end = now_ns();  /* (the clock costs as much as a pass) */
    }
    atomic_store_explicit(&stop, 1, memory_order_release);
    pthread_join(other, 0);
    pthread_setaffinity_np(pthread_self(), sizeof saved, &saved);
    return (end - start) / done;
}
"""


@functools.cache
def _library():
    """The compiled round trip and the two CPUs it runs on, or None (see the module's docstring)."""
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    lib = compile_c(_SOURCE) if len(cpus) >= 2 else None
    if lib is None:
        return None
    lib.round_trip_ns.restype = ctypes.c_double
    lib.round_trip_ns.argtypes = (ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_double)
    return lib, cpus[0], cpus[1]


def compile_c(source: str) -> ctypes.CDLL | None:
    """C source built with the system's compiler (-O2, pthreads) and loaded, or None without one."""
    with tempfile.TemporaryDirectory(prefix="korch-c-") as build:
        path, library = Path(build, "source.c"), Path(build, "library.so")
        path.write_text(source)
        try:
            command = ["cc", "-O2", "-shared", "-fPIC", "-o", str(library), str(path), "-lpthread"]
            subprocess.run(command, check=True, capture_output=True, timeout=60)
            return ctypes.CDLL(str(library))  # (loaded: the files may go)
        except (OSError, subprocess.SubprocessError):
            return None


def available() -> bool:
    """Whether round trips can be measured here (builds the C once)."""
    return _library() is not None


def round_trip_ns(passes: int = 5000, repeats: int = 5, most_ms: float = 5.0) -> float | None:
    """Nanoseconds a cache line takes from the process's first CPU to its second and back: the
    median of `repeats` runs of `passes` round trips, or of as many as fit in `most_ms` (a core
    that another process holds makes a round trip wait for it, and reads as far). None where it
    cannot be measured."""
    found = _library()
    if found is None:
        return None
    lib, a, b = found
    runs = [lib.round_trip_ns(a, b, passes, most_ms * 1e6) for _ in range(repeats)]
    return statistics.median(runs) if min(runs) > 0 else None


def recorder(device: str) -> tuple[list[float | None], Callable[[], None] | None]:
    """(the round trips taken so far, a function that takes one more): interleave's `between` on a
    CPU where round trips can be measured, else None (and the list stays empty)."""
    trips: list[float | None] = []
    if device != "cpu" or not available():
        return trips, None
    return trips, lambda: trips.append(round_trip_ns())


def near_median(rounds: list[list[float]], far: list[bool | None]) -> float | None:
    """The median of the calls of the near rounds (far[r] False), or None without one."""
    calls = [ms for r, f in zip(rounds, far) if f is False for ms in r]
    return statistics.median(calls) if calls else None


def far_rounds(trips: list[float]) -> list[bool | None]:
    """Round r ran between trips[r] and trips[r + 1]: True (far) where both are over FAR times the
    least of them all (or of NEAR_NS, where every one is over it: a run whose CPUs were apart
    throughout), False (near) where neither is, None where the CPUs moved during the round."""
    return placements(list(zip(trips, trips[1:])))


def placements(pairs: list[tuple[float, float]]) -> list[bool | None]:
    """far_rounds for rounds given by their (before, after) round trips."""
    least = min([NEAR_NS, *(ns for pair in pairs for ns in pair)])
    far = [(before > FAR * least, after > FAR * least) for before, after in pairs]
    return [a if a == b else None for a, b in far]
