"""A saved plan and ONNX Runtime on the plan's model, at the plan's threads and at one thread,
timed side by side in rounds of 1 s blocks (korch's interleave: pauses, settle, warm-up calls
dropped) for a while: each round's medians, the rounds in which ONNX Runtime on its threads ran
over 1.5x its fastest round (a slow episode of the machine), and each system's median inside and
outside those rounds. Shows how long the episodes last and whether the systems slow alike in them
(their ratio, not only their times, then depends on when they ran).

Before the first round and after each, how long a cache line takes to go from the process's
first CPU to its second and back (korch.measure.placement.far_rounds): a round with both over FAR
times the least seen is "far" (the two CPUs on cores that share no cache), with neither "near". Each
system's median in far and in near rounds is printed too.

    python benchmarks/slow_episodes.py PLAN_DIR [--seconds S] [--block-s S]
"""

from __future__ import annotations

import argparse
import itertools
import math
import statistics
import time

import onnxruntime as ort
import torch

from korch.config import FAR, NEAR_NS
from korch.measure import placement
from korch.plan.plan import Plan
from korch.plan.runtime import interleave

SLOW = 1.5  # a round whose ONNX Runtime median is over this factor of its fastest round


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
    rounds, trips, start = [], [placement.round_trip_ns()], time.perf_counter()
    while time.perf_counter() - start < args.seconds:
        samples = interleave(systems, 1, args.block_s, "cpu")
        rounds.append((time.perf_counter() - start, {n: statistics.median(s[0]) for n, s in samples.items()}))
        trips.append(placement.round_trip_ns())
    canary = f"ort-{threads}"
    fastest = min(r[canary] for _, r in rounds)
    slow = [r[canary] > SLOW * fastest for _, r in rounds]
    names = list(systems)
    print(f"{args.plan}: {len(plan.kernels)} kernels; ONNX Runtime {ort.__version__}; {threads} threads")
    print("   t s " + "".join(f"{n:>12}" for n in names) + "   korch/ort   trip ns (before, after)")
    for (t, r), s, a, b in zip(rounds, slow, trips, trips[1:]):
        cells = "".join(f"{r[n]:12.2f}" for n in names)
        trip_cell = f"{a:10.0f} {b:5.0f}" if placed else ""
        print(f"{t:6.1f} {cells}{r['korch'] / r[canary]:10.2f}{trip_cell}" + " *" * s)
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
