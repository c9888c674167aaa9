"""Transposes pulled toward the inputs or sunk past slices (korch.rewrite.transpose): the rewritten
graph computes what ONNX Runtime computes on the source model (or what the numpy reference
computes on the graph as built) and moves fewer elements through transposes."""

import numpy as np
import pytest
import torch
from test_rewrite import f32, fission_of, same_values

from korch.ir import reference
from korch.ir.graph import GraphBuilder
from korch.ir.prims import Prim, TensorType
from korch.measure import check
from korch.pipeline import OptimizeOptions, optimize
from korch.rewrite import pull_transposes, rewrite


def moved(graph):
    """Elements moved by transposes, counting none for a transpose that only matmuls read with
    its last two axes swapped (a matmul takes such an operand as it is)."""
    readers = graph.consumers()
    total = 0
    for n in graph.nodes:
        if n.prim is not Prim.TRANSPOSE:
            continue
        perm, rank = tuple(n.a["perm"]), len(n.a["perm"])
        swap = perm == (*range(rank - 2), rank - 1, rank - 2)
        mine = readers.get(n.outputs[0], [])
        if not (swap and mine and all(r.prim is Prim.MATMUL for r in mine)):
            total += graph.types[n.outputs[0]].numel
    return total


def transposes(graph):
    return sum(n.prim is Prim.TRANSPOSE for n in graph.nodes)


def pulled(graph):
    """The rewritten graph and its notes, its outputs checked against the graph as built, and
    no more elements moved."""
    rewritten, notes = same_values(graph, pull_transposes)
    assert moved(rewritten) <= moved(graph)
    return rewritten, notes


class LinearAttention(torch.nn.Module):
    """EfficientViT's ReLU linear attention (LiteMLA's relu_linear_att), as exported."""

    def __init__(self, dim=4, heads=3):
        super().__init__()
        torch.manual_seed(0)
        self.dim = dim
        self.qkv = torch.nn.Conv2d(heads * dim, 3 * heads * dim, 1)
        self.proj = torch.nn.Conv2d(heads * dim, heads * dim, 1)

    def forward(self, x):
        b, _, h, w = x.shape
        qkv = self.qkv(x).reshape(b, -1, 3 * self.dim, h * w).transpose(-1, -2)
        q, k, v = qkv[..., : self.dim], qkv[..., self.dim : 2 * self.dim], qkv[..., 2 * self.dim :]
        q, k = torch.relu(q), torch.relu(k)
        v = torch.nn.functional.pad(v, (0, 1), mode="constant", value=1.0)
        out = q @ (k.transpose(-1, -2) @ v)
        out = out[..., :-1] / (out[..., -1:] + 1e-15)
        return self.proj(out.transpose(-1, -2).reshape(b, -1, h, w))


def test_linear_attention_keeps_no_transpose_but_one_that_a_matmul_takes():
    result = fission_of(LinearAttention(), torch.randn(2, 12, 5, 7))
    assert transposes(result.graph) == 3 and moved(result.graph) > 0
    graph, notes = rewrite(result.graph)
    inputs = check.random_inputs(result.graph, 0)
    want = check.onnxruntime_outputs(result.model, inputs)
    assert check.compare_outputs(reference.run(graph, inputs), want) <= 1e-5
    assert moved(graph) == 0 and transposes(graph) == 1, notes
    assert any("transpose pulled" in n for n in notes)


@pytest.mark.e2e
def test_optimize_pulls_the_attention_transposes_and_the_plan_matches_onnxruntime(tmp_path):
    path = tmp_path / "attention.onnx"
    with torch.no_grad():
        torch.onnx.export(LinearAttention().eval(), torch.randn(1, 12, 5, 7), str(path), dynamo=False)
    options = OptimizeOptions(
        backends=("onnxruntime", "vendor"), min_time=0.002, progress=False, cache=tmp_path / "p.sqlite"
    )
    plan = optimize(path, options=options)
    assert any("transpose pulled" in n for n in plan.meta.rewrites)
    assert moved(plan.graph) == 0 and plan.verify() <= 1e-4


def builder(shape=(2, 3, 4)):
    b = GraphBuilder()
    return b, b.input("x", TensorType(shape, "float32"))


def t(b, v, perm):
    return b.emit(Prim.TRANSPOSE, [v], perm=perm)[0]


RNG = np.random.default_rng(1)

# each: x [2, 3, 4] -> transposed by (1, 2, 0) -> one primitive -> transposed back by (2, 0, 1)
THROUGH = {
    "elementwise with a scalar": lambda b, u: b.emit(Prim.MUL, [u, b.const(np.float32(3))])[0],
    "elementwise with a constant": lambda b, u: b.emit(Prim.ADD, [u, b.const(f32(RNG, 3, 4, 2))])[0],
    "unary": lambda b, u: b.emit(Prim.EXP, [u])[0],
    "slice": lambda b, u: b.emit(Prim.SLICE, [u], starts=(0, 1, 0), steps=(1, 2, 1), sizes=(2, 2, 2))[0],
    "pad": lambda b, u: b.emit(Prim.PAD, [u], pads=(0, 1, 0, 0, 0, 1), mode="reflect")[0],
    "reduce": lambda b, u: b.emit(Prim.REDUCE_MAX, [u], axes=(1,))[0],
    "broadcast": lambda b, u: b.emit(
        Prim.BROADCAST, [b.emit(Prim.REDUCE_SUM, [u], axes=(2,))[0]], shape=(3, 4, 2)
    )[0],
    "concat": lambda b, u: b.emit(Prim.CONCAT, [u, b.emit(Prim.NEG, [u])[0]], axis=1)[0],
}


@pytest.mark.parametrize("through", THROUGH)
def test_a_transpose_and_its_inverse_cancel_through(through):
    b, x = builder()
    y = t(b, THROUGH[through](b, t(b, x, (1, 2, 0))), (2, 0, 1))
    graph, notes = pulled(b.build([y], ["y"]))
    assert transposes(graph) == 0 and notes


def test_a_transpose_of_a_matmul_swaps_its_operands():
    """T(A @ B) = T(B) @ T(A): the transposes already on the operands cancel; B broadcasts."""
    b, x = builder((2, 3, 4))
    w = b.input("w", TensorType((5, 3), "float32"))
    m = b.emit(Prim.MATMUL, [t(b, x, (0, 2, 1)), t(b, w, (1, 0))])[0]  # [2, 4, 5]
    graph, _ = pulled(b.build([t(b, m, (0, 2, 1))], ["y"]))
    assert transposes(graph) == 0
    (mm,) = [n for n in graph.nodes if n.prim is Prim.MATMUL]
    assert mm.inputs == ("w", "x")


def test_a_transpose_moves_to_the_smaller_tensor():
    """Only the reduced tensor is transposed, not the one it was reduced from."""
    b, x = builder((2, 30, 40))
    y = t(b, b.emit(Prim.REDUCE_SUM, [b.emit(Prim.EXP, [x])[0]], axes=(2,))[0], (2, 1, 0))
    graph, _ = pulled(b.build([y], ["y"]))
    (tr,) = [n for n in graph.nodes if n.prim is Prim.TRANSPOSE]
    assert graph.types[tr.inputs[0]].shape == (2, 30, 1)


@pytest.mark.parametrize("inner_output", [False, True])
def test_a_pull_counts_the_transpose_it_makes_unnecessary(inner_output):
    """y = T(slice(exp(T(x)) + w)): pulled, w is transposed instead of x and the result, one
    transpose instead of two; not where T(x) is an output and stays (the pull would then
    transpose all of w to save transposing half of it)."""
    b, x = builder((2, 30, 40))
    w = b.input("w", TensorType((2, 40, 30), "float32"))
    u = t(b, x, (0, 2, 1))
    s = b.emit(Prim.ADD, [b.emit(Prim.EXP, [u])[0], w])[0]
    s = b.emit(Prim.SLICE, [s], starts=(0, 0, 0), steps=(1, 1, 1), sizes=(2, 20, 30))[0]
    graph, notes = pulled(
        b.build([t(b, s, (0, 2, 1)), u][: 1 + inner_output], ["y", "u"][: 1 + inner_output])
    )
    assert moved(graph) == (3600 if inner_output else 2400), notes


def test_slices_take_their_parts_before_the_transpose():
    b, x = builder((2, 3, 40))
    u = t(b, x, (0, 2, 1))
    parts = [b.emit(Prim.SLICE, [u], starts=(0, s, 0), steps=(1, 1, 1), sizes=(2, 4, 3))[0] for s in (0, 9)]
    graph, notes = pulled(b.build(parts, ["a", "b"]))
    assert moved(graph) == 2 * 2 * 4 * 3 and "moved after 2" in notes[0]


def test_a_transpose_sinks_past_elementwise_work_into_a_matmul():
    b, x = builder((2, 3, 4))
    k = b.emit(Prim.MAX, [t(b, x, (0, 2, 1)), b.const(np.float32(0))])[0]  # relu of [2, 4, 3]
    y = b.emit(Prim.MATMUL, [b.input("a", TensorType((2, 3, 4), "float32")), k])[0]
    graph, _ = pulled(b.build([y], ["y"]))
    (tr,) = [n for n in graph.nodes if n.prim is Prim.TRANSPOSE]
    assert [r.prim for r in graph.consumers()[tr.outputs[0]]] == [Prim.MATMUL] and moved(graph) == 0


def gelu(b, u):
    """x * (1 + erf(x / sqrt(2))) / 2, which reads x twice."""
    e = b.emit(Prim.ERF, [b.emit(Prim.DIV, [u, b.const(np.float32(np.sqrt(2)))])[0]])[0]
    m = b.emit(Prim.MUL, [u, b.emit(Prim.ADD, [e, b.const(np.float32(1))])[0]])[0]
    return b.emit(Prim.MUL, [m, b.const(np.float32(0.5))])[0]


def test_a_transpose_sinks_past_work_that_reads_it_twice_into_a_matmul():
    """Segformer's Mix-FFN: a GELU on the transposed output of a convolution, then a linear
    layer. The transpose moves past the whole GELU, onto the matmul."""
    b, x = builder((2, 5, 4))
    h = gelu(b, t(b, x, (0, 2, 1)))
    y = b.emit(Prim.MATMUL, [h, b.const(f32(RNG, 5, 3))])[0]
    graph, notes = pulled(b.build([y], ["y"]))
    assert moved(graph) == 0 and transposes(graph) == 1 and "moved after 5 primitives" in notes[0]


def test_a_transpose_sinks_into_the_transpose_that_undoes_it():
    """exp(T(x)) is read by a matmul and transposed back: a pull of the second transpose would
    compute the exponential twice; sunk, the first meets the second and both go, and the matmul
    takes exp(x) transposed as it is."""
    b, x = builder((2, 5, 4))
    e = b.emit(Prim.EXP, [b.emit(Prim.ADD, [t(b, x, (0, 2, 1)), b.const(f32(RNG, 2, 4, 5))])[0]])[0]
    m = b.emit(Prim.MATMUL, [b.input("a", TensorType((2, 3, 4), "float32")), e])[0]
    graph, _ = pulled(b.build([m, t(b, e, (0, 2, 1))], ["m", "y"]))
    assert moved(graph) == 0 and transposes(graph) == 1


def test_a_transpose_sinks_no_further_than_where_the_work_grows():
    """Past the slice (which keeps a third) but not past the pad after it (which makes it four
    times larger again)."""
    b, x = builder((2, 6, 4))
    s = b.emit(Prim.SLICE, [t(b, x, (0, 2, 1))], starts=(0, 0, 0), steps=(1, 1, 1), sizes=(2, 4, 2))[0]
    p = b.emit(Prim.PAD, [s], pads=(0, 0, 0, 0, 0, 6), mode="constant", value=0.0)[0]
    graph, notes = pulled(b.build([b.emit(Prim.EXP, [p])[0]], ["y"]))
    assert moved(graph) == 2 * 4 * 2, notes


def test_a_transpose_is_pulled_through_a_bias_into_a_matmul():
    """T(x @ w + b), b broadcast from one axis: b is transposed as a constant and the transpose
    lands on x, where the matmul takes it as it is (Segformer's Mix-FFN input)."""
    b, x = builder((2, 6, 4))
    m = b.emit(Prim.MATMUL, [x, b.const(f32(RNG, 4, 8))])[0]
    bias = b.emit(Prim.BROADCAST, [b.const(f32(RNG, 8))], shape=(2, 6, 8))[0]
    graph, _ = pulled(b.build([t(b, b.emit(Prim.ADD, [m, bias])[0], (0, 2, 1))], ["y"]))
    assert moved(graph) == 0 and transposes(graph) == 1


@pytest.mark.parametrize("perm, reshape", [((1, 0, 2), True), ((0, 2, 1), True), ((2, 1, 0), False)])
def test_a_transpose_that_moves_only_axes_of_size_one_is_a_reshape(perm, reshape):
    b, x = builder((2, 1, 4))
    graph, _ = pulled(b.build([b.emit(Prim.EXP, [t(b, x, perm)])[0]], ["y"]))
    assert [n.prim for n in graph.nodes] == [Prim.RESHAPE if reshape else Prim.TRANSPOSE, Prim.EXP]


def test_work_read_elsewhere_is_not_redone_transposed():
    """The exponential is an output too: pulling through it would compute it twice."""
    b, x = builder((2, 30, 40))
    e = b.emit(Prim.EXP, [x])[0]
    graph, notes = pulled(b.build([t(b, e, (0, 2, 1)), e], ["y", "e"]))
    assert notes == [] and [n.prim for n in graph.nodes] == [Prim.EXP, Prim.TRANSPOSE]


def test_work_read_by_other_work_is_not_redone_transposed():
    """Pulling the last transpose through the exponential would cancel it against the first but
    compute the exponential twice: for the negation and for y."""
    b, x = builder((2, 30, 40))
    e = b.emit(Prim.EXP, [t(b, x, (0, 2, 1))])[0]
    graph, _ = pulled(b.build([t(b, e, (0, 2, 1)), b.emit(Prim.NEG, [e])[0]], ["y", "z"]))
    assert sum(n.prim is Prim.EXP for n in graph.nodes) == 1


def test_a_transpose_that_no_matmul_takes_stays_before_elementwise_work():
    b, x = builder((2, 30, 40))
    graph, notes = pulled(b.build([b.emit(Prim.EXP, [t(b, x, (0, 2, 1))])[0]], ["y"]))
    assert notes == []


def test_a_graph_output_is_transposed_where_it_is():
    b, x = builder()
    u = t(b, x, (0, 2, 1))
    graph, notes = pulled(b.build([t(b, b.emit(Prim.NEG, [u])[0], (0, 2, 1)), u], ["y", "u"]))
    assert transposes(graph) == 1  # the output u's own transpose; the negation reads x


def test_a_batch_permuting_transpose_stays_outside_a_matmul():
    b, x = builder((2, 3, 4))
    m = b.emit(Prim.MATMUL, [x, b.input("w", TensorType((2, 4, 3), "float32"))])[0]
    graph, notes = pulled(b.build([t(b, m, (1, 0, 2))], ["y"]))
    assert notes == [] and transposes(graph) == 1


def test_a_scalar_made_after_the_transpose_keeps_it_from_sinking_before_it():
    b, x = builder()
    u = t(b, x, (0, 2, 1))
    scale = b.emit(Prim.NEG, [b.input("s", TensorType((), "float32"))])[0]  # computed after u
    k = b.emit(Prim.MUL, [u, scale])[0]
    pulled(b.build([b.emit(Prim.MATMUL, [b.input("a", TensorType((2, 3, 4), "float32")), k])[0]], ["y"]))


@pytest.mark.parametrize("order", ["tanh first", "matmul first"])
def test_a_transpose_a_matmul_takes_is_free_only_if_nothing_else_reads_it(order):
    """Pulled into both the matmul and the tanh, u would need a transpose that the tanh reads
    too: not free, so the pull does not pay, in whichever order the add reads them."""
    b = GraphBuilder()
    u = b.input("u", TensorType((2, 4, 3), "float32"))
    m = b.emit(Prim.MATMUL, [b.input("a", TensorType((2, 4, 4), "float32")), u])[0]
    e = b.emit(Prim.TANH, [u])[0]
    s = b.emit(Prim.ADD, [e, m] if order == "tanh first" else [m, e])[0]
    y = t(b, b.emit(Prim.REDUCE_MAX, [s], axes=(0,))[0], (0, 2, 1))
    graph, _ = pulled(b.build([y], ["y"]))
    assert moved(graph) == 12


def test_a_transpose_a_matmul_already_takes_is_not_counted_as_saved():
    b = GraphBuilder()
    tb = t(b, b.input("w", TensorType((2, 3, 5), "float32")), (0, 2, 1))
    m = b.emit(Prim.MATMUL, [b.input("a", TensorType((2, 4, 5), "float32")), tb])[0]
    e = b.emit(Prim.TANH, [b.input("x", TensorType((2, 4, 3), "float32"))])[0]
    s = b.emit(Prim.REDUCE_MAX, [b.emit(Prim.ADD, [m, e])[0]], axes=(0,))[0]
    graph, _ = pulled(b.build([t(b, s, (0, 2, 1))], ["y"]))
    assert moved(graph) == 12


def test_a_matmul_operand_is_not_also_redone_transposed_for_another_reader():
    """u = pad(x) is read by the matmul (which takes T(u) as it is) and by the add (through which
    the pull would pad T(x), smaller than T(u)): the padding must stay done once."""
    b, x = builder((2, 4, 3))
    u = b.emit(Prim.PAD, [x], pads=(0, 1, 0, 0, 1, 0), mode="edge")[0]  # [2, 6, 3]
    m = b.emit(Prim.MATMUL, [u, b.const(f32(RNG, 3, 3))])[0]
    y = t(b, b.emit(Prim.ADD, [m, u])[0], (0, 2, 1))
    graph, _ = pulled(b.build([y], ["y"]))
    assert sum(n.prim is Prim.PAD for n in graph.nodes) == 1


def test_a_long_chain_is_pulled_through_without_running_out_of_stack():
    b, x = builder()
    y = t(b, x, (0, 2, 1))
    for _ in range(600):
        y = b.emit(Prim.TANH, [y])[0]
    graph, _ = pulled(b.build([t(b, y, (0, 2, 1))], ["y"]))
    assert transposes(graph) <= 2


def random_graph(rng):
    """A random chain of transposes and the primitives they move through, some values read twice."""
    b, x = builder((2, 3, 4))
    values = [x]
    for _ in range(rng.integers(3, 9)):
        u = values[rng.integers(len(values))]
        shape, axis = b.types[u].shape, int(rng.integers(3))
        same = [v for v in values if b.types[v].shape == shape]
        kind = rng.integers(12)
        if kind <= 1:
            y = t(b, u, tuple(rng.permutation(3)))
        elif kind == 2:
            y = b.emit(Prim.TANH, [u])[0]
        elif kind == 3:
            y = b.emit(Prim.ADD, [u, same[rng.integers(len(same))]])[0]
        elif kind == 4:
            sizes = tuple(1 if a == axis else d for a, d in enumerate(shape))
            y = b.emit(Prim.SLICE, [u], starts=(0,) * 3, steps=(1,) * 3, sizes=sizes)[0]
            y = b.emit(Prim.BROADCAST, [y], shape=shape)[0]
        elif kind == 5:
            y = b.emit(Prim.MATMUL, [u, t(b, u, (0, 2, 1))])[0]
        elif kind == 6:
            pads = tuple(int(p) for p in rng.integers(0, 2, 6))
            y = b.emit(Prim.PAD, [u], pads=pads, mode="constant", value=1.0)[0]
        elif kind == 7:
            y = b.emit(Prim.REDUCE_SUM, [u], axes=(axis,))[0]
        elif kind == 8:
            y = b.emit(Prim.CONCAT, [u, same[rng.integers(len(same))]], axis=axis)[0]
        elif kind == 9:
            y = b.emit(Prim.MUL, [u, b.const(rng.standard_normal(shape).astype(np.float32))])[0]
        elif kind == 10:  # a bias along the last axis
            bias = b.const(rng.standard_normal(shape[-1:]).astype(np.float32))
            y = b.emit(Prim.ADD, [u, b.emit(Prim.BROADCAST, [bias], shape=shape)[0]])[0]
        else:
            y = gelu(b, u)
        values.append(y)
    outs = [values[-1], values[rng.integers(1, len(values))]]
    return b.build(list(dict.fromkeys(outs)), ["y", "z"][: len(set(outs))])


@pytest.mark.parametrize("seed", range(40))
def test_random_graphs_compute_the_same_and_move_no_more(seed):
    pulled(random_graph(np.random.default_rng(seed)))
