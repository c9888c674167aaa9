"""What ONNX Runtime's spinning thread pool does to the plan timed right after it, in one process
(as the runoff and `korch bench` alternate systems): a korch plan's calls, by their index after a
switch, following: ONNX Runtime's calls then the 20 ms pause interleave() took before a block
("after ORT, pause"); the same pause then korch.measure.busy.settle(), which interleave() and
every timing now wait for ("after ORT, settle"); the plan's own calls then the pause ("after
itself", the reference). The conditions alternate trial by trial, so the machine's slow stretches
hit them alike; each entry is the mean over a bucket of call indices of the median over trials.

    korch optimize examples/segformer_head.onnx --backends inductor --time-budget 30 -o PLAN
    python benchmarks/after_spin.py --plan PLAN --model examples/segformer_head.onnx --out FILE
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort
import torch

import korch
from korch.measure import busy

CONDITIONS = ("after ORT, pause", "after ORT, settle", "after itself")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--plan", required=True, help="a saved korch plan of --model")
    parser.add_argument("--model", required=True, help="the ONNX file ONNX Runtime runs")
    parser.add_argument("--trials", type=int, default=60)
    parser.add_argument("--calls", type=int, default=80, help="plan calls timed after each switch")
    parser.add_argument("--buckets", type=int, default=8)
    parser.add_argument("--out", help="also write the table here")
    args = parser.parse_args()
    plan = korch.load(args.plan)
    opts = ort.SessionOptions()  # ONNX Runtime's defaults (its pool spins), korch's thread count
    opts.intra_op_num_threads = torch.get_num_threads()
    sess = ort.InferenceSession(args.model, opts, providers=["CPUExecutionProvider"])
    feeds = {i.name: np.random.rand(*i.shape).astype(np.float32) for i in sess.get_inputs()}
    inputs = [feeds[i.name] for i in sess.get_inputs()]

    def ms(fn) -> float:
        start = time.perf_counter()
        fn()
        return (time.perf_counter() - start) * 1e3

    traces: dict[str, list[list[float]]] = {c: [] for c in CONDITIONS}
    waited = []
    for _ in range(args.trials):
        for condition in CONDITIONS:
            for _ in range(5):
                plan(*inputs) if condition == "after itself" else sess.run(None, feeds)
            time.sleep(0.02)
            if condition == "after ORT, settle":
                waited.append(busy.settle())
            traces[condition].append([ms(lambda: plan(*inputs)) for _ in range(args.calls)])
    step = args.calls // args.buckets
    lines = [
        f"plan {args.plan} ({len(plan.kernels)} kernels: {sorted({k.backend for k in plan.kernels})}); "
        f"ONNX Runtime {ort.__version__} on {args.model}; {torch.get_num_threads()} threads; "
        f"{args.trials} trials",
        "ms per call, mean over call indices "
        + ", ".join(f"{i}-{i + step - 1}" for i in range(0, args.calls, step)),
    ]
    means = {}
    for condition, trace in traces.items():
        per_index = [statistics.median(t[i] for t in trace) for i in range(args.calls)]
        means[condition] = [statistics.mean(per_index[i : i + step]) for i in range(0, args.calls, step)]
        lines.append(f"{condition:18s} " + " ".join(f"{m:7.3f}" for m in means[condition]))
    ref = means["after itself"]
    for condition in CONDITIONS[:2]:
        ratios = [m / r for m, r in zip(means[condition], ref)]
        lines.append(f"{condition} / after itself: " + " ".join(f"{r:.3f}" for r in ratios))
    lines.append(f"settle waited a median {statistics.median(waited) * 1e3:.1f} ms after the pause")
    text = "\n".join(lines) + "\n"
    print(text, end="")
    if args.out:
        Path(args.out).write_text(text)


if __name__ == "__main__":
    main()
