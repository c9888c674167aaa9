"""What a plan's call does to the C heap (24 MiB allocated in four arrays, then freed), and the page
faults per call that the kernel counted (getrusage): run as a script after building a plan's
executable or timing a rewrite, and as a job of korch's profiling workers (tests/plan/test_heap.py)."""

import resource
import sys

import numpy as np
from helpers import onnx_model
from onnx import TensorProto, helper

import korch
from korch.orchestrate.solver import Choice, Solution
from korch.plan.plan import build_plan
from korch.profile.rewrite_timing import time_rewrite
from korch.search.candidates import make_candidate


def numpy_call() -> int:
    held = [np.ones(6 << 20, np.uint8) for _ in range(4)]
    return sum(int(h[-1]) for h in held)


def faults_per_call(calls: int = 10) -> float:
    numpy_call()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(calls):
        numpy_call()
    return (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / calls


def faults_job(job: dict) -> dict:
    return {"status": "ok", "faults": faults_per_call()}


def relu_graph():
    io = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [2, 3]) for n in ("x", "y")]
    return korch.fission(
        onnx_model(helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g", io[:1], io[1:]))
    ).graph


def after_executable() -> float:
    graph = relu_graph()
    build_plan(graph, Solution([Choice(make_candidate(graph, [0]), "eager", 1.0)]), "cpu").executable()
    return faults_per_call()


def after_rewrite_timing() -> float:
    graph = relu_graph()
    time_rewrite(graph, graph, "cpu", rounds=1)
    return faults_per_call()


if __name__ == "__main__":
    print({"executable": after_executable, "rewrite": after_rewrite_timing}[sys.argv[1]]())
