"""What korch's OpenMP spin setting (korch.measure.openmp) does to the solver's plans in sequence: each
model's plan (benchmarks/in_sequence.py, on a finished search's databases) timed in processes that
alternate between korch's setting (GOMP_SPINCOUNT=korch.config.OMP_SPINCOUNT) and GNU OpenMP's
default (GOMP_SPINCOUNT=300000), --trials processes each; per setting and model, the
median over the processes of each way's sum, and by backend.

    python benchmarks/omp_spin.py [MODEL ...] --dir ZOO --dbs SEARCH_OUT --out FILE
        [--backends default,inductor+vendor] [--trials 3] [--rounds 5]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from in_sequence import WAYS
from zoo_bench import PAPER_MODELS, save

from korch.config import OMP_SPINCOUNT

# (each set explicitly: korch's own setting would not reach a process that imports torch first)
SETTINGS = {
    f"korch ({OMP_SPINCOUNT} spins)": str(OMP_SPINCOUNT),
    "GNU OpenMP's default (300000 spins)": "300000",
}


def one_process(spins: str, args, out: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY")}
    env["GOMP_SPINCOUNT"] = spins
    argv = [sys.executable, str(Path(__file__).with_name("in_sequence.py")), *args.models, "--dir", args.dir]
    argv += [
        "--dbs",
        str(args.dbs),
        "--backends",
        args.backends,
        "--rounds",
        str(args.rounds),
        "--out",
        str(out),
    ]
    subprocess.run(argv, env=env, check=True, capture_output=True)
    return json.loads(out.read_text())["runs"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="*", default=list(PAPER_MODELS))
    parser.add_argument("--dir", required=True, help="the zoo's directory")
    parser.add_argument("--dbs", type=Path, required=True, help="search_bench.py's --out directory")
    parser.add_argument("--backends", default="default,inductor+vendor")
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", required=True, type=Path)
    args = parser.parse_args()
    found: dict[str, list[dict]] = {name: [] for name in SETTINGS}
    with tempfile.TemporaryDirectory() as tmp:
        for trial in range(args.trials):
            for name, spins in SETTINGS.items():
                found[name].append(one_process(spins, args, Path(tmp) / "runs.json"))
                print(f"trial {trial + 1}, {name}: done", flush=True)
    summary = {}
    for name, trials in found.items():
        for run in trials[0]:
            entry = summary.setdefault(run, {})
            entry[name] = {
                "total_ms": {w: statistics.median(t[run]["total_ms"][w] for t in trials) for w in WAYS},
                "by_backend": {
                    b: {w: statistics.median(t[run]["by_backend"][b][w] for t in trials) for w in WAYS}
                    for b in trials[0][run]["by_backend"]
                },
                "trials_in_sequence_ms": [t[run]["total_ms"]["in sequence"] for t in trials],
            }
    save(args.out, {"about": __doc__.splitlines()[0], "trials": args.trials, "runs": summary})


def markdown(doc: dict) -> str:
    """One row per run and setting: each way's sum (medians over the trials), in sequence / alone."""
    head = ["model", "backends", "setting", *WAYS, "in sequence / alone", "in sequence, each trial"]
    lines = ["| " + " | ".join(head) + " |", "|---" * len(head) + "|"]
    for run, settings in doc["runs"].items():
        model, backends = run.split("/")
        for name, e in settings.items():
            t = e["total_ms"]
            cells = [
                model,
                backends,
                name,
                *(f"{t[w]:.2f}" for w in WAYS),
                f"{t['in sequence'] / t['alone']:.2f}x",
            ]
            cells.append(", ".join(f"{ms:.2f}" for ms in e["trials_in_sequence_ms"]))
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
