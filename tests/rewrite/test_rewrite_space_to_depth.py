"""A convolution over a space-to-depth becomes one strided convolution: checked against ONNX
Runtime on the source model, and left alone wherever it would be wrong or was not faster."""

import pytest
import torch
from test_rewrite import always_faster, conv_kernels, fission_of, never_faster

from korch.ir import reference
from korch.ir.prims import Prim
from korch.measure import check
from korch.profile.rewrite_timing import RewriteTimer
from korch.rewrite import fold_space_to_depth, rewrite


class Focus(torch.nn.Module):
    """YOLOX's stem: four strided views of the image concatenated along channels, then a conv."""

    def __init__(
        self,
        order=((0, 0), (1, 0), (0, 1), (1, 1)),
        step=(2, 2),
        kernel=3,
        pad=1,
        groups=1,
        tap=False,
        other=False,
        rows=None,
    ):
        super().__init__()
        torch.manual_seed(0)
        self.order, self.step, self.tap, self.other, self.rows = order, step, tap, other, rows
        self.conv = torch.nn.Conv2d(3 * len(order), 8, kernel, padding=pad, groups=groups)

    def forward(self, x):
        sh, sw = self.step
        pieces = [x[..., a : self.rows : sh, b::sw] for a, b in self.order]
        if self.other:  # one piece from another tensor
            pieces[-1] = (x * 2)[..., self.order[-1][0] :: sh, self.order[-1][1] :: sw]
        cat = torch.cat(pieces, 1)
        y = torch.nn.functional.silu(self.conv(cat))
        return (y, cat.sum()) if self.tap else y


def checked(result, timer):
    """The rewritten graph and its notes, checked against ONNX Runtime on the source model."""
    graph, notes = fold_space_to_depth(result.graph, timer)
    inputs = check.random_inputs(result.graph, 0)
    want = check.onnxruntime_outputs(result.model, inputs)
    assert check.compare_outputs(reference.run(graph, inputs), want) <= 1e-5
    return graph, notes


def strides(graph):
    return [n.a["strides"] for n in graph.nodes if n.prim is Prim.CONV]


@pytest.mark.parametrize(
    "kwargs, shape, kernel, stride",
    [
        (dict(), (1, 3, 8, 12), (6, 6), (2, 2)),  # YOLOX's stem
        (dict(order=((1, 1), (0, 0), (1, 0), (0, 1))), (2, 3, 6, 4), (6, 6), (2, 2)),  # pieces in any order
        (dict(kernel=1, pad=0), (1, 3, 4, 4), (2, 2), (2, 2)),
        (dict(step=(3, 1), order=((2, 0), (0, 0), (1, 0)), pad=(2, 1)), (1, 3, 9, 5), (9, 3), (3, 1)),
    ],
)
def test_a_convolution_over_a_space_to_depth_becomes_strided(kwargs, shape, kernel, stride):
    result = fission_of(Focus(**kwargs), torch.randn(*shape))
    graph, notes = checked(result, always_faster)
    assert len(notes) == 1 and "space-to-depth folded" in notes[0]
    assert conv_kernels(graph) == [kernel] and strides(graph) == [stride]
    assert not any(n.prim in (Prim.SLICE, Prim.CONCAT) for n in graph.nodes)


@pytest.mark.parametrize(
    "kwargs, shape",
    [
        (dict(order=((0, 0), (1, 0), (0, 1))), (1, 3, 8, 8)),  # a phase missing
        (dict(order=((0, 0), (1, 0), (0, 1), (0, 1))), (1, 3, 8, 8)),  # a phase twice
        (dict(rows=8), (1, 3, 9, 8)),  # the last row is in no piece
        (dict(other=True), (1, 3, 8, 8)),
        (dict(tap=True), (1, 3, 8, 8)),  # the concatenation is read elsewhere too
        (dict(groups=4), (1, 3, 8, 8)),
    ],
)
def test_no_fold_where_it_would_be_wrong(kwargs, shape):
    result = fission_of(Focus(**kwargs), torch.randn(*shape))
    graph, notes = checked(result, always_faster)
    assert notes == [] and graph == result.graph


def test_the_fold_is_kept_only_where_it_was_measured_faster():
    result = fission_of(Focus(), torch.randn(1, 3, 8, 8))
    assert fold_space_to_depth(result.graph, never_faster) == (result.graph, [])
    graph, notes = rewrite(result.graph, always_faster)
    assert notes == [
        "Conv:/conv/Conv: 2x2 space-to-depth folded into a strided convolution (10.00 -> 5.00 ms measured)"
    ]
    measured, notes = rewrite(result.graph, RewriteTimer("cpu"))  # real timings: either way, same values
    inputs = check.random_inputs(result.graph, 0)
    want = reference.run(result.graph, inputs)
    assert check.compare_outputs(reference.run(measured, inputs), want) <= 1e-5
    assert rewrite(result.graph)[1] == []  # without a timer: equal FLOPs, nothing to go by
