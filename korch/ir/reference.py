"""The reference executor: runs any primitive graph with numpy; the oracle for every check.

Its BLAS calls (matmuls, convolutions) run in one thread. A BLAS library's worker threads spin for
a while after each call; a kernel timed next in the same process (the profiler's timing worker
checks a kernel, then times it) would share the cores with them, and an OpenMP kernel's every
barrier would wait for its displaced threads."""

from __future__ import annotations

import functools
from collections.abc import Mapping

import numpy as np
from threadpoolctl import ThreadpoolController

from korch.errors import KorchError
from korch.ir.graph import Graph


def mismatch(missing: list[str], unexpected: list[str]) -> str:
    """What differs between the inputs given and those wanted, naming only what there is."""
    parts = [f"missing {missing}"] * bool(missing) + [f"unexpected {unexpected}"] * bool(unexpected)
    return ", ".join(parts)


def check_inputs(graph: Graph, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Match feeds to the graph's inputs by name, with exact shapes and dtypes."""
    missing = [n for n in graph.inputs if n not in inputs]
    extra = [n for n in inputs if n not in graph.inputs]
    if missing or extra:
        raise KorchError(f"inputs do not match the graph: {mismatch(missing, extra)}")
    feeds = {}
    for name in graph.inputs:
        array = np.asarray(inputs[name])
        want = graph.types[name]
        if tuple(array.shape) != want.shape or str(array.dtype) != want.dtype:
            raise KorchError(f"input {name!r} is {array.dtype}{list(array.shape)}, the graph wants {want}")
        feeds[name] = array
    return feeds


def evaluate(graph: Graph, inputs: Mapping[str, np.ndarray], wanted, step=None) -> dict[str, np.ndarray]:
    """Execute node by node, freeing each intermediate after its last use unless it is wanted;
    returns the wanted values (inputs, constants or computed) by value name. `step(node, arrays)`
    may replace the numpy reference for speed where the result is not used as an oracle."""
    env: dict[str, np.ndarray] = dict(graph.constants)
    env.update(check_inputs(graph, inputs))
    last_use: dict[str, int] = {}
    for i, node in enumerate(graph.nodes):
        for v in node.inputs:
            last_use[v] = i
    keep = set(wanted) | set(graph.constants) | set(graph.inputs)
    with np.errstate(all="ignore"), _blas().limit(limits=1, user_api="blas"):
        for i, node in enumerate(graph.nodes):
            args = [env[v] for v in node.inputs]
            results = step(node, args) if step else node.prim.ref(args, node.a)
            for v, r in zip(node.outputs, results):
                env[v] = np.asarray(r, dtype=graph.types[v].dtype)
            for v in set(node.inputs):
                if last_use[v] == i and v not in keep:
                    del env[v]
    return {v: np.asarray(env[v]) for v in wanted if v in env}


@functools.cache
def _blas() -> ThreadpoolController:
    """The thread pools of the libraries loaded (numpy's BLAS among them), found once."""
    return ThreadpoolController()


def run(graph: Graph, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Execute the graph; outputs keyed by output name."""
    values = evaluate(graph, inputs, graph.outputs)
    return {name: values[v] for v, name in zip(graph.outputs, graph.output_names)}
