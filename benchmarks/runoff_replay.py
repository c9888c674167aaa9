"""The runoff's two ways of deciding, replayed on recorded rounds: `korch bench --json` outputs (each
system's per-round medians, many rounds side by side). From every start round, a runoff of
RUNOFF_ROUNDS rounds decided by the median over every round (korch before the calm rounds), and
one that runs slow rounds again and decides by the calm ones (korch.measure.timing.calm_side_by_side,
fed the recorded rounds in order; no in-place minima, so only its own fastest rounds tell a slow
one); and, as a control, one decided by every round over as many rounds as that one ran. Each
choice is judged by the rounds the runoff did not use, as a later `korch bench` would:
whether it picked the system with the lowest median there, and that system's median over the
lowest (regret; 1.0 is the right pick).

A round's median stands for its calls (the files keep no more), so "median over every round" is
the median of round medians here, where the runoff pools calls.

    python benchmarks/runoff_replay.py BENCH.json [...] [--out FILE]

BENCH.json: one `korch bench --json` output, or {"runs": {name: output, ...}}.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from zoo_bench import save

from korch.config import RUNOFF_ROUNDS
from korch.measure.timing import calm_side_by_side


def load(path: Path) -> dict[str, dict[str, list[float]]]:
    """name -> system -> round medians, from one bench's output or several ({"runs": {name: output}})."""
    doc = json.loads(path.read_text())
    runs = doc.get("runs", {path.stem: doc})
    return {name: {s: r["round_medians_ms"] for s, r in run["results"].items()} for name, run in runs.items()}


def medians(rounds: dict[str, list[float]], used) -> dict[str, float]:
    return {name: statistics.median(r[k] for k in used) for name, r in rounds.items()}


def every_round(rounds: dict, start: int) -> list[int]:
    return list(range(start, start + RUNOFF_ROUNDS))


def calm(rounds: dict, start: int) -> list[int]:
    names, at = list(rounds), [start]

    def run(k: int) -> list[list[list[float]]]:
        first, at[0] = at[0], at[0] + k
        return [[[rounds[n][q]] for q in range(first, first + k)] for n in names]

    _, used = calm_side_by_side(run, RUNOFF_ROUNDS, [float("inf")] * len(names))
    return [start + k for k in used]


def as_long(rounds: dict, start: int) -> list[int]:
    """Every round, over as many rounds as the calm runoff ran: more rounds, without the choosing."""
    return list(range(start, max(calm(rounds, start)) + 1))


def replay(rounds: dict[str, list[float]]) -> dict:
    n = len(next(iter(rounds.values())))
    out = {}
    for rule in (every_round, calm, as_long):
        right, regret, ran = 0, [], []
        for start in range(n - 2 * RUNOFF_ROUNDS + 1):  # room for the calm runoff's extra rounds
            used = rule(rounds, start)
            last = max(used) + 1
            mine = medians(rounds, used)
            pick = min(mine, key=mine.get)
            held = medians(rounds, [k for k in range(n) if not start <= k < last])
            right += pick == min(held, key=held.get)
            regret.append(held[pick] / min(held.values()))
            ran.append(last - start)
        out[rule.__name__] = {
            "runoffs": len(regret),
            "right": right,
            "regret_mean": round(statistics.mean(regret), 4),
            "regret_max": round(max(regret), 4),
            "rounds_run_mean": round(statistics.mean(ran), 2),
        }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="+", type=Path)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    doc = {"runoff_rounds": RUNOFF_ROUNDS, "runs": {}}
    for path in args.files:
        for name, rounds in load(path).items():
            every = medians(rounds, range(len(next(iter(rounds.values())))))
            doc["runs"][name] = result = {"median_ms": {s: round(ms, 4) for s, ms in every.items()}}
            result.update(replay(rounds))
            print(name, json.dumps(result))
    for rule in ("every_round", "calm", "as_long"):
        right = sum(r[rule]["right"] for r in doc["runs"].values())
        runoffs = sum(r[rule]["runoffs"] for r in doc["runs"].values())
        doc[rule] = {"right": right, "runoffs": runoffs}
        print(f"{rule}: the held-out rounds' fastest picked in {right} of {runoffs} runoffs")
    if args.out:
        save(args.out, doc)


if __name__ == "__main__":
    main()
