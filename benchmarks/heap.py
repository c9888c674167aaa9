"""Saved plans run in fresh processes with korch keeping the C heap (korch.measure.heap) and without
(`KORCH_KEEP_HEAP=0`, glibc's defaults), alternating: each process loads one plan, makes WARM calls,
then calls it for --seconds; per process its median and fastest call, and the page faults per call
and system over user CPU time that the kernel counted (getrusage). A process of its own per
measurement, because where glibc leaves the heap depends on everything the process did before.

    python benchmarks/heap.py PLAN_DIR [...] --out FILE [--pairs 3] [--seconds 8] [--allow-version-mismatch]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

from zoo_bench import save

WARM = 3


def child(plan_dir: str, seconds: float, allow_mismatch: bool) -> None:
    import korch

    plan = korch.load(plan_dir, allow_mismatch=allow_mismatch)
    inputs = list(plan.random_inputs().values())
    for _ in range(WARM):
        plan(*inputs)
    before, times = resource.getrusage(resource.RUSAGE_SELF), []
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        t = time.perf_counter()
        plan(*inputs)
        times.append((time.perf_counter() - t) * 1e3)
    after = resource.getrusage(resource.RUSAGE_SELF)
    user = after.ru_utime - before.ru_utime
    print(
        json.dumps(
            {
                "median_ms": round(statistics.median(times), 4),
                "min_ms": round(min(times), 4),
                "calls": len(times),
                "faults_per_call": round((after.ru_minflt - before.ru_minflt) / len(times), 1),
                "sys_over_user": round((after.ru_stime - before.ru_stime) / user, 4) if user else None,
            }
        )
    )


def one_process(plan_dir: Path, keep: bool, args) -> dict:
    command = [sys.executable, __file__, "--child", str(plan_dir), "--seconds", str(args.seconds)]
    if args.allow_version_mismatch:
        command.append("--allow-version-mismatch")
    env = {**os.environ, "KORCH_KEEP_HEAP": "1" if keep else "0"}
    done = subprocess.run(command, capture_output=True, text=True, env=env)
    if done.returncode:
        raise SystemExit(f"{plan_dir}: {done.stderr.strip()[-500:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def summary(runs: list[dict]) -> dict:
    return {
        "median_of_medians_ms": round(statistics.median(r["median_ms"] for r in runs), 4),
        "min_ms": min(r["min_ms"] for r in runs),
        "faults_per_call": statistics.median(r["faults_per_call"] for r in runs),
        "processes": runs,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("plans", nargs="*", type=Path)
    ap.add_argument("--out", type=Path)
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("--allow-version-mismatch", action="store_true")
    ap.add_argument("--child")
    args = ap.parse_args()
    if args.child:
        return child(args.child, args.seconds, args.allow_version_mismatch)
    if args.out is None or not args.plans:
        ap.error("give plan directories and --out")
    doc = {"command": " ".join(sys.argv), "pairs": args.pairs, "seconds": args.seconds, "plans": {}}
    for plan_dir in args.plans:
        runs = {"kept": [], "glibc": []}
        for i in range(args.pairs):  # kept first in even pairs, glibc's first in odd ones
            for keep in (True, False) if i % 2 == 0 else (False, True):
                runs["kept" if keep else "glibc"].append(one_process(plan_dir, keep, args))
        entry = {name: summary(r) for name, r in runs.items()}
        entry["glibc_over_kept"] = round(
            entry["glibc"]["median_of_medians_ms"] / entry["kept"]["median_of_medians_ms"], 3
        )
        doc["plans"][plan_dir.name] = entry
        print(
            f"{plan_dir.name}: kept {entry['kept']['median_of_medians_ms']} ms "
            f"({entry['kept']['faults_per_call']} faults/call), glibc's "
            f"{entry['glibc']['median_of_medians_ms']} ms ({entry['glibc']['faults_per_call']} faults/call): "
            f"{entry['glibc_over_kept']}x",
            flush=True,
        )
        save(args.out, doc)


if __name__ == "__main__":
    main()
