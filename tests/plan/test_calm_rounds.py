"""The runoff's calm rounds (korch.measure.timing.calm_side_by_side) on a scripted machine: each
system's calls take a known time when the machine is calm and another in its slow episodes, so the
plan a calm machine runs fastest is known by construction."""

from __future__ import annotations

import statistics

from korch.config import RUNOFF_CALM, RUNOFF_ROUNDS
from korch.measure.timing import calm_rounds, calm_side_by_side


class Machine:
    """Systems with (calm ms, slow ms); `slow(r)` says whether round r (counted over every call of
    `run`) falls in a slow episode. Each round gives each system five calls around its time."""

    def __init__(self, systems: list[tuple[float, float]], slow):
        self.systems, self.slow, self.ran = systems, slow, 0

    def run(self, k: int) -> list[list[list[float]]]:
        out = [[] for _ in self.systems]
        for _ in range(k):
            episode = self.slow(self.ran)
            for i, (calm, slow) in enumerate(self.systems):
                ms = slow if episode else calm
                out[i].append([ms * f for f in (0.99, 1.0, 1.0, 1.01, 1.02)])
            self.ran += 1
        return out


def decide(rounds: list[list[list[float]]], used: list[int]) -> int:
    """The runoff's choice: the lowest median call over the rounds decided by."""
    medians = [statistics.median(ms for k in used for ms in plan[k]) for plan in rounds]
    return medians.index(min(medians))


# ONNX Runtime-like: fastest when calm, slowed most in an episode; OpenVINO-like: slowed less
ORT, OV = (10.0, 17.0), (12.0, 14.0)


def test_a_slow_episode_at_the_start_is_run_again_and_the_calm_winner_kept():
    machine = Machine([OV, ORT], slow=lambda r: r < RUNOFF_ROUNDS - 1)
    first = Machine([OV, ORT], slow=machine.slow).run(RUNOFF_ROUNDS)
    assert decide(first, list(range(RUNOFF_ROUNDS))) == 0  # every round counted: the episode decides
    rounds, used = calm_side_by_side(machine.run, RUNOFF_ROUNDS, reference=[100.0, 100.0])
    assert decide(rounds, used) == 1
    assert used == list(range(RUNOFF_ROUNDS - 1, len(rounds[0])))
    assert len(used) == RUNOFF_ROUNDS and machine.ran == 2 * RUNOFF_ROUNDS - 1


def test_a_calm_machine_runs_the_rounds_once():
    machine = Machine([OV, ORT], slow=lambda r: False)
    rounds, used = calm_side_by_side(machine.run, RUNOFF_ROUNDS, reference=[100.0, 100.0])
    assert machine.ran == RUNOFF_ROUNDS and used == list(range(RUNOFF_ROUNDS))
    assert decide(rounds, used) == 1


def test_a_machine_slow_throughout_is_judged_by_every_round_after_twice_the_rounds():
    """Slow by the earlier timings (the in-place minima) in every round: as many rounds again, then
    every round counts, since too few were calm."""
    machine = Machine([OV, ORT], slow=lambda r: True)
    rounds, used = calm_side_by_side(machine.run, RUNOFF_ROUNDS, reference=[OV[0], ORT[0]])
    assert machine.ran == 2 * RUNOFF_ROUNDS and used == list(range(2 * RUNOFF_ROUNDS))
    assert decide(rounds, used) == 0  # as it ran


def test_slow_rounds_scattered_through_the_runoff_are_set_aside():
    slow = {1, 4, 6, 9}
    machine = Machine([OV, ORT], slow=lambda r: r in slow)
    rounds, used = calm_side_by_side(machine.run, RUNOFF_ROUNDS, reference=[100.0, 100.0])
    assert set(used) == set(range(machine.ran)) - slow and len(used) == RUNOFF_ROUNDS
    assert decide(rounds, used) == 1


def test_a_round_is_calm_by_the_median_over_plans_within_the_factor():
    """Brute force over three plans: a round counts as calm exactly when at least two of its three
    plans ran within RUNOFF_CALM of their fastest round."""
    just = RUNOFF_CALM * 0.999
    over = RUNOFF_CALM * 1.001
    for a in (1.0, just, over):
        for b in (1.0, just, over):
            for c in (1.0, just, over):
                rounds = [[[10.0], [10.0 * f]] for f in (a, b, c)]
                calm = calm_rounds(rounds, reference=[100.0] * 3)
                within = sum(f <= RUNOFF_CALM for f in (a, b, c))
                assert calm == ([0, 1] if within >= 2 else [0]), (a, b, c)
