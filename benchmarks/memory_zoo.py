"""Peak memory of `korch optimize` on zoo models: the whole process tree, sampled, and the largest
single process (getrusage); the limit to stay under is 4 GiB.

python benchmarks/memory_zoo.py [MODEL ...] [--dir ZOO_CACHE] [--time-budget S] [--backends a,b]
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from korch.cli import zoo

LIMIT_MIB = 4096


def _tree_rss_kib(root: int) -> tuple[int, int]:
    """Resident memory of `root` and every descendant, from /proc: the sum and the largest."""
    children: dict[int, list[int]] = {}
    rss: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/status") as f:
                fields = dict(line.split(":", 1) for line in f if ":" in line)
        except OSError:
            continue
        pid = int(entry)
        children.setdefault(int(fields.get("PPid", "0").strip()), []).append(pid)
        rss[pid] = int(fields.get("VmRSS", "0 kB").split()[0])
    total, largest, todo = 0, 0, [root]
    while todo:
        pid = todo.pop()
        total += rss.get(pid, 0)
        largest = max(largest, rss.get(pid, 0))
        todo.extend(children.get(pid, []))
    return total, largest


def _sample(proc: subprocess.Popen, peak: list[int], period: float = 0.1) -> None:
    while proc.poll() is None:
        total, largest = _tree_rss_kib(proc.pid)
        peak[0], peak[1] = max(peak[0], total), max(peak[1], largest)
        time.sleep(period)


def measure(model: Path, time_budget: float, backends: str) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        argv = [sys.executable, "-m", "korch.cli.commands", "optimize", str(model), "-o", f"{tmp}/plan"]
        argv += ["--cache", f"{tmp}/p.sqlite", "--time-budget", str(time_budget)]
        argv += ["--backends", backends, "--quiet", "--json"]
        start = time.perf_counter()
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        peak = [0, 0]
        sampler = threading.Thread(target=_sample, args=(proc, peak), daemon=True)
        sampler.start()
        out, err = proc.communicate()
        sampler.join()
    return {
        "exit": proc.returncode,
        "seconds": time.perf_counter() - start,
        "tree_peak_mib": peak[0] / 1024,
        "largest_process_mib": peak[1] / 1024,
        "error": err.strip().splitlines()[-1] if proc.returncode and err.strip() else "",
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="*", default=["bert-base", "yolov4"])
    parser.add_argument("--dir", default=None, help="zoo cache directory")
    parser.add_argument("--time-budget", type=float, default=60.0)
    parser.add_argument("--backends", default="onnxruntime")
    args = parser.parse_args()
    print(f"{'model':14s} {'onnx_MiB':>9s} {'tree_peak_MiB':>14s} {'largest_MiB':>12s} {'seconds':>8s}")
    over = False
    for name in args.models:
        path = zoo.build(name, args.dir)
        r = measure(path, args.time_budget, args.backends)
        size = path.stat().st_size / 2**20
        print(
            f"{name:14s} {size:9.0f} {r['tree_peak_mib']:14.0f} {r['largest_process_mib']:12.0f} "
            f"{r['seconds']:8.1f} {'FAILED: ' + r['error'] if r['exit'] else ''}",
            flush=True,
        )
        over |= r["tree_peak_mib"] > LIMIT_MIB or r["exit"] != 0
    # exact for the largest process (sampling can miss a short spike), over every model run
    largest = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024  # KiB on Linux
    print(f"largest single process over all runs (getrusage): {largest:.0f} MiB")
    print(f"limit {LIMIT_MIB} MiB: {'EXCEEDED or failed' if over else 'ok'}")
    return 1 if over else 0


if __name__ == "__main__":
    sys.exit(main())
