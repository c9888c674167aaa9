"""Where the process's CPUs sit (korch.measure.placement): the round trip of a cache line between
them, and each round of a side-by-side timing read as near, far or moved (korch bench's use of it:
tests/cli/test_bench.py)."""

from __future__ import annotations

import os
import tempfile

import pytest

from korch.config import FAR, NEAR_NS
from korch.measure import placement
from korch.plan.runtime import interleave


def test_a_round_is_far_only_when_both_of_its_round_trips_are():
    least = 50.0
    trips = [least, 55.0, FAR * least + 1, 330.0, least]
    # round r ran between trips[r] and trips[r + 1]: near, moved, far, moved
    assert placement.far_rounds(trips) == [False, None, True, None]
    assert placement.far_rounds([60.0, FAR * 60.0]) == [False]  # (over FAR times, not at it)
    # a run whose CPUs were apart throughout: every round far, though each is near its least
    slow = FAR * NEAR_NS + 1
    assert placement.far_rounds([slow, slow + 10, slow]) == [True, True]


TWO_CPUS = hasattr(os, "sched_getaffinity") and len(os.sched_getaffinity(0)) >= 2


@pytest.mark.skipif(not TWO_CPUS, reason="one CPU, or not Linux")
def test_the_round_trip_is_measured_and_the_callers_cpus_given_back():
    before = os.sched_getaffinity(0)
    ns = placement.round_trip_ns(passes=2000, repeats=3)
    if ns is None:
        pytest.skip("no C compiler")
    # a cache line between two cores: tens to hundreds of nanoseconds, never zero or a millisecond
    assert 5.0 < ns < 100_000.0
    assert os.sched_getaffinity(0) == before  # (the calling thread was pinned while it measured)


@pytest.mark.skipif(not TWO_CPUS, reason="one CPU, or not Linux")
def test_building_the_round_trip_leaves_no_files_behind(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    placement._library.cache_clear()
    try:
        built = placement.available()
        assert placement.round_trip_ns(passes=100, repeats=1) is not None or not built
    finally:
        placement._library.cache_clear()
    assert list(tmp_path.iterdir()) == []  # (one build per process: a directory each, before)


def test_interleave_calls_between_before_the_first_round_and_after_each():
    seen = []
    systems = {"a": lambda: seen.append("a"), "b": lambda: seen.append("b")}
    rounds = interleave(systems, 3, 0.0, "cpu", pause_s=0.0, between=lambda: seen.append("|"))
    assert all(len(r) == 3 for per in rounds.values() for r in per)
    marks = [i for i, x in enumerate(seen) if x == "|"]
    assert len(marks) == 4 and marks[0] == 0 and marks[-1] == len(seen) - 1
    # every round's calls of both systems lie between two marks
    for start, end in zip(marks, marks[1:]):
        assert set(seen[start + 1 : end]) == {"a", "b"}
