"""The profile database on a second run: optimize a model twice with a fresh database and no time
budget (everything profiled the first time), as two `korch optimize` processes, and report both
wall times, the cache hit rate and the speed-up.

    python benchmarks/cache_bench.py [MODEL.onnx] [--backends a,b] [--max-size N]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "tiny_segformer.onnx"


def optimize(model: str, plan: Path, cache: Path, args) -> tuple[float, dict]:
    cmd = [sys.executable, "-m", "korch.cli.commands", "optimize", model, "-o", str(plan)]
    cmd += ["--cache", str(cache)]
    cmd += ["--backends", args.backends, "--max-size", str(args.max_size), "--json", "--quiet"]
    start = time.perf_counter()
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return time.perf_counter() - start, json.loads(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", nargs="?", default=str(EXAMPLE))
    parser.add_argument("--backends", default="onnxruntime,vendor,inductor")
    parser.add_argument("--max-size", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        cache = Path(tmp) / "profiles.sqlite"
        cold_s, cold = optimize(args.model, Path(tmp) / "p1", cache, args)
        warm_s, warm = optimize(args.model, Path(tmp) / "p2", cache, args)
    jobs = warm["cache_hits"] + warm["profiled"]
    print(f"model {args.model}, backends {args.backends}, max size {args.max_size}")
    print(f"first run:  {cold_s:7.1f} s, profiled {cold['profiled']}, kernels {cold['kernels']}")
    print(
        f"second run: {warm_s:7.1f} s, cache hits {warm['cache_hits']} of {jobs} "
        f"({warm['cache_hits'] / max(jobs, 1):.0%}), kernels {warm['kernels']}"
    )
    print(f"second run {cold_s / warm_s:.1f}x faster")


if __name__ == "__main__":
    main()
