"""Lower bounds on a kernel's latency before it is compiled: its own work at the fastest rates seen.

A kernel reads its inputs and writes its outputs at least once (those of primitives that a backend
may run as views of their input excepted), and does its linear primitives' multiply-adds (both
counted by korch.ir.work.kernel_work); it cannot do either faster than the fastest rate any kernel
has shown on the device, nor finish sooner than the quickest call its backend has ever made. So its
latency is at least

    max(least call of its backend, FLOPs / fastest FLOP rate, bytes / fastest byte rate)

where the rates are the fastest measured (the device's matmul and copy ceilings included), raised by
SAFETY, and the least call lowered by LAUNCH_SAFETY: a kernel not measured yet may beat the fastest
seen so far, by as much as these margins allow. Small working sets run from cache, many times faster
per byte than a large copy, so the byte rate for a kernel of B bytes is the fastest among kernels
(and the device's copies of a few sizes, measured beside the ceilings) of at least B / SIZE_WINDOW
bytes (all of them where none is that large).

A linear primitive of a kind, shapes and attributes seen before (its class) is bounded tighter: by
the fastest rate (by their fastest calls) of the kernels whose linear primitives are all of its
class, raised by CLASS_MARGIN (by CLASS_MARGIN_ONE in a kernel holding no other linear primitive:
kernels holding several have beaten their classes' rates by more), once every backend that can run
the class alone (a kernel of that one primitive) has: a backend not measured on a class yet may
beat every other on it (BENCHMARKS.md, design constants). A backend that cannot run it alone is
not waited for (inductor-frozen refuses a linear primitive that reads no weight: there is nothing
to freeze, and it runs kernels holding one only beside one that does). A kernel's FLOPs term is
then the sum over its linear primitives. The bounds only ever order and certify: they are derived
from the profile database's measurements, never stored as if measured.
`violations` checks them against measurements (tests, benchmarks/search_bench.py)."""

from __future__ import annotations

import bisect
import math
from collections.abc import Hashable, Iterable, Mapping
from dataclasses import dataclass

from korch.config import CLASS_MARGIN, CLASS_MARGIN_ONE, LAUNCH_SAFETY, SAFETY, SIZE_WINDOW
from korch.ir.work import Work
from korch.measure.roofline import sized_copies


@dataclass(frozen=True)
class Observation:
    """One measured kernel: its backend, work and latency (its median call), and its fastest call
    (a class's rate is taken from it: the machine's slow stretches inflate a median, rarely all of
    a timing's calls)."""

    backend: str
    work: Work
    ms: float
    fastest_ms: float | None = None


class Rates:
    """The fastest rates and least calls among `observations`, with the device's `ceilings`
    (korch.measure.roofline.measure_ceilings: "gflops", "bandwidth_gbs", and the copies of a few
    sizes, "bandwidth_gbs@<bytes>", as if measured kernels) as floors of the rates."""

    def __init__(
        self,
        observations: Iterable[Observation],
        ceilings: dict | None = None,
        capable: Mapping[Hashable, set[str]] | None = None,
    ):
        ceilings = ceilings or {}
        seen = [o for o in observations if o.ms > 0 and math.isfinite(o.ms)]
        flop_rates = [o.work.flops / o.ms for o in seen]  # FLOPs per ms
        self.flops_per_ms = SAFETY * max([ceilings.get("gflops", 0.0) * 1e6, *flop_rates])
        self.class_rate = _class_rates(seen, capable or {})
        self.launch_ms: dict[str, float] = {}
        for o in seen:
            self.launch_ms[o.backend] = min(self.launch_ms.get(o.backend, math.inf), o.ms)
        self.launch_ms = {b: LAUNCH_SAFETY * ms for b, ms in self.launch_ms.items()}
        # byte rates by size (the device's copies of a few sizes among them: a kernel no faster
        # than a copy may still be the fastest seen), and the fastest among each size and larger
        copies = [(size, gbs * 1e6) for size, gbs in sized_copies(ceilings)]
        by_size = sorted([(o.work.bytes, o.work.bytes / o.ms) for o in seen] + copies)
        self._sizes = [size for size, _ in by_size]
        self._fastest_above: list[float] = []
        fastest = ceilings.get("bandwidth_gbs", 0.0) * 1e6  # bytes per ms
        for _, rate in reversed(by_size):
            fastest = max(fastest, rate)
            self._fastest_above.append(fastest)
        self._fastest_above.reverse()
        self._fastest = fastest  # the fastest of all, the ceiling included

    def bytes_per_ms(self, size: int) -> float:
        """The fastest byte rate among kernels of at least size / SIZE_WINDOW bytes, raised by SAFETY."""
        i = bisect.bisect_left(self._sizes, size / SIZE_WINDOW)
        rate = self._fastest_above[i] if i < len(self._sizes) else self._fastest
        return SAFETY * rate

    def bound_ms(self, work: Work, backend: str) -> float:
        """A lower bound on the latency of a kernel doing `work` in `backend`."""
        return max(self.terms(work, backend).values())

    def terms(self, work: Work, backend: str) -> dict[str, float]:
        """The bound's terms by name ("launch", "flops", "class", "bytes"): the bound is the largest."""
        terms = {"launch": self.launch_ms.get(backend, 0.0)}
        if work.flops and self.flops_per_ms > 0:
            terms["flops"] = work.flops / self.flops_per_ms
            terms["class"] = self._by_class_ms(work)
        if work.bytes:
            rate = self.bytes_per_ms(work.bytes)
            terms["bytes"] = work.bytes / rate if rate > 0 else 0.0
        return terms

    def _by_class_ms(self, work: Work) -> float:
        """Each linear primitive's FLOPs at its class's rate raised by the margin (at the fastest
        rate where its class has none), summed."""
        margin = CLASS_MARGIN_ONE if len(work.linear) == 1 else CLASS_MARGIN
        ms = 0.0
        for c, flops in work.linear:
            rate = self.class_rate.get(c)
            ms += flops / (margin * rate) if rate else flops / self.flops_per_ms
        return ms


def _class_rates(seen: list[Observation], capable: Mapping[Hashable, set[str]]) -> dict[Hashable, float]:
    """class -> the fastest FLOPs per ms (by their fastest calls) of the kernels whose linear
    primitives are all of that class (bound_ms raises it by a margin); only the classes that every
    backend in `capable` (class -> the backends that can run it alone) has run alone."""
    fastest: dict[Hashable, float] = {}
    alone: dict[Hashable, set[str]] = {}
    for o in seen:
        classes = {c for c, _ in o.work.linear}
        if len(classes) == 1:
            c = classes.pop()
            fastest[c] = max(fastest.get(c, 0.0), o.work.flops / min(o.ms, o.fastest_ms or o.ms))
            if o.work.alone:
                alone.setdefault(c, set()).add(o.backend)
    return {c: rate for c, rate in fastest.items() if c in capable and capable[c] <= alone.get(c, set())}


def capable_backends(pairs: Iterable[tuple[Work, str]]) -> dict[Hashable, set[str]]:
    """class -> the backends among (work, backend) `pairs` that run a linear primitive of it alone."""
    capable: dict[Hashable, set[str]] = {}
    for work, backend in pairs:
        if work.alone:
            capable.setdefault(work.linear[0][0], set()).add(backend)
    return capable


def violations(
    observations: list[Observation], ceilings: dict | None = None, floors: list[Observation] = ()
) -> list[tuple[int, float]]:
    """(index, bound / measured) of each observation that runs faster than the bound the others
    give it (leave-one-out: the bound of a kernel not measured yet comes from the rest), the
    `floors` (each backend's least kernel, which sets its launch floor) always among the rest.
    A class's rate counts where every backend that ran it alone, in this one or the rest, ran it
    alone among the rest. Empty when every bound held."""
    capable = capable_backends((o.work, o.backend) for o in observations)
    found = []
    for i, o in enumerate(observations):
        others = [*observations[:i], *observations[i + 1 :], *floors]
        bound = Rates(others, ceilings, capable).bound_ms(o.work, o.backend)
        if o.ms < bound:
            found.append((i, bound / o.ms))
    return found
