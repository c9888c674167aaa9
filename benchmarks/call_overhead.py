"""korch's runtime cost per call around its kernels: a toy decoder step (one 64-wide token in, four
key/value caches of 4 heads x ROWS x 16 in, the token's projection and the four grown caches out;
5 values each way) optimized with one backend, then timed side by side in one process
(korch.plan.runtime.interleave's A B C / C B A blocks): ONNX Runtime alone on the file, a numpy
caller's `plan(**arrays)` (inputs checked, outputs handed back), and the call `korch bench`
times (inputs checked once). Medians in microseconds.

    python benchmarks/call_overhead.py --dir DIR [--rows 15,1023] [--backends onnxruntime,inductor]

To compare two versions of korch, run it once per checkout (PYTHONPATH=CHECKOUT) and alternate.
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

import numpy as np
from onnx import TensorProto, helper, numpy_helper

import korch
from korch.cli.bench import _onnxruntime_peer
from korch.plan.runtime import interleave

CACHES = 4


def step_model(rows: int):
    """x [1, 1, 64] -> y = tanh(x @ W); present_i = concat(past_i, y as [1, 4, 1, 16]) along rows."""
    f = TensorProto.FLOAT
    weight = np.random.default_rng(0).standard_normal((64, 64)).astype(np.float32) / 8
    inits = [numpy_helper.from_array(weight, "W"), numpy_helper.from_array(np.array([1, 4, 1, 16]), "shape")]
    nodes = [helper.make_node("MatMul", ["x", "W"], ["xw"]), helper.make_node("Tanh", ["xw"], ["y"])]
    inputs = [helper.make_tensor_value_info("x", f, [1, 1, 64])]
    outputs = [helper.make_tensor_value_info("y", f, [1, 1, 64])]
    for i in range(CACHES):
        nodes += [
            helper.make_node("Reshape", ["y", "shape"], [f"new{i}"]),
            helper.make_node("Concat", [f"past{i}", f"new{i}"], [f"present{i}"], axis=2),
        ]
        inputs.append(helper.make_tensor_value_info(f"past{i}", f, [1, 4, rows, 16]))
        outputs.append(helper.make_tensor_value_info(f"present{i}", f, [1, 4, rows + 1, 16]))
    graph = helper.make_graph(nodes, "step", inputs, outputs, inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", required=True, help="for the profile database")
    parser.add_argument("--rows", default="15,1023", help="cache rows, comma-separated")
    parser.add_argument("--backends", default="onnxruntime,inductor", help="one plan per backend")
    parser.add_argument("--rounds", type=int, default=10)
    args = parser.parse_args()
    Path(args.dir).mkdir(parents=True, exist_ok=True)
    print(f"korch {korch.__version__} from {Path(korch.__file__).parent}")
    print(f"{'rows':>5} {'backend':<12} {'onnxruntime us':>15} {'plan(**arrays) us':>18} {'bench us':>9}")
    for rows in (int(r) for r in args.rows.split(",")):
        model = step_model(rows)
        for backend in args.backends.split(","):
            plan = korch.optimize(
                model, backends=backend, time_budget=20, cache=Path(args.dir) / "db.sqlite", progress=False
            )
            exe = plan.executable()
            feeds = plan.random_inputs(0)
            if hasattr(exe, "caller"):
                bench_call = exe.caller(feeds)
            else:  # (korch before run_arrays: the bench timed run_tensors)
                tensors = exe.feeds((), feeds)
                bench_call = lambda exe=exe, tensors=tensors: exe.run_tensors(tensors)  # noqa: E731
            systems = {
                "onnxruntime": _onnxruntime_peer(plan, feeds),
                "plan": lambda exe=exe, feeds=feeds: exe(**feeds),
                "bench": bench_call,
            }
            rounds = interleave(systems, args.rounds, 0.05, "cpu", round_pause_s=0.2)
            us = {k: 1e3 * statistics.median(ms for r in rs for ms in r) for k, rs in rounds.items()}
            row = f"{us['onnxruntime']:>15.1f} {us['plan']:>18.1f} {us['bench']:>9.1f}"
            print(f"{rows:>5} {backend:<12} {row}")


if __name__ == "__main__":
    main()
