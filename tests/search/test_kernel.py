"""korch.search.kernel: a candidate cut out of its graph as a standalone graph computes what the
candidate's primitives compute inside the whole graph."""

from pathlib import Path

import numpy as np

import korch
from korch.ir import reference
from korch.ir.graph import verify
from korch.measure import check
from korch.search.candidates import CandidateOptions, enumerate_candidates
from korch.search.kernel import kernel_spec

EXAMPLE = Path(__file__).parents[2] / "examples" / "tiny_segformer.onnx"


def test_every_candidate_cuts_out_as_a_graph_that_computes_its_values():
    """Oracle: the reference executor on the whole graph, every value kept. Every candidate's
    kernel graph is well formed (types agree with every shape rule: kernel_spec does not check
    this itself, it runs for every candidate of a model) and, for one in 25, computes the same
    outputs from the whole graph's values of its inputs."""
    graph = korch.fission(EXAMPLE).graph
    found = enumerate_candidates(graph, CandidateOptions(max_size=6))
    wanted = [*graph.inputs, *graph.constants, *(v for n in graph.nodes for v in n.outputs)]
    everything = reference.evaluate(graph, check.random_inputs(graph, 0), wanted)
    assert len(found.candidates) > 500
    for i, cand in enumerate(found.candidates):
        spec = kernel_spec(graph, cand)
        verify(spec.graph)
        assert len(spec.inputs) == len(spec.graph.inputs) and spec.outputs == cand.outputs
        if i % 25:
            continue
        got = reference.run(spec.graph, {k: everything[v] for k, v in zip(spec.graph.inputs, spec.inputs)})
        for name, v in zip(spec.graph.output_names, spec.outputs):
            np.testing.assert_array_equal(got[name], everything[v])
