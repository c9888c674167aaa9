"""The graph rewrites (korch.rewrite): the rewritten graph computes what ONNX Runtime computes on the
source model (and what the numpy reference computes on the unrewritten graph), with fewer FLOPs."""

import io
from contextlib import closing

import numpy as np
import onnx
import pytest
import torch
import torch.nn.functional as F

import korch
from korch.cli import explain
from korch.ir import reference
from korch.ir.graph import GraphBuilder
from korch.ir.prims import Prim, TensorType
from korch.ir.work import node_flops
from korch.measure import check
from korch.pipeline import OptimizeOptions, optimize
from korch.profile import rewrite_timing
from korch.profile.database import ProfileDB
from korch.profile.rewrite_timing import RewriteTimer
from korch.rewrite import fold_linear_maps, narrow, rewrite


def always_faster(before, after):
    return 10.0, 5.0  # ms before and after a rewrite: well under FASTER


def never_faster(before, after):
    return 10.0, 9.0


def linear_flops(graph):
    """FLOPs of the matmuls and convolutions (the work the rewrite is about)."""
    return sum(node_flops(n, graph.types) for n in graph.nodes)


def fission_of(module, *args):
    torch.manual_seed(0)
    buffer = io.BytesIO()
    with torch.no_grad():
        torch.onnx.export(module.eval(), args, buffer, dynamo=False, opset_version=17)
    return korch.fission(onnx.load_from_string(buffer.getvalue()))


def folded(result):
    """The rewritten graph (every rewrite), checked against ONNX Runtime on the source model."""
    graph, notes = rewrite(result.graph)
    inputs = check.random_inputs(result.graph, 0)
    want = check.onnxruntime_outputs(result.model, inputs)
    assert check.compare_outputs(reference.run(graph, inputs), want) <= 1e-5
    return graph, notes


class Decoder(torch.nn.Module):
    """Segformer's decode head in miniature: per-scale linear layers, bilinear upsampling to the
    largest scale, concatenation and a 1x1 convolution."""

    def __init__(self, dims=(8, 16, 24), width=12):
        super().__init__()
        torch.manual_seed(0)
        self.mlps = torch.nn.ModuleList(torch.nn.Linear(d, width) for d in dims)
        self.fuse = torch.nn.Conv2d(width * len(dims), width, 1, bias=False)

    def forward(self, *feats):
        size = feats[0].shape[2:]
        ups = []
        for f, mlp in zip(feats, self.mlps):
            b, _, h, w = f.shape
            y = mlp(f.flatten(2).transpose(1, 2)).transpose(1, 2).reshape(b, -1, h, w)
            if (h, w) != tuple(size):
                y = F.interpolate(y, size=size, mode="bilinear", align_corners=False)
            ups.append(y)
        return torch.relu(self.fuse(torch.cat(ups[::-1], 1)))


def test_segformer_decoder_convolution_folds_into_the_linear_layers():
    feats = (torch.randn(1, 8, 8, 8), torch.randn(1, 16, 4, 4), torch.randn(1, 24, 2, 2))
    result = fission_of(Decoder(), *feats)
    graph, notes = folded(result)
    (fold,) = [n for n in notes if "mix folded" in n]
    assert "36->12" in fold
    assert not any(n.prim in (Prim.CONV, Prim.CONCAT) for n in graph.nodes)
    assert sum(n.prim is Prim.MATMUL for n in graph.nodes) == 3  # the linear layers, weights folded
    assert linear_flops(graph) < 0.3 * linear_flops(result.graph)


def test_the_readme_example_keeps_its_fold():
    """The README's example (examples/segformer_head.onnx) is there because a rewrite decides its
    plan: its fuse convolution folds into the four linear layers, the values unchanged."""
    from pathlib import Path

    example = Path(__file__).parents[2] / "examples" / "segformer_head.onnx"
    result = korch.fission(str(example))
    graph, notes = folded(result)
    (fold,) = [n for n in notes if "mix folded" in n]
    assert "512->128" in fold
    assert linear_flops(graph) < 0.2 * linear_flops(result.graph)


class UpsampleConcat(torch.nn.Module):
    """A YOLO neck's route: an upsampled branch concatenated with a lateral one, then a 1x1 conv."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.conv = torch.nn.Conv2d(32, 16, 1)

    def forward(self, small, large):
        up = F.interpolate(torch.relu(small), scale_factor=2, mode="nearest")
        return self.conv(torch.cat([up, torch.sigmoid(large)], 1))


def test_a_mix_after_an_upsample_moves_before_it():
    result = fission_of(UpsampleConcat(), torch.randn(1, 16, 4, 4), torch.randn(1, 16, 8, 8))
    graph, notes = folded(result)
    assert len(notes) == 1
    convs = [n for n in graph.nodes if n.prim is Prim.CONV]
    assert sorted(graph.types[n.inputs[0]].shape[2:] for n in convs) == [(4, 4), (8, 8)]
    assert linear_flops(graph) < 0.7 * linear_flops(result.graph)


def test_a_1x1_convolution_folds_into_the_convolution_before_it():
    module = torch.nn.Sequential(torch.nn.Conv2d(16, 32, 3, padding=1), torch.nn.Conv2d(32, 4, 1))
    result = fission_of(module, torch.randn(1, 16, 6, 6))
    graph, notes = folded(result)
    assert len(notes) == 1
    (conv,) = [n for n in graph.nodes if n.prim is Prim.CONV]
    assert graph.types[conv.inputs[1]].shape == (4, 16, 3, 3)


def test_two_linear_layers_without_an_activation_become_one():
    module = torch.nn.Sequential(torch.nn.Linear(8, 64), torch.nn.Linear(64, 8))
    result = fission_of(module, torch.randn(3, 5, 8))
    graph, notes = folded(result)
    assert len(notes) == 1
    (mm,) = [n for n in graph.nodes if n.prim is Prim.MATMUL]
    assert graph.types[mm.inputs[1]].shape == (8, 8)


class Attention(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.ln, self.fc = torch.nn.LayerNorm(8), torch.nn.Linear(8, 4)

    def forward(self, x):
        return self.fc(self.ln(x))


class Branching(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.a, self.b = torch.nn.Conv2d(16, 32, 3, padding=1), torch.nn.Conv2d(32, 4, 1)

    def forward(self, x):
        y = self.a(x)
        return self.b(y), y.mean()


@pytest.mark.parametrize(
    "module, shape",
    [
        (torch.nn.Sequential(torch.nn.Linear(8, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8)), (3, 8)),
        (Attention(), (2, 5, 8)),  # LayerNorm's scale varies along the mixed axis
        (Branching(), (1, 16, 6, 6)),  # the first conv's output is read elsewhere too
        (torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.Linear(4, 8)), (3, 8)),  # no saving
    ],
)
def test_no_fold_where_it_would_be_wrong_or_would_not_pay(module, shape):
    result = fission_of(module, torch.randn(*shape))
    graph, notes = folded(result)
    assert notes == [] and graph == result.graph


def test_the_map_moves_through_layout_padding_gathers_and_affine_nodes():
    """Most rules of the region at once (not WINDOW, nor landing in a matmul or convolution), on a
    primitive graph; the oracle is the numpy reference on the graph as built."""
    rng = np.random.default_rng(0)
    b = GraphBuilder()
    x = b.input("x", TensorType((2, 5, 8), "float32"))
    y = b.emit(Prim.GATHER, [x, b.const(rng.integers(0, 5, 20))], axis=1)[0]  # [2, 20, 8]
    y = b.emit(
        Prim.MUL,
        [y, b.emit(Prim.BROADCAST, [b.const(rng.random((1, 20, 1)).astype("float32"))], shape=(2, 20, 8))[0]],
    )[0]
    y = b.emit(Prim.PAD, [y], pads=(0, 2, 0, 0, 2, 0), mode="reflect", value=0.0)[0]  # [2, 24, 8]
    y = b.emit(Prim.SLICE, [y], starts=(0, 1, 0), steps=(1, 2, 1), sizes=(2, 12, 8))[0]
    y = b.emit(Prim.CONCAT, [y, y], axis=1)[0]  # [2, 24, 8]
    y = b.emit(Prim.BROADCAST, [y], shape=(3, 2, 24, 8))[0]
    y = b.emit(Prim.TRANSPOSE, [y], perm=(1, 0, 3, 2))[0]  # [2, 3, 8, 24]
    y = b.emit(Prim.SUB, [y, b.emit(Prim.NEG, [y])[0]])[0]
    y = b.emit(Prim.REDUCE_SUM, [y], axes=(1,))[0]  # [2, 1, 8, 24]
    y = b.emit(Prim.RESHAPE, [y], shape=(2, 8, 24))[0]
    y = b.emit(Prim.TRANSPOSE, [y], perm=(0, 2, 1))[0]  # [2, 24, 8]
    bias = b.emit(Prim.BROADCAST, [b.const(rng.random(8).astype("float32"))], shape=(2, 24, 8))[0]
    y = b.emit(Prim.ADD, [bias, y])[0]
    out = b.emit(Prim.MATMUL, [y, b.const(rng.standard_normal((8, 3)).astype("float32"))])[0]
    graph = b.build([out], ["out"])
    rewritten, notes = fold_linear_maps(graph)
    assert len(notes) == 1
    (mm,) = [n for n in rewritten.nodes if n.prim is Prim.MATMUL]
    assert mm.inputs[0] == "x"  # mixed before the gather: 2x5 rows instead of 2x24
    inputs = check.random_inputs(graph, 0)
    got, want = reference.run(rewritten, inputs)["out"], reference.run(graph, inputs)["out"]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.e2e
def test_optimize_folds_and_the_plan_matches_onnxruntime(tmp_path):
    feats = (torch.randn(1, 8, 8, 8), torch.randn(1, 16, 4, 4), torch.randn(1, 24, 2, 2))
    path = tmp_path / "decoder.onnx"
    with torch.no_grad():
        torch.onnx.export(Decoder().eval(), feats, str(path), dynamo=False, opset_version=17)
    fast = dict(
        backends=("onnxruntime", "vendor"), min_time=0.002, progress=False, cache=tmp_path / "p.sqlite"
    )
    plan = optimize(path, options=OptimizeOptions(**fast))
    assert sum("mix folded" in n for n in plan.meta.rewrites) == 1
    report = explain.report(plan)  # korch explain lists what was rewritten
    assert report["rewrites"] == plan.meta.rewrites and "rewrite: Conv" in explain.text(report)
    assert plan.verify() <= 1e-4
    assert not any(n.prim is Prim.CONV for n in plan.graph.nodes)
    unfolded = optimize(path, options=OptimizeOptions(rewrite=False, **fast))
    assert unfolded.meta.rewrites == [] and any(n.prim is Prim.CONV for n in unfolded.graph.nodes)


def same_values(graph, rewrite_one=fold_linear_maps):
    """The rewritten graph and its notes, its outputs checked against the graph as built."""
    rewritten, notes = rewrite_one(graph)
    inputs = check.random_inputs(graph, 0)
    want, got = reference.run(graph, inputs), reference.run(rewritten, inputs)
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-4, atol=1e-5)
    return rewritten, notes


def f32(rng, *shape):
    return rng.standard_normal(shape).astype("float32")


@pytest.mark.parametrize("c_out", [16, 1])
def test_a_broadcast_constant_read_by_an_add_and_a_transpose(c_out):
    """The constant stays a constant in the add (mixed once, at build time) even though the
    transpose pulls the same broadcast into the region as a value."""
    rng = np.random.default_rng(1)
    b = GraphBuilder()
    z = b.input("z", TensorType((16, 64), "float32"))
    u = b.emit(Prim.MATMUL, [z, b.const(f32(rng, 64, 16))])[0]
    bc = b.emit(Prim.BROADCAST, [b.const(f32(rng, 1, 16))], shape=(16, 16))[0]
    s = b.emit(Prim.ADD, [b.emit(Prim.ADD, [u, bc])[0], b.emit(Prim.TRANSPOSE, [bc], perm=(1, 0))[0]])[0]
    x = b.emit(Prim.BROADCAST, [s], shape=(8, 16, 16))[0]
    out = b.emit(Prim.MATMUL, [x, b.const(f32(rng, 16, c_out))])[0]
    same_values(b.build([out], ["out"]))


@pytest.mark.parametrize("second", ["same", "negated"])
def test_a_concatenation_reading_one_producer_twice_is_not_split(second):
    rng = np.random.default_rng(2)
    b = GraphBuilder()
    z = b.input("z", TensorType((4, 64), "float32"))
    a = b.emit(Prim.MATMUL, [z, b.const(f32(rng, 64, 8))])[0]
    other = a if second == "same" else b.emit(Prim.NEG, [a])[0]
    e = b.emit(Prim.CONCAT, [a, other], axis=1)[0]
    out = b.emit(Prim.MATMUL, [e, b.const(f32(rng, 16, 8))])[0]
    graph = b.build([out], ["out"])
    rewritten, notes = same_values(graph)
    assert notes == [] and linear_flops(rewritten) <= linear_flops(graph)


def test_empty_tensors_are_left_alone():
    rng = np.random.default_rng(3)
    b = GraphBuilder()
    x = b.input("x", TensorType((4, 0), "float32"))
    y = b.input("y", TensorType((4, 8), "float32"))
    empty = b.emit(Prim.MATMUL, [x, b.const(np.zeros((0, 8), "float32"))])[0]
    e = b.emit(Prim.CONCAT, [x, b.emit(Prim.NEG, [y])[0]], axis=1)[0]
    out = b.emit(Prim.MATMUL, [e, b.const(f32(rng, 8, 8))])[0]
    same_values(b.build([empty, out], ["empty", "out"]))


@pytest.mark.parametrize("varying", [False, True])
def test_constant_minus_value_and_scales(varying):
    """SUB(constant, value) keeps its order; a scale that varies along the mixed axis stops the map."""
    rng = np.random.default_rng(4)
    b = GraphBuilder()
    x = b.input("x", TensorType((3, 8), "float32"))
    y = b.emit(Prim.GATHER, [x, b.const(rng.integers(0, 3, 24))], axis=0)[0]  # [24, 8]
    bias = b.emit(Prim.BROADCAST, [b.const(f32(rng, 8))], shape=(24, 8))[0]
    y = b.emit(Prim.SUB, [bias, y])[0]
    scale = f32(rng, 24, 8 if varying else 1)
    y = b.emit(Prim.MUL, [y, b.emit(Prim.BROADCAST, [b.const(scale)], shape=(24, 8))[0]])[0]
    out = b.emit(Prim.MATMUL, [y, b.const(f32(rng, 8, 4))])[0]
    rewritten, notes = same_values(b.build([out], ["out"]))
    assert len(notes) == (0 if varying else 1)


class UpsampleConv(torch.nn.Module):
    """A resize-convolution: nearest upsampling, padding, a stride-1 convolution."""

    def __init__(self, scale=2, pad=1, mode="reflect", kernel=3, dims=2, upsample="nearest", tap=False):
        super().__init__()
        torch.manual_seed(0)
        conv = (torch.nn.Conv1d, torch.nn.Conv2d)[dims - 1]
        own_pad = pad if mode == "zeros" else 0
        self.conv = conv(6, 5, kernel, padding=own_pad)
        self.scale, self.pad, self.mode, self.upsample, self.tap = scale, pad, mode, upsample, tap

    def forward(self, x):
        up = F.interpolate(x, scale_factor=self.scale, mode=self.upsample)
        widths = self.pad if isinstance(self.pad, tuple) else (self.pad,) * 2 * (x.dim() - 2)
        y = up if self.mode == "zeros" else F.pad(up, widths, mode=self.mode)
        out = self.conv(y)
        return (out, up.sum()) if self.tap else out


def conv_kernels(graph):
    return sorted(graph.types[n.inputs[1]].shape[2:] for n in graph.nodes if n.prim is Prim.CONV)


@pytest.mark.parametrize(
    "kwargs, shape, kernels",
    [
        (dict(), (1, 6, 5, 4), [(2, 2)] * 4),  # Candy's layers
        (dict(mode="replicate", pad=2, kernel=5), (1, 6, 4, 4), [(3, 3)] * 4),
        (dict(mode="zeros", scale=(2, 3)), (2, 6, 3, 4), [(2, 1)] * 2 + [(2, 2)] * 4),
        (dict(dims=1, scale=4, kernel=5, pad=2, mode="zeros"), (1, 6, 7), [(2,)] * 4),
    ],
)
def test_a_convolution_over_a_nearest_upsampling_is_split_into_phases(kwargs, shape, kernels):
    result = fission_of(UpsampleConv(**kwargs), torch.randn(*shape))
    graph, notes = folded(result)
    assert len(notes) == 1 and "phase convolutions" in notes[0]
    assert conv_kernels(graph) == kernels
    assert linear_flops(graph) < 0.8 * linear_flops(result.graph)


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(pad=2),  # a reflection as wide as the scale reaches past the repeated pixel
        dict(upsample="bilinear"),
        dict(tap=True),  # the upsampled image is read elsewhere too
        dict(kernel=1, pad=0, mode="zeros"),  # nothing to gain from phases
    ],
)
def test_no_phase_split_where_it_would_be_wrong_or_would_not_pay(kwargs):
    result = fission_of(UpsampleConv(**kwargs), torch.randn(1, 6, 5, 4))
    graph, notes = folded(result)
    assert not any("phase" in n for n in notes)
    assert len(conv_kernels(graph)) == 1


def narrow_conv_graph(kernel, pads, size, seed=5):
    rng = np.random.default_rng(seed)
    b = GraphBuilder()
    x = b.input("x", TensorType((2, 5, size, size + 2), "float32"))
    w = b.const(f32(rng, 3, 5, kernel, kernel))
    y = b.emit(Prim.CONV, [x, w], strides=(1, 1), pads=pads, dilations=(1, 1), group=1)[0]
    return b.build([y], ["y"])


@pytest.mark.parametrize(
    "kernel, pads, size",
    [(9, (4, 4, 4, 4), 12), (3, (0, 0, 0, 0), 10), (4, (1, 2, 2, 1), 10), (5, (2, 1, 2, 1), 8)],
)
def test_a_narrow_convolution_folded_into_channels_computes_the_same(kernel, pads, size):
    graph = narrow_conv_graph(kernel, pads, size)
    rewritten, notes = narrow.widen_narrow_convs(graph, always_faster)
    assert len(notes) == 1
    assert conv_kernels(rewritten) == [(kernel // 2 + 1,) * 2]
    (conv,) = [n for n in rewritten.nodes if n.prim is Prim.CONV]
    assert rewritten.types[conv.inputs[1]].shape[:2] == (12, 20)
    inputs = check.random_inputs(graph, 0)
    np.testing.assert_allclose(
        reference.run(rewritten, inputs)["y"], reference.run(graph, inputs)["y"], rtol=1e-4, atol=1e-4
    )


def test_a_narrow_convolution_stays_unless_folding_was_measured_faster():
    graph = narrow_conv_graph(9, (4, 4, 4, 4), 12)
    # real timings: either way, same values
    measured, notes = narrow.widen_narrow_convs(graph, RewriteTimer("cpu"))
    assert (measured == graph) == (notes == [])
    inputs = check.random_inputs(graph, 0)
    want = reference.run(graph, inputs)["y"]
    np.testing.assert_allclose(reference.run(measured, inputs)["y"], want, rtol=1e-4, atol=1e-4)
    assert narrow.widen_narrow_convs(graph, never_faster) == (graph, [])


def test_a_measured_decision_is_kept_in_the_profile_database(tmp_path, monkeypatch):
    """A later optimize on the same device decides the same without timing again; a timing that
    failed is not kept; another structure is timed anew."""
    timed = []

    def fake_measure(before, after, device):
        timed.append(len(before.nodes))
        return (10.0, 5.0) if len(timed) == 1 else (1.0, float("inf"))

    monkeypatch.setattr(rewrite_timing, "time_rewrite", fake_measure)
    graph = narrow_conv_graph(9, (4, 4, 4, 4), 12)
    path = tmp_path / "profiles.sqlite"
    with closing(ProfileDB(path)) as db:
        first = narrow.widen_narrow_convs(graph, RewriteTimer("cpu", db))
    assert len(first[1]) == 1 and len(timed) == 1
    with closing(ProfileDB(path)) as db:  # a later run, other weights of the same shape
        same_shape = narrow_conv_graph(9, (4, 4, 4, 4), 12, seed=9)
        again = narrow.widen_narrow_convs(same_shape, RewriteTimer("cpu", db))
        assert len(timed) == 1 and again[1] == first[1]
        other = narrow_conv_graph(9, (4, 4, 4, 4), 16)
        assert narrow.widen_narrow_convs(other, RewriteTimer("cpu", db)) == (other, [])  # timing failed
        assert narrow.widen_narrow_convs(other, RewriteTimer("cpu", db)) == (other, [])
    assert len(timed) == 3


def test_a_one_channel_convolution_is_folded_once():
    """Folded, it has 4 output channels and a 5x5 kernel: narrow again, but not folded again."""
    rng = np.random.default_rng(6)
    b = GraphBuilder()
    x = b.input("x", TensorType((1, 2, 16, 16), "float32"))
    y = b.emit(
        Prim.CONV,
        [x, b.const(f32(rng, 1, 2, 9, 9))],
        strides=(1, 1),
        pads=(4,) * 4,
        dilations=(1, 1),
        group=1,
    )
    graph = b.build(y, ["y"])
    rewritten, notes = same_values_measured(graph, always_faster)
    assert len(notes) == 1


def same_values_measured(graph, timer):
    rewritten, notes = rewrite(graph, timer)
    inputs = check.random_inputs(graph, 0)
    np.testing.assert_allclose(
        reference.run(rewritten, inputs)["y"], reference.run(graph, inputs)["y"], rtol=1e-4, atol=1e-4
    )
    return rewritten, notes


def test_a_split_is_kept_only_where_it_was_measured_faster():
    result = fission_of(UpsampleConv(), torch.randn(1, 6, 5, 4))
    assert rewrite(result.graph, never_faster)[1] == []
    graph, notes = rewrite(result.graph, always_faster)
    assert len(notes) == 1 and "10.00 -> 5.00 ms measured" in notes[0]
    assert conv_kernels(graph) == [(2, 2)] * 4


@pytest.mark.parametrize(
    "kwargs, shape, kernels",
    [
        (dict(mode="constant", kernel=2, pad=(0, 1, 0, 1)), (1, 6, 3, 4), [(1, 1), (1, 2), (2, 1), (2, 2)]),
        (dict(mode="replicate", kernel=4, pad=(1, 2, 1, 2)), (2, 6, 4, 4), [(2, 2), (2, 3), (3, 2), (3, 3)]),
    ],
)
def test_even_kernels_are_split_into_phases_too(kwargs, shape, kernels):
    result = fission_of(UpsampleConv(**kwargs), torch.randn(*shape))
    graph, notes = folded(result)
    assert len(notes) == 1 and conv_kernels(graph) == kernels


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a device that fails")
def test_a_rewrite_that_cannot_be_timed_is_never_faster():
    graph = narrow_conv_graph(9, (4, 4, 4, 4), 12)
    assert rewrite_timing.time_rewrite(graph, narrow._apply(graph, 0)[0], "cuda") == (1.0, float("inf"))
    assert narrow.widen_narrow_convs(graph, RewriteTimer("cuda")) == (graph, [])
