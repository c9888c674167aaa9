"""A saved plan and ONNX Runtime on the plan's model, at the plan's threads and at one thread,
timed side by side in rounds of 1 s blocks (korch's interleave: pauses, settle, warm-up calls
dropped) for a while: each round's medians, the rounds in which ONNX Runtime on its threads ran
over 1.5x its fastest round (a slow episode of the machine), and each system's median inside and
outside those rounds. Shows how long the episodes last and whether the systems slow alike in them
(their ratio, not only their times, then depends on when they ran).

Before the first round and after each, how long a cache line takes to go from the process's
first CPU to its second and back (korch.measure.placement.far_rounds): a round with both over FAR
times the least seen is "far" (the two CPUs on cores that share no cache), with neither "near". Each
system's median in far and in near rounds is printed too. And before each round, how long a load
from memory takes (one thread following a random chain of cache lines through a buffer much larger
than the caches, `memory_latency`): among the near rounds, each system's median in the rounds of
the higher and of the lower half of those latencies, and how each system's round medians follow
the latency (the correlation).

    python benchmarks/slow_episodes.py PLAN_DIR [--seconds S] [--block-s S]
"""

from __future__ import annotations

import argparse
import ctypes
import itertools
import math
import statistics
import time

import numpy as np
import onnxruntime as ort
import torch

from korch.config import FAR, NEAR_NS
from korch.measure import placement
from korch.plan.plan import Plan
from korch.plan.runtime import interleave

SLOW = 1.5  # a round whose ONNX Runtime median is over this factor of its fastest round

CHASE = r"""
#include <stdint.h>
#include <time.h>
/* nanoseconds per load of `steps` loads, each at the address the one before read: a chain through
   the buffer that the caller built (ring[i] the index of the next line), so no load can start
   before the one before it ends and no prefetcher can guess the next */
double chase_ns(const int64_t *ring, long steps) {
    struct timespec a, b; int64_t p = 0;
    clock_gettime(CLOCK_MONOTONIC, &a);
    for (long i = 0; i < steps; i++) p = ring[p];
    clock_gettime(CLOCK_MONOTONIC, &b);
    return p < 0 ? -1 : ((b.tv_sec - a.tv_sec) * 1e9 + (b.tv_nsec - a.tv_nsec)) / steps;
}
"""


def memory_latency(mib: int = 256, steps: int = 100_000):
    """A function giving the median ns per dependent load of three runs of `steps` loads from a
    random cycle through `mib` MiB (one cache line per step), or None without a C compiler."""
    lib = placement.compile_c(CHASE)
    if lib is None:
        return None
    lines = (mib << 20) // 64
    order = np.random.default_rng(0).permutation(lines)
    ring = np.zeros(lines * 8, dtype=np.int64)  # one int64 used per 64-byte line
    ring[order * 8] = np.roll(order, -1) * 8
    lib.chase_ns.restype = ctypes.c_double
    lib.chase_ns.argtypes = (ctypes.c_void_p, ctypes.c_long)
    return lambda: statistics.median(lib.chase_ns(ring.ctypes.data, steps) for _ in range(3))


def session(model: bytes, threads: int):
    options = ort.SessionOptions()
    options.intra_op_num_threads, options.log_severity_level = threads, 3
    return ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("plan")
    parser.add_argument("--seconds", type=float, default=120.0)
    parser.add_argument("--block-s", type=float, default=1.0)
    args = parser.parse_args()
    plan = Plan.load(args.plan)
    feeds = plan.random_inputs()
    threads = torch.get_num_threads()
    model = plan.model.SerializeToString()
    many, one = session(model, threads), session(model, 1)
    systems = {
        "korch": plan.executable().caller(feeds),
        f"ort-{threads}": lambda: many.run(None, feeds),
        "ort-1": lambda: one.run(None, feeds),
    }
    for call in systems.values():
        call()
    placed = placement.available()
    latency = memory_latency()
    loads: list[float] = []
    rounds, trips, start = [], [placement.round_trip_ns()], time.perf_counter()
    while time.perf_counter() - start < args.seconds:
        if latency is not None:
            loads.append(latency())
        samples = interleave(systems, 1, args.block_s, "cpu")
        rounds.append((time.perf_counter() - start, {n: statistics.median(s[0]) for n, s in samples.items()}))
        trips.append(placement.round_trip_ns())
    canary = f"ort-{threads}"
    fastest = min(r[canary] for _, r in rounds)
    slow = [r[canary] > SLOW * fastest for _, r in rounds]
    names = list(systems)
    print(f"{args.plan}: {len(plan.kernels)} kernels; ONNX Runtime {ort.__version__}; {threads} threads")
    print("   t s " + "".join(f"{n:>12}" for n in names) + "   korch/ort   trip ns (before, after)   load ns")
    for i, ((t, r), s, a, b) in enumerate(zip(rounds, slow, trips, trips[1:])):
        cells = "".join(f"{r[n]:12.2f}" for n in names)
        trip_cell = f"{a:10.0f} {b:5.0f}" if placed else ""
        load_cell = f"{loads[i]:10.0f}" if loads else ""
        print(f"{t:6.1f} {cells}{r['korch'] / r[canary]:10.2f}{trip_cell}{load_cell}" + " *" * s)
    print(f"rounds with {canary} over {SLOW}x its fastest round (*): {sum(slow)} of {len(rounds)}")
    runs = [len(list(g)) for k, g in itertools.groupby(slow) if k]
    print(f"slow stretches, in rounds: {runs}")
    split(names, rounds, slow, "in those rounds")
    if placed:
        far = placement.far_rounds(trips)
        pooled = {
            f: [x for r, g in enumerate(far) if g is f for x in trips[r : r + 2]] for f in (True, False)
        }
        ns = {f: statistics.median(x or [math.nan]) for f, x in pooled.items()}
        print(
            f"far rounds (round trip over {FAR}x {min(*trips, NEAR_NS):.0f} ns, before and after): "
            f"{far.count(True)} of {len(rounds)}, near {far.count(False)}; "
            f"round trip {ns[False]:.0f} ns near, {ns[True]:.0f} far; "
            f"rounds both slow and far: {sum(bool(s and f) for s, f in zip(slow, far))}"
        )
        split(names, rounds, far, "in far rounds")
        if loads:
            by_memory(names, rounds, far, loads)


def by_memory(names: list[str], rounds, far: list[bool | None], loads: list[float]) -> None:
    """Among the near rounds, each system's median in those of the higher half of memory latencies
    against the lower half, and the correlation of its round medians with the latency."""
    near = [i for i, f in enumerate(far) if f is False]
    if len(near) < 4:
        return
    cut = statistics.median(loads[i] for i in near)
    high = [None if f is not False else loads[i] > cut for i, f in enumerate(far)]
    print(
        f"memory latency before near rounds: median {cut:.0f} ns, "
        f"{min(loads[i] for i in near):.0f}-{max(loads[i] for i in near):.0f}"
    )
    split(names, rounds, high, "in near rounds of the higher latencies")
    for n in names:
        r = np.corrcoef([rounds[i][1][n] for i in near], [loads[i] for i in near])[0, 1]
        print(f"{n}: correlation of its near rounds' medians with memory latency {r:.2f}")


def split(names: list[str], rounds, marked: list[bool | None], where: str) -> None:
    """Each system's median in the marked rounds and in the rest (a round marked None in neither)."""
    for n in names:
        inside = [r[n] for (_, r), s in zip(rounds, marked) if s is True]
        outside = [r[n] for (_, r), s in zip(rounds, marked) if s is False]
        if inside and outside:
            a, b = statistics.median(inside), statistics.median(outside)
            print(f"{n}: median {a:.2f} ms {where}, {b:.2f} in the rest ({a / b:.2f}x)")


if __name__ == "__main__":
    main()
