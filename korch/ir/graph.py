"""The primitive graph: immutable nodes and graphs, a builder, the verifier and the text form."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import numpy as np

from korch.config import BROADCAST_FOLD_LIMIT, FOLD_LIMIT
from korch.errors import KorchError
from korch.ir.prims import Kind, Prim, TensorType


def freeze_attr(value: Any) -> Any:
    """Attributes must be hashable: lists become tuples, numpy scalars become Python numbers."""
    if isinstance(value, (list, tuple)):
        return tuple(freeze_attr(v) for v in value)
    if isinstance(value, np.generic):
        return value.item()
    return value


@dataclass(frozen=True)
class Node:
    prim: Prim
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    attrs: tuple[tuple[str, Any], ...] = ()
    origin: str = ""  # the frontend operator this primitive came from ("OpType:name"), for reports
    # and to tell a quantizing cast from others (korch.measure.tolerance.quantizes)

    @property
    def a(self) -> dict[str, Any]:
        return dict(self.attrs)

    @property
    def kind(self) -> Kind:
        return self.prim.kind


@dataclass(frozen=True)
class Graph:
    """Nodes are in topological order; every value is assigned exactly once."""

    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    output_names: tuple[str, ...]
    types: Mapping[str, TensorType]
    constants: Mapping[str, np.ndarray]
    nodes: tuple[Node, ...]
    name: str = "main"

    def by_kind(self) -> dict[str, int]:
        counts = {k.name.lower(): 0 for k in Kind}
        for n in self.nodes:
            counts[n.kind.name.lower()] += 1
        return counts

    def dtypes(self) -> set[str]:
        """The dtypes of the graph's values: inputs, constants and intermediates."""
        return {t.dtype for t in self.types.values()}

    def producers(self) -> dict[str, Node]:
        return {v: n for n in self.nodes for v in n.outputs}

    def consumers(self) -> dict[str, list[Node]]:
        uses: dict[str, list[Node]] = {}
        for n in self.nodes:
            for v in n.inputs:
                uses.setdefault(v, []).append(n)
        return uses

    def text(self) -> str:
        return to_text(self)


# ------------------------------------------------------------------- builder


@dataclass
class GraphBuilder:
    """Builds a graph one primitive at a time, inferring types and folding constant work."""

    types: dict[str, TensorType] = field(default_factory=dict)
    constants: dict[str, np.ndarray] = field(default_factory=dict)
    nodes: list[Node] = field(default_factory=list)
    inputs: list[str] = field(default_factory=list)
    origin: str = ""
    # constants that work on is never folded: emitted instead (a packed 4-bit weight, which
    # unpacked at import would be a float32 constant 8 times its size)
    unfolded: set[str] = field(default_factory=set)
    _counter: int = 0
    _const_index: dict[tuple, str] = field(default_factory=dict)

    def _fresh(self, prefix: str) -> str:
        self._counter += 1
        return f"{prefix}{self._counter}"

    def input(self, name: str, ttype: TensorType) -> str:
        if name in self.types:
            raise KorchError(f"duplicate value name {name!r}")
        self.types[name] = ttype
        self.inputs.append(name)
        return name

    def const(self, value: Any, dtype: str | None = None) -> str:
        array = np.array(value, dtype=dtype)
        if str(array.dtype) == "float64" and dtype is None and not isinstance(value, np.ndarray):
            array = array.astype("float32")
        key = None
        if array.size <= 16:
            key = (str(array.dtype), array.shape, array.tobytes())
            if key in self._const_index:
                return self._const_index[key]
        name = self._fresh("c")
        array.setflags(write=False)
        self.constants[name] = array
        self.types[name] = TensorType.of(array)
        if key is not None:
            self._const_index[key] = name
        return name

    def emit(self, prim: Prim, inputs: Iterable[str], n_out: int = 1, **attrs) -> list[str]:
        inputs = tuple(inputs)
        frozen = tuple(sorted((k, freeze_attr(v)) for k, v in attrs.items()))
        out_types = prim.infer([self.types[v] for v in inputs], dict(frozen))
        if len(out_types) != n_out:
            raise KorchError(f"{prim.value} produces {len(out_types)} values, expected {n_out}")
        if self._foldable(prim, inputs, out_types):
            arrays = prim.ref([self.constants[v] for v in inputs], dict(frozen))
            return [self.const(np.array(a, dtype=t.dtype)) for a, t in zip(arrays, out_types)]
        outs = tuple(self._fresh("t") for _ in out_types)
        for v, t in zip(outs, out_types):
            self.types[v] = t
        self.nodes.append(Node(prim, inputs, outs, frozen, self.origin))
        return list(outs)

    def _foldable(self, prim: Prim, inputs: tuple[str, ...], out_types: list[TensorType]) -> bool:
        if prim is Prim.OPAQUE or not all(v in self.constants for v in inputs):
            return False
        if self.unfolded.intersection(inputs):
            return False
        largest_out = max(t.numel for t in out_types)
        if prim is Prim.BROADCAST:  # materialising a broadcast only costs memory, unless tiny
            return largest_out <= BROADCAST_FOLD_LIMIT
        largest_input = max((self.types[v].numel for v in inputs), default=0)
        return largest_out <= max(FOLD_LIMIT, largest_input)

    def build(self, outputs: Iterable[str], output_names: Iterable[str], name: str = "main") -> Graph:
        return prune(
            Graph(
                inputs=tuple(self.inputs),
                outputs=tuple(outputs),
                output_names=tuple(output_names),
                types=MappingProxyType(dict(self.types)),
                constants=MappingProxyType(dict(self.constants)),
                nodes=tuple(self.nodes),
                name=name,
            )
        )


def prune(graph: Graph) -> Graph:
    """Drop nodes and constants that no graph output depends on."""
    live = set(graph.outputs)
    kept: list[Node] = []
    for node in reversed(graph.nodes):
        if live.intersection(node.outputs):
            kept.append(node)
            live.update(node.inputs)
    kept.reverse()
    used = set(graph.inputs) | live | {v for n in kept for v in n.outputs}
    return Graph(
        inputs=graph.inputs,
        outputs=graph.outputs,
        output_names=graph.output_names,
        types=MappingProxyType({k: t for k, t in graph.types.items() if k in used}),
        constants=MappingProxyType({k: c for k, c in graph.constants.items() if k in live}),
        nodes=tuple(kept),
        name=graph.name,
    )


# ------------------------------------------------------------------- verifier


class VerifyError(KorchError):
    """The graph breaks an IR invariant; always a korch bug, never the user's."""


def verify(graph: Graph) -> None:
    """Acyclic and topologically ordered, single assignment, types agree with every shape rule."""
    defined: set[str] = set()
    for name in (*graph.inputs, *graph.constants):
        if name in defined:
            raise VerifyError(f"value {name!r} defined twice")
        defined.add(name)
    for name, array in graph.constants.items():
        if graph.types.get(name) != TensorType.of(array):
            raise VerifyError(f"constant {name!r} type mismatch")
    for node in graph.nodes:
        for v in node.inputs:
            if v not in defined:
                raise VerifyError(f"{node.prim.value} uses {v!r} before it is defined")
        inferred = node.prim.infer([graph.types[v] for v in node.inputs], node.a)
        declared = [graph.types.get(v) for v in node.outputs]
        if inferred != declared:
            raise VerifyError(f"{node.prim.value} -> {node.outputs}: types {declared} != {inferred}")
        for v in node.outputs:
            if v in defined:
                raise VerifyError(f"value {v!r} assigned twice")
            defined.add(v)
    for v in graph.outputs:
        if v not in defined:
            raise VerifyError(f"graph output {v!r} is never defined")
    if len(graph.outputs) != len(graph.output_names):
        raise VerifyError("outputs and output_names differ in length")


# ------------------------------------------------------------------ text form


def _fmt_attr(key: str, value: Any) -> str:
    if isinstance(value, bytes):
        return f"{key}=<{len(value)} bytes>"
    if isinstance(value, tuple):
        return f"{key}=[{','.join(_fmt_scalar(v) for v in value)}]"
    return f"{key}={_fmt_scalar(value)}"


def _fmt_scalar(v: Any) -> str:
    if isinstance(v, float):
        return repr(v)
    if isinstance(v, tuple):
        return "[" + ",".join(_fmt_scalar(x) for x in v) + "]"
    return str(v)


def _fmt_const(array: np.ndarray) -> str:
    if array.size <= 4:
        return np.array2string(array.reshape(-1), separator=",", precision=6).replace("\n", "")
    return f"<{math.prod(array.shape)} values>"


def to_text(graph: Graph) -> str:
    """A stable, human-readable form for golden tests and logs; values are renumbered in order."""
    names = {v: v for v in graph.inputs}
    names.update({c: f"c{i}" for i, c in enumerate(graph.constants)})
    for node in graph.nodes:
        for v in node.outputs:
            names[v] = f"t{len(names) - len(graph.inputs) - len(graph.constants)}"
    args = ", ".join(f"{v}: {graph.types[v]}" for v in graph.inputs)
    lines = [f"graph {graph.name}({args}) {{"]
    for name, array in graph.constants.items():
        lines.append(f"  {names[name]}: {graph.types[name]} = const {_fmt_const(array)}")
    for node in graph.nodes:
        outs = ", ".join(f"{names[v]}: {graph.types[v]}" for v in node.outputs)
        ins = ", ".join(names[v] for v in node.inputs)
        attrs = " ".join(_fmt_attr(k, v) for k, v in node.attrs if k != "model")
        lines.append(f"  {outs} = {node.prim.value}({ins}){' ' + attrs if attrs else ''}")
    rets = ", ".join(f"{names[v]} as {n}" for v, n in zip(graph.outputs, graph.output_names))
    lines.append(f"  return {rets}")
    lines.append("}")
    return "\n".join(lines)


def integer_division(types: Mapping, node) -> bool:
    """The node divides integers (by zero it fails, in ONNX Runtime and in torch alike)."""
    return node.prim is Prim.DIV and types[node.inputs[1]].dtype.startswith(("int", "uint"))
