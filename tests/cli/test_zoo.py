"""Every zoo model fissions into primitives only and matches ONNX Runtime within 1e-4."""

import pytest

import korch
from korch.cli import zoo

pytestmark = pytest.mark.e2e


@pytest.mark.e2e
@pytest.mark.parametrize("name", list(zoo.MODELS))
def test_zoo_model_fission_matches_onnxruntime(name, zoo_dir):
    path = zoo.build(name, zoo_dir)
    result = korch.fission(path)
    assert result.opaque_ops == []
    kinds = result.graph.by_kind()
    assert kinds["linear"] > 0 and kinds["elementwise"] > 0
    err = korch.check_fission(result, seed=0)
    assert err <= 1e-4, f"{name}: max relative error {err:.3g}"


def test_build_is_cached(zoo_dir):
    first = zoo.build("candy", zoo_dir)
    mtime = first.stat().st_mtime_ns
    assert zoo.build("candy", zoo_dir) == first
    assert first.stat().st_mtime_ns == mtime


@pytest.mark.parametrize("name", ["bert-base", "yolov4"])
def test_zoo_candidates(name, zoo_dir):
    import random

    from korch.search.candidates import enumerate_candidates, is_convex

    graph = korch.fission(zoo.build(name, zoo_dir)).graph
    found = enumerate_candidates(graph)
    covered = {i for c in found.candidates for i in c.nodes}
    assert covered == set(range(len(graph.nodes)))
    for c in random.Random(0).sample(found.candidates, 150):
        assert is_convex(graph, c.nodes)
    if name == "bert-base":  # twelve identical layers: about a twelfth of the candidates are unique
        assert len(found.candidates) / found.unique_keys > 8
