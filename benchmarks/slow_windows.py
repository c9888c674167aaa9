"""ONNX Runtime alone in one process, timed in short windows beside three probes of the machine: a
single-threaded Python loop (the core), ten 384x384 torch matmuls on the same threads (cache-resident
compute) and a 64 MiB copy (memory bandwidth). Shows whether a slow stretch of ONNX Runtime is the
machine's (a probe slows with it) or its own (none does).

    python benchmarks/slow_windows.py [ZOO_MODEL] [--seconds S] [--threads N] [--dir ZOO]
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import onnxruntime as ort
import torch

from korch.cli import zoo


def ms(fn) -> float:
    start = time.perf_counter()
    fn()
    return (time.perf_counter() - start) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", nargs="?", default="yolox-nano")
    parser.add_argument("--seconds", type=float, default=40.0)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--dir", help="the zoo's folder (default: korch zoo's)")
    args = parser.parse_args()
    path = zoo.build(args.model, args.dir)
    shape = zoo.MODELS[args.model].inputs[0][1]
    feeds = {zoo.MODELS[args.model].inputs[0][0]: np.random.default_rng(0).standard_normal(shape, np.float32)}
    options = ort.SessionOptions()
    options.intra_op_num_threads, options.log_severity_level = args.threads, 3
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    torch.set_num_threads(args.threads)
    a, b = torch.randn(384, 384), torch.randn(384, 384)
    src = torch.ones(16 * 2**20)
    dst = torch.empty_like(src)
    rows, start = [], time.perf_counter()
    while time.perf_counter() - start < args.seconds:
        calls = [ms(lambda: session.run(None, feeds)) for _ in range(8)]
        loop = min(ms(lambda: sum(range(300_000))) for _ in range(2))
        mm = min(ms(lambda: [torch.mm(a, b) for _ in range(10)]) for _ in range(2))
        copy = min(ms(lambda: dst.copy_(src)) for _ in range(2))
        rows.append((time.perf_counter() - start, statistics.median(calls), loop, mm, copy))
        time.sleep(0.2)
    fast = min(r[1] for r in rows)
    print(f"{args.model}, ONNX Runtime {ort.__version__}, {args.threads} threads; ms per window")
    print("   t s   ort median   1-thread loop   10 matmuls   64 MiB copy")
    for t, call, loop, mm, copy in rows:
        mark = "*" if call > 1.5 * fast else " "
        print(f"{t:6.1f} {call:10.2f}{mark} {loop:14.2f} {mm:12.2f} {copy:13.2f}")
    slow = [r for r in rows if r[1] > 1.5 * fast]
    print(f"windows with ONNX Runtime over 1.5x its fastest (*): {len(slow)} of {len(rows)}")
    for i, name in ((2, "1-thread loop"), (3, "10 matmuls"), (4, "64 MiB copy")):
        if slow and len(slow) < len(rows):
            inside = statistics.median(r[i] for r in slow)
            outside = statistics.median(r[i] for r in rows if r not in slow)
            print(f"{name}: median {inside:.2f} ms in those windows, {outside:.2f} in the rest")


if __name__ == "__main__":
    main()
