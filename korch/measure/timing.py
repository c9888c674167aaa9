"""The one timing harness: warm-up calls, the device's queue drained around each timed call,
samples repeated until a minimum time, the device's own time of a call from CUDA events (the
host's launch overhead hidden); and the kernel timer built on them (time_fn), which the profiler,
the rewrites and the benchmarks use. Other timers (korch.plan.runtime's, korch.measure.roofline's)
take their samples here and keep their own policy: what they time, how often, what they return."""

from __future__ import annotations

import functools
import math
import statistics
import time
from collections.abc import Callable
from typing import NamedTuple

import torch

from korch.config import RETIME_PAUSE_S, RETIMES, RUNOFF_CALM, RUNOFF_SIGNIFICANCE, WAKE_CALLS
from korch.measure import busy
from korch.measure.device import hold_device, synchronize, timing_events

# ------------------------------------------------------------------ the core


def warm_up(fn: Callable[[], object], device: str, calls: int = WAKE_CALLS) -> None:
    """`calls` untimed calls (thread pools, clocks, lazy initialisation), then the queue drained."""
    for _ in range(calls):
        fn()
    synchronize(device)


def rest(seconds: float, fn: Callable[[], object], device: str) -> None:
    """A pause between timings, then WAKE_CALLS calls to wake what it let idle."""
    time.sleep(seconds)
    warm_up(fn, device)


def elapsed_ms(fn: Callable[[], object], device: str) -> float:
    """Milliseconds of one call on the host's clock, the device's queue drained before and after."""
    synchronize(device)
    start = time.perf_counter()
    fn()
    synchronize(device)
    return (time.perf_counter() - start) * 1e3


def queued_ms(fn: Callable[[], object], device: str) -> tuple[float, float]:
    """(milliseconds the host took to queue one call, milliseconds until the device had run it):
    on CPU the two are one."""
    synchronize(device)
    start = time.perf_counter()
    fn()
    queued = time.perf_counter() - start
    synchronize(device)
    return queued * 1e3, (time.perf_counter() - start) * 1e3


def batch_ms(fn: Callable[[], object], calls: int) -> float:
    """Milliseconds per call of `calls` calls back to back (calls too short for the clock alone)."""
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - start) / calls * 1e3


def repeat(
    sample: Callable[[], float], min_time: float, at_least: int, at_most: float = math.inf
) -> list[float]:
    """sample() again and again: at least `at_least` times, and until `min_time` seconds have
    passed unless `at_most` samples were taken first."""
    deadline = time.perf_counter() + min_time
    samples: list[float] = []
    while len(samples) < at_least or (time.perf_counter() < deadline and len(samples) < at_most):
        samples.append(sample())
    return samples


def hold_for(queued: float) -> float:
    """How long to hold the device's stream (device_intervals) for work the host queues in `queued`
    milliseconds: twice that, plus 0.2 ms, so the device starts the first kernel after the host
    has queued the last."""
    return 2 * queued + 0.2


def device_intervals(device: str, hold_ms: float, run: Callable[[Callable[[], None]], object]) -> list[float]:
    """Milliseconds on the CUDA device between the marks `run` makes (it is handed the function to
    call at each), the host's launch overhead hidden behind a stream held for `hold_ms`."""
    events: list[torch.cuda.Event] = []

    def mark() -> None:
        events.append(timing_events(1)[0])
        events[-1].record()

    with torch.cuda.device(device):  # the events and the hold go to the current device's stream
        hold_device(device, hold_ms)
        run(mark)
        events[-1].synchronize()
    return [a.elapsed_time(b) for a, b in zip(events, events[1:])]


def device_ms(fn: Callable[[], object], device: str, hold_ms: float) -> float:
    """One call's milliseconds on the CUDA device, the host's launch overhead hidden behind a held
    stream (device_intervals): what the call costs inside a plan replayed as a CUDA graph."""

    def run(mark) -> None:
        mark()
        fn()
        mark()

    return device_intervals(device, hold_ms, run)[0]


# ------------------------------------------------------------------ the kernel timer


class Timing(NamedTuple):
    median_ms: float
    min_ms: float
    max_ms: float
    samples: int
    tries: int = 1
    disturbed: bool = False  # other processes took part of the CPU in every try (korch.measure.busy)


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
    call = functools.partial(fn, *inputs)
    if not device.startswith("cuda"):
        busy.settle()  # the thread pools of what ran before (a whole model in ONNX Runtime) go idle
    warm_up(call, device, calls=2)
    host_ms, single_ms = queued_ms(call, device)  # the host's part (on CPU, all of it), and the call's
    cuda = device.startswith("cuda")
    batch = 1 if cuda else max(1, int(50e-6 / max(single_ms / 1e3, 1e-7)))

    def sample() -> float:
        _flush_cache(device)
        synchronize(device)
        return device_ms(call, device, hold_for(host_ms)) if cuda else batch_ms(call, batch)

    slices = 5 if spread_s > 0 else 1
    samples: list[float] = []
    medians: list[float] = []
    for i in range(slices):
        if i:
            rest(spread_s / (slices - 1), call, device)  # thread pools and clocks wake up after the pause
        taken = repeat(sample, min_time / slices, at_least=5 // slices, at_most=2000 - len(samples))
        medians.append(statistics.median(taken))
        samples += taken
    return Timing(min(medians), min(samples), max(samples), len(samples))


_L2_FLUSH: dict[str, torch.Tensor] = {}


def _flush_cache(device: str) -> None:
    """Overwrite a buffer larger than the GPU's L2 so every timed call starts cold."""
    if device.startswith("cuda"):
        if device not in _L2_FLUSH:
            _L2_FLUSH[device] = torch.empty(256 * 2**20 // 4, dtype=torch.float32, device=device)
        _L2_FLUSH[device].zero_()


def rounds_faster(challenger: list[list[float]], incumbent: list[list[float]]) -> tuple[int, int]:
    """(rounds in which `challenger`'s median call was faster than `incumbent`'s, rounds)."""
    pairs = [(statistics.median(a), statistics.median(b)) for a, b in zip(challenger, incumbent) if a and b]
    return sum(a < b for a, b in pairs), len(pairs)


def consistently_faster(challenger: list[list[float]], incumbent: list[list[float]]) -> bool:
    """Whether `challenger` was faster than `incumbent` in more side-by-side rounds than chance
    gives: a one-sided sign test at RUNOFF_SIGNIFICANCE (with 8 rounds, faster in 7 of them).
    Rounds, not calls, are the independent samples: the calls of one block share the machine's
    state of that moment (a neighbour's burst, the clock)."""
    return _significant(*rounds_faster(challenger, incumbent))


def _significant(wins: int, n: int) -> bool:
    chance = sum(math.comb(n, k) for k in range(wins, n + 1)) / 2**n  # of so many wins or more
    return n > 0 and chance <= RUNOFF_SIGNIFICANCE


def second_look(wins: int, n: int) -> bool:
    """Whether a challenger faster in `wins` of `n` rounds is worth as many rounds again before the
    sign test decides over all of them: it won most rounds, but not enough to be significant.
    With 8 rounds and then 8 more, a challenger no faster than the incumbent passes either look
    5.9% of the time, against 3.5% with one look (tests/e2e/test_optimize.py works it out)."""
    return 2 * wins > n and not _significant(wins, n)


def calm_rounds(rounds: list[list[list[float]]], reference: list[float]) -> list[int]:
    """The rounds of a side-by-side timing (rounds[system][round]: that round's calls) in which the
    machine ran at its usual speed: on the median over systems, the round's median call at most
    RUNOFF_CALM times the system's reference (what it ran at when unhindered: the fastest of its
    round medians, or a faster earlier timing). A shared machine has slow episodes, tens of
    seconds long, that /proc/stat does not show (no other process, no stolen time) and that slow
    one system more than another, so a choice made in one is not the choice made outside it."""
    systems = range(len(rounds))
    floor = [min([reference[i]] + [statistics.median(r) for r in rounds[i] if r]) for i in systems]
    calm = []
    for k in range(len(rounds[0])):
        slow = [statistics.median(rounds[i][k]) / floor[i] for i in systems if rounds[i][k] and floor[i] > 0]
        if slow and statistics.median(slow) <= RUNOFF_CALM:
            calm.append(k)
    return calm


def calm_side_by_side(
    run: Callable[[int], list[list[list[float]]]], rounds: int, reference: list[float]
) -> tuple[list[list[list[float]]], list[int]]:
    """`rounds` rounds side by side (`run(k)`: k more rounds, rounds[system][round] as above), then
    more for as many as were slow, up to twice `rounds` in all: (every round, the rounds to decide
    by). Those are the calm rounds where at least half of `rounds` were calm, else every round (a
    machine slow throughout is judged as it ran)."""
    timed = run(rounds)
    while True:
        calm = calm_rounds(timed, reference)
        ran = len(timed[0])
        if len(calm) >= rounds or ran >= 2 * rounds:
            break
        more = run(min(rounds - len(calm), 2 * rounds - ran))
        timed = [before + after for before, after in zip(timed, more, strict=True)]
    return timed, calm if 2 * len(calm) >= rounds else list(range(len(timed[0])))
