"""How much of the machine other processes took while korch timed something.

On a shared machine a neighbour that takes a core for a moment inflates any timing taken then:
a plain loop's by the share of the core it lost, an OpenMP kernel's (Inductor on CPU) many times
over, since each of its barriers waits for the thread the neighbour displaced.
The profile database keeps a timing for good, so such a timing is taken again (korch.measure.timing.time_fn).

Linux only: the CPU time the whole machine spent busy (and the hypervisor stole) during a window,
from /proc/stat, less this process's own; elsewhere nothing is seen. And korch's own threads: a
timing waits for the thread pools the call before left spinning (settle)."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from typing import TypeVar

from korch.config import MIN_CORES, MIN_TICKS, SETTLE_MAX_S

_TICK_S = 1.0 / os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 0.01
T = TypeVar("T")


def _machine_ticks() -> int | None:
    """Ticks every CPU spent busy or stolen since boot: user, nice, system, irq, softirq, steal."""
    try:
        with open("/proc/stat") as f:
            fields = f.readline().split()
    except OSError:
        return None
    if not fields or fields[0] != "cpu" or len(fields) < 9:
        return None
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(x) for x in fields[1:9])
    return user + nice + system + irq + softirq + steal


def _own_s() -> float:
    t = os.times()
    return t.user + t.system


class Window:
    """`with Window() as w: ...` then w.others_cores: the average number of cores other processes
    held meanwhile (None where the machine does not say), and w.disturbed."""

    def __enter__(self) -> Window:
        self._machine, self._own, self._start = _machine_ticks(), _own_s(), time.perf_counter()
        return self

    def __exit__(self, *exc) -> None:
        wall = time.perf_counter() - self._start
        machine = _machine_ticks()
        self.others_cores = None
        self.disturbed = False
        if machine is None or self._machine is None or wall <= 0:
            return
        others_s = (machine - self._machine) * _TICK_S - (_own_s() - self._own)
        self.others_cores = others_s / wall
        self.disturbed = others_s >= MIN_TICKS * _TICK_S and self.others_cores >= MIN_CORES


def settle(at_most_s: float = SETTLE_MAX_S, poll_s: float = 0.001) -> float:
    """Wait until no other thread of this process is running (at most at_most_s): the seconds
    waited. A thread pool left spinning by the call before (ONNX Runtime's intra-op pool, numpy's
    OpenBLAS: they spin on after each call) takes a core from whatever is timed next, and a Window
    cannot see it: the threads are this process's. Read from each thread's state in /proc (a
    spinning thread is running; its CPU time is only brought up to date at the scheduler's
    ticks); where there is no /proc, nothing is waited."""
    start = time.perf_counter()
    while _others_running():
        time.sleep(poll_s)
        if time.perf_counter() - start >= at_most_s:
            break
    return time.perf_counter() - start


def _others_running() -> bool:
    """Whether a thread of this process other than the caller's is running (state R)."""
    me = str(threading.get_native_id())
    try:
        tids = os.listdir("/proc/self/task")
    except OSError:
        return False
    for tid in tids:
        if tid == me:
            continue
        try:
            with open(f"/proc/self/task/{tid}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split(None, 1)[0]
        except (OSError, IndexError):
            continue  # (the thread ended meanwhile)
        if state == "R":
            return True
    return False


def quietest(measure: Callable[[], T], retries: int, key: Callable[[T], float], pause_s: float = 0.0):
    """measure() in a Window, and again while other processes took the CPU (after pause_s times
    the try's number), `retries` times at most: (the result of least key, the tries, whether every
    try was disturbed)."""
    best = None
    for attempt in range(1 + retries):
        if attempt:
            time.sleep(pause_s * attempt)
        with Window() as window:
            result = measure()
        if best is None or key(result) < key(best):
            best = result
        if not window.disturbed:
            return best, attempt + 1, False
    return best, 1 + retries, True
