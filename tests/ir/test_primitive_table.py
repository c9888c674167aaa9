"""Every primitive has everything korch needs of it: a row in korch.ir.prims.DEFS (kind, shape rule,
numpy reference, FLOP count, whether it moves data), a torch lowering (korch.backends.torch_ops)
and an ONNX lowering (korch.backends.onnxrt), unless it is on a list of exceptions below."""

import ast
from pathlib import Path

import pytest

from korch.backends import onnxrt, torch_ops
from korch.backends.onnxrt import EMITTERS
from korch.backends.torch_ops import LOWERINGS, apply
from korch.ir import prims
from korch.ir.graph import GraphBuilder
from korch.ir.prims import DEFS, Kind, Prim, PrimDef, TensorType, no_flops
from korch.ir.work import VIEWS, kernel_work, node_flops

# primitives without a torch lowering, and why
NO_TORCH = {
    Prim.OPAQUE: "an operator kept whole: ONNX Runtime runs its embedded model",
}
# primitives without an ONNX lowering of their own, and why (the ONNX Runtime backend refuses
# kernels holding them, or writes them otherwise)
NO_ONNX = {
    Prim.WINDOW: "ONNX has windows only inside a pool: korch.backends.onnx_patterns fuses those",
    Prim.GROUPED_MATMUL: "no ONNX operator multiplies each row by its group's matrix",
    Prim.OPAQUE: "its embedded one-operator model is the kernel (onnxrt._opaque_model)",
}


@pytest.mark.parametrize("prim", list(Prim), ids=lambda p: p.value)
def test_every_primitive_has_a_row(prim):
    row = DEFS[prim]
    assert isinstance(row, PrimDef) and isinstance(row.kind, Kind)
    assert callable(row.infer) and callable(row.ref) and callable(row.flops)
    assert isinstance(row.view, bool)


@pytest.mark.parametrize("prim", list(Prim), ids=lambda p: p.value)
def test_every_primitive_has_a_torch_lowering(prim):
    assert (prim in LOWERINGS) != (prim in NO_TORCH), f"{prim.value}: a lowering, or a reason in NO_TORCH"


@pytest.mark.parametrize("prim", list(Prim), ids=lambda p: p.value)
def test_every_primitive_has_an_onnx_lowering(prim):
    assert (prim in EMITTERS) != (prim in NO_ONNX), f"{prim.value}: an emitter, or a reason in NO_ONNX"


def _written_keys(module, name: str) -> list[str]:
    """The keys of the dict literal assigned to `name` in the module's source."""
    for node in ast.walk(ast.parse(Path(module.__file__).read_text())):
        if isinstance(node, ast.AnnAssign | ast.Assign) and isinstance(node.value, ast.Dict):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and t.id == name for t in targets):
                return [ast.unparse(k) for k in node.value.keys]
    raise AssertionError(f"no dict literal {name} in {module.__name__}")


@pytest.mark.parametrize("module,name", [(prims, "_ROWS"), (torch_ops, "LOWERINGS"), (onnxrt, "EMITTERS")])
def test_no_primitive_is_written_twice_in_a_table(module, name):
    """A key written twice in a dict literal silently replaces the first."""
    keys = _written_keys(module, name)
    assert len(keys) == len(set(keys)), sorted({k for k in keys if keys.count(k) > 1})


def test_a_primitive_without_a_lowering_says_so():
    with pytest.raises(NotImplementedError, match="no torch lowering for opaque"):
        apply(Prim.OPAQUE, [], {})


def test_linear_primitives_and_only_they_count_flops():
    assert {p for p, row in DEFS.items() if row.flops is not no_flops} == {
        p for p in Prim if p.kind is Kind.LINEAR
    }


def test_views_move_no_data_and_only_layouts_are_views():
    assert set(VIEWS) == {Prim.BROADCAST, Prim.RESHAPE, Prim.TRANSPOSE, Prim.SLICE, Prim.WINDOW}
    assert all(p.kind in (Kind.BROADCAST, Kind.LAYOUT) for p in VIEWS)


def _node(prim: Prim, types: list[TensorType], **attrs):
    b = GraphBuilder()
    out = b.emit(prim, [b.input(f"x{i}", t) for i, t in enumerate(types)], **attrs)[0]
    graph = b.build([out], ["y"])
    return graph, graph.nodes[0]


F32 = "float32"
CONV = {"strides": (2, 1), "pads": (1, 0, 1, 2), "dilations": (1, 2), "group": 2}


@pytest.mark.parametrize(
    "prim,types,attrs,flops",
    [
        (Prim.MATMUL, [TensorType((2, 3, 4), F32), TensorType((4, 5), F32)], {}, 2 * (2 * 3 * 5) * 4),
        (
            Prim.GROUPED_MATMUL,
            [TensorType((6, 4), F32), TensorType((3, 4, 5), F32), TensorType((3,), "int64")],
            {},
            2 * (6 * 5) * 4,
        ),
        # out [1, 6, 4, 5]; weight [6, 2, 3, 3]
        (Prim.CONV, [TensorType((1, 4, 7, 7), F32), TensorType((6, 2, 3, 3), F32)], CONV, 2 * 120 * 18),
        (
            Prim.CONV_TRANSPOSE,
            [TensorType((1, 4, 5, 5), F32), TensorType((4, 3, 3, 3), F32)],
            {**CONV, "group": 1, "dilations": (1, 1), "output_padding": (1, 0)},
            2 * 100 * 27,
        ),
        (Prim.EXP, [TensorType((8, 8), F32)], {}, 0),
        (Prim.REDUCE_SUM, [TensorType((8, 8), F32)], {"axes": (1,)}, 0),
    ],
    ids=lambda v: v.value if isinstance(v, Prim) else "",
)
def test_flops_count_multiply_adds_of_linear_primitives(prim, types, attrs, flops):
    graph, node = _node(prim, types, **attrs)
    assert node_flops(node, graph.types) == flops
    assert (flops > 0) == (prim.kind is Kind.LINEAR)
    work = kernel_work(graph)
    assert work.flops == flops
    assert work.bytes == sum(t.nbytes for t in types) + graph.types[node.outputs[0]].nbytes


def test_a_view_alone_moves_no_bytes():
    graph, _ = _node(Prim.TRANSPOSE, [TensorType((4, 8), F32)], perm=(1, 0))
    assert kernel_work(graph).bytes == 0
