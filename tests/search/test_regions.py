"""benchmarks/regions_vs_ort.py cuts each partition's original ONNX nodes out of the model; the
regions must compute exactly the values of the primitive graph they stand for."""

import onnxruntime as ort
from helpers import ROOT, load_script

import korch
from korch.ir import reference
from korch.measure import check
from korch.search.candidates import CandidateOptions, enumerate_candidates


def _script():
    return load_script("benchmarks/regions_vs_ort.py")


def test_every_region_computes_its_partitions_values():
    fission = korch.fission(ROOT / "examples" / "tiny_segformer.onnx")
    graph = fission.graph
    found = enumerate_candidates(graph, CandidateOptions(max_size=2))
    cut = _script().regions(fission, found.partitions)
    assert set(cut) == {p.index for p in found.partitions}
    extracted = {i: r for i, r in cut.items() if not isinstance(r, str)}
    assert len(extracted) >= len(found.partitions) // 2
    wanted = {v for _, ins, outs in extracted.values() for v in ins + outs}
    values = reference.evaluate(graph, check.random_inputs(graph, 0), wanted)
    for sub, ins, outs in extracted.values():
        sess = ort.InferenceSession(sub.SerializeToString(), providers=["CPUExecutionProvider"])
        got = sess.run(None, {fission.onnx_names[v]: values[v] for v in ins})
        assert [o.name for o in sess.get_outputs()] == [fission.onnx_names[v] for v in outs]
        for g, v in zip(got, outs):
            assert check.rel_err(g, values[v]) <= 1e-4


def test_onnx_names_map_values_back_to_the_model():
    fission = korch.fission(ROOT / "examples" / "tiny_segformer.onnx")
    model = fission.model.graph
    tensors = {o for n in model.node for o in n.output} | {t.name for t in [*model.input, *model.initializer]}
    named = [v for v in fission.graph.types if v in fission.onnx_names]
    assert named and all(fission.onnx_names[v] in tensors for v in named)
    assert fission.onnx_names[fission.graph.outputs[0]] == fission.model.graph.output[0].name
