"""ONNX import: load and validate a model, pin its shapes, and split every node into primitives."""

from __future__ import annotations

import functools
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
from google.protobuf.message import DecodeError
from onnx import helper, numpy_helper

from korch.errors import KorchError, Unsupported, error_line
from korch.frontend.lowering import DEFAULT_DOMAINS, Attributes, FissionResult, Lowering, OnnxNode, find_rule
from korch.frontend.onnx.control import CONTROL_FLOW
from korch.frontend.onnx.external import read_external_data, refuse_external_data
from korch.frontend.onnx.pins import MAX_TENSOR_BYTES, input_types, pin_shapes, pin_values
from korch.frontend.onnx.tensor_types import onnx_dtype, to_onnx_dtype
from korch.ir.graph import GraphBuilder, integer_division, verify
from korch.ir.prims import Prim, TensorType


def load_model(source: str | os.PathLike | onnx.ModelProto | bytes, name: str = "") -> onnx.ModelProto:
    """Read and validate an ONNX file, or serialized bytes (`name`: what to call them in
    errors); every failure is a one-line KorchError."""
    if isinstance(source, onnx.ModelProto):
        model = source
    elif not isinstance(source, (str, os.PathLike, bytes)):
        wanted = "an ONNX model (a file path, its bytes or an onnx.ModelProto)"
        raise KorchError(f"expected {wanted}, got {type(source).__name__}")
    else:
        label = (name or "the model") if isinstance(source, bytes) else Path(source)
        if not isinstance(source, bytes) and not label.is_file():
            raise KorchError(f"{label}: {_not_a_file(label)}")
        try:
            if isinstance(source, bytes):
                model = onnx.load_from_string(source)
            else:  # its external data read below, only from inside its folder
                model = onnx.load(str(label), load_external_data=False)
        except (DecodeError, ValueError, RuntimeError, OSError, UnicodeDecodeError) as e:
            raise KorchError(f"{label}: not a valid ONNX model ({error_line(e)})") from None
        except Exception as e:  # protobuf raises assorted types on random bytes
            raise KorchError(f"{label}: not a valid ONNX model ({type(e).__name__})") from None
    if isinstance(source, (str, os.PathLike)):
        read_external_data(model, Path(source))
    else:
        refuse_external_data(model, name or "the model")
    if not model.HasField("graph") or not model.graph.node and not model.graph.output:
        raise KorchError("the file holds no ONNX graph")
    checked = _as_onnx_knows_it(skeleton(model))
    for out in checked.graph.output:
        # ONNX Runtime accepts outputs of unknown rank; the checker insists on a shape field
        if out.type.HasField("tensor_type") and not out.type.tensor_type.HasField("shape"):
            out.type.tensor_type.shape.SetInParent()
    try:
        onnx.checker.check_model(checked)
    except (onnx.checker.ValidationError, ValueError) as e:
        # an operator version ONNX has since deprecated (GroupNormalization-18) still runs fine
        if "is deprecated" not in str(e):
            raise KorchError(f"invalid ONNX model: {error_line(e)}") from None
    return model


def _not_a_file(path: Path) -> str:
    """Why `path`, which is no regular file, is no model (a FIFO or device would never end)."""
    if path.is_dir():
        return "a directory, not an ONNX file"
    return "not a regular file, not an ONNX file" if path.exists() else "no such file"


# operators whose output shapes depend on their inputs' values: a plan of static kernels cannot hold
# one unless its inputs are constants (a probe run would freeze the shape of one input's answer)
DATA_DEPENDENT_SHAPES = ("NonZero", "NonMaxSuppression", "Unique")

# operators ONNX Runtime adds to ONNX's domain: its LayerNormalization before ONNX's (opset 17),
# SimplifiedLayerNormalization (korch.frontend.onnx.rules_contrib lowers both)
ONNX_RUNTIME_ONNX_OPS = ("LayerNormalization", "SimplifiedLayerNormalization")


def _as_onnx_knows_it(checked: onnx.ModelProto) -> onnx.ModelProto:
    """The checker's copy with ONNX Runtime's operators in ONNX's domain moved to a domain of their
    own (the checker knows no schema for them; ONNX Runtime runs them)."""
    opset = next((o.version for o in checked.opset_import if o.domain in DEFAULT_DOMAINS), None)
    moved = False
    for node in checked.graph.node:
        if node.op_type in ONNX_RUNTIME_ONNX_OPS and node.domain in DEFAULT_DOMAINS and opset is not None:
            try:
                onnx.defs.get_schema(node.op_type, opset, "")
            except onnx.defs.SchemaError:
                node.domain, moved = "onnxruntime.onnx", True
    if moved:
        checked.opset_import.append(helper.make_opsetid("onnxruntime.onnx", 1))
    return checked


def skeleton(model: onnx.ModelProto, keep: int = 4096) -> onnx.ModelProto:
    """The model with large initializers turned into typed graph inputs: the checker and shape
    inference serialize the whole model, which for BERT-base means copying 440 MB twice."""
    graph = model.graph
    small = [t for t in graph.initializer if math.prod(t.dims) <= keep]
    declared = {i.name for i in graph.input}
    large = [
        helper.make_tensor_value_info(t.name, t.data_type, list(t.dims))
        for t in graph.initializer
        if math.prod(t.dims) > keep and t.name not in declared
    ]
    slim = helper.make_graph(
        list(graph.node),
        graph.name,
        list(graph.input) + large,
        list(graph.output),
        small,
        value_info=list(graph.value_info),
    )
    out = helper.make_model(slim, opset_imports=list(model.opset_import), ir_version=model.ir_version)
    out.functions.extend(model.functions)
    return out


def _inferred_types(model: onnx.ModelProto) -> dict[str, TensorType]:
    """ONNX's own shape inference, used to cross-check every fission rule's output types."""
    try:
        inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False, data_prop=True)
    except Exception:  # inference is a cross-check only; ONNX Runtime reports real problems
        return {}
    out = {}
    for vi in list(inferred.graph.value_info) + list(inferred.graph.output):
        tt = vi.type.tensor_type
        if not tt.HasField("shape") or not all(d.HasField("dim_value") for d in tt.shape.dim):
            continue
        try:
            out[vi.name] = TensorType(tuple(d.dim_value for d in tt.shape.dim), onnx_dtype(tt.elem_type))
        except KorchError:
            continue
    return out


def import_onnx(
    source: str | os.PathLike | onnx.ModelProto,
    shapes: Mapping[str, tuple[int, ...]] | None = None,
    strict: bool = False,
    values: Mapping[str, object] | None = None,
) -> FissionResult:
    """Load an ONNX model and lower every node through the fission registry. `values` pins inputs
    to values (array-likes, broadcast to the input's shape): each becomes a constant of the model."""
    try:
        return _import_onnx(source, shapes, strict, values)
    except UnicodeDecodeError as e:
        # protobuf decodes a string field (a graph, node or value name) only when it is read:
        # damaged bytes there load fine and fail anywhere later
        raise KorchError(f"not a valid ONNX model: a name is not UTF-8 text ({error_line(e)})") from None


def _import_onnx(source, shapes, strict: bool, values) -> FissionResult:
    model = load_model(source)
    owned = not isinstance(source, onnx.ModelProto)  # (the caller's model is copied, not changed)
    shapes = dict(shapes or {})
    if values:
        model, owned = pin_values(model, values, shapes, owned), True
        shapes = {n: s for n, s in shapes.items() if n not in values}
    opsets = {o.domain: o.version for o in model.opset_import}
    opset = opsets.get("", opsets.get("ai.onnx"))
    if opset is None:
        raise KorchError("the model imports no default-domain opset")
    if opset > onnx.defs.onnx_opset_version():
        raise KorchError(f"opset {opset} is newer than this ONNX ({onnx.defs.onnx_opset_version()})")
    types = input_types(model, shapes)
    model = pin_shapes(model, types, owned)
    expected = _inferred_types(skeleton(model))

    b = GraphBuilder()
    env: dict[str, str] = {}
    for name, t in types.items():
        env[name] = b.input(name, t)
    for init in model.graph.initializer:
        try:
            env[init.name] = b.const(numpy_helper.to_array(init))
        except (KorchError, ValueError) as e:
            raise KorchError(f"initializer {init.name!r}: {error_line(e)}") from None
    scope = _Scope(model, opsets, opset, strict, expected)
    _lower_nodes(Lowering(b), model.graph.node, env, scope)
    opaque, warnings = scope.opaque, scope.warnings
    missing = [o.name for o in model.graph.output if o.name not in env]
    if missing:
        raise KorchError(f"graph outputs {missing} are never computed")
    graph = b.build(
        [env[o.name] for o in model.graph.output],
        [o.name for o in model.graph.output],
        name=model.graph.name or "main",
    )
    verify(graph)
    names: dict[str, str] = {}
    for name, value in env.items():
        names.setdefault(value, name)
    return FissionResult(graph, model, len(model.graph.node), opaque, warnings, onnx_names=names)


def _check_type(where, name, got: TensorType, expected: Mapping[str, TensorType], warnings: list) -> None:
    """ONNX shape inference is a cross-check, not the oracle (it disagrees with ONNX Runtime on
    some ceil-mode pools and float32 resize sizes), so a mismatch is reported, not fatal."""
    want = expected.get(name)
    if want is not None and want != got:
        warnings.append(f"{where}: output {name!r} lowered to {got}, ONNX shape inference says {want}")


def _check_divisors(b: GraphBuilder, nodes) -> None:
    """An integer division by a constant 0 fails in ONNX Runtime and in torch alike: say so here,
    not as an error from inside profiling."""
    # (dividing nothing, a zero-size tensor, cannot fail)
    divisions = [n for n in nodes if integer_division(b.types, n) and b.types[n.outputs[0]].numel]
    producers = {v: n for n in nodes for v in n.outputs} if divisions else {}
    for node in divisions:
        divisor = node.inputs[1]
        while divisor in producers and producers[divisor].prim in (Prim.BROADCAST, Prim.RESHAPE):
            divisor = producers[divisor].inputs[0]  # the same values, only arranged differently
        if divisor in b.constants and not np.all(b.constants[divisor]):
            raise KorchError("integer division by zero: a constant divisor holds 0")


def _check_size(where: str, name: str, t: TensorType) -> None:
    if t.nbytes > MAX_TENSOR_BYTES:
        raise KorchError(f"{where}: output {name!r} of shape {list(t.shape)} is too large ({t.nbytes} bytes)")


@dataclass
class _Scope:
    """What lowering a node reads besides its inputs (the model, its opsets, ONNX's shape
    inference), and where its refusals and warnings go."""

    model: onnx.ModelProto
    opsets: dict[str, int]
    opset: int
    strict: bool
    expected: dict[str, TensorType]
    opaque: list[tuple[str, str]] = field(default_factory=list)  # (op type, reason)
    warnings: list[str] = field(default_factory=list)


def _lower_nodes(ctx: Lowering, nodes, env: dict[str, str], scope: _Scope) -> None:
    """Lower `nodes` in order, naming their outputs in `env` (ONNX name -> primitive value)."""
    b = ctx.b
    for node in nodes:
        version = scope.opsets.get(node.domain, scope.opset)
        where = f"node {node.name or '?'!r} ({node.op_type}, opset {version})"
        b.origin = f"{node.op_type}:{node.name}"
        first = len(b.nodes)
        try:
            outs = _lower_node(ctx, node, env, scope)
            _check_divisors(b, b.nodes[first:])
        except Unsupported as e:
            raise KorchError(f"{where}: {e}") from None
        except KorchError as e:
            raise KorchError(f"{where}: {e}") from None
        for name, value in zip(node.output, outs):
            if name:
                # (a Constant's type is its tensor's; a value_info that says otherwise, as the
                # model builder writes for its [1] constants, is the file's slip)
                if node.op_type != "Constant":
                    _check_type(where, name, b.types[value], scope.expected, scope.warnings)
                _check_size(where, name, b.types[value])
                env[name] = value


def _lower_node(ctx, node, env, scope: _Scope) -> list[str]:
    opsets, opset = scope.opsets, scope.opset
    if node.op_type in CONTROL_FLOW and node.domain in DEFAULT_DOMAINS:
        version = opsets.get(node.domain, opset)
        return CONTROL_FLOW[node.op_type](
            ctx, node, env, lambda nodes, inner: _lower_nodes(ctx, nodes, inner, scope), version
        )
    inputs = []
    for name in node.input:
        if not name:
            inputs.append(None)
        elif name not in env:
            raise KorchError(f"input {name!r} is not defined before this node")
        else:
            inputs.append(env[name])
    if node.domain not in DEFAULT_DOMAINS and node.domain not in opsets:
        raise KorchError(f"domain {node.domain!r} is not imported by the model")
    version = opsets.get(node.domain, opset)
    rule = find_rule(node.op_type, version, node.domain)
    onnx_node = OnnxNode(
        node.op_type,
        node.name,
        version,
        inputs,
        len(node.output),
        {a.name: _attr_value(a) for a in node.attribute},
        tuple(node.output),
    )
    if rule is not None:
        try:
            outs = rule(ctx, onnx_node)
            if len(outs) < len(node.output):
                raise KorchError(f"lowering produced {len(outs)} of {len(node.output)} outputs")
            ignored = _ignored_attributes(node, onnx_node.attrs, version)
            if ignored:
                raise Unsupported(f"attribute {ignored} is not lowered by its fission rule")
            unread = [i for i, v in enumerate(inputs) if v is not None and i not in onnx_node.inputs.read]
            if unread:
                raise Unsupported(
                    f"input {unread[0]} ({node.input[unread[0]]!r}) is not lowered by its fission rule"
                )
            return outs
        except Unsupported as e:
            reason = str(e)
    else:
        reason = "no fission rule"
    if scope.strict:
        raise Unsupported(f"{reason} (--strict forbids opaque operators)")
    scope.opaque.append((node.op_type, reason))
    return _opaque(ctx, node, inputs, scope.expected, scope.model)


def _ignored_attributes(node, attrs: Attributes, version: int) -> str | None:
    """The first attribute (`name=value`) that the node sets to other than its default and that its
    rule never looked up: lowered without it, the node would compute something else. (A rule
    that has no use for an attribute at inference looks it up and says so.)"""
    unread = {name: value for name, value in attrs.items() if name not in attrs.read}
    if not unread:
        return None
    defaults = _attribute_defaults(node.op_type, version, node.domain)
    for name, value in unread.items():
        if name not in defaults or defaults[name] != value:
            return f"{name}={value!r}"
    return None


def _attribute_defaults(op_type: str, version: int, domain: str) -> dict:
    """{attribute: default value} from the operator's schema: ONNX's, or for ONNX Runtime's own
    domains (com.microsoft), the schemas ONNX Runtime registers (onnx knows none of them)."""
    try:
        attributes = onnx.defs.get_schema(op_type, version, domain).attributes
        return {n: _attr_value(a.default_value) for n, a in attributes.items() if a.default_value.name}
    except onnx.defs.SchemaError:
        versions = _onnxruntime_defaults().get((domain, op_type), [])
        return max(((v, d) for v, d in versions if v <= version), default=(0, {}), key=lambda vd: vd[0])[1]


@functools.cache
def _onnxruntime_defaults() -> dict[tuple[str, str], list[tuple[int, dict]]]:
    """{(domain, op type): [(since version, {attribute: default})]} of the operators ONNX Runtime
    registers outside ONNX's domain. Its Python binding hands a default over as a serialized
    AttributeProto."""
    from onnxruntime.capi import onnxruntime_pybind11_state as ort_state

    found: dict[tuple[str, str], list[tuple[int, dict]]] = {}
    for schema in ort_state.get_all_operator_schema():
        if schema.domain in DEFAULT_DOMAINS:
            continue
        defaults = {}
        for name, attr in schema.attributes.items():
            serialized = getattr(attr, "_default_value", b"")  # (private: without it, no defaults)
            if serialized:
                defaults[name] = _attr_value(onnx.AttributeProto.FromString(serialized))
        found.setdefault((schema.domain, schema.name), []).append((schema.since_version, defaults))
    return found


def _attr_value(attr: onnx.AttributeProto):
    """Attribute values as rules want them: strings decoded, tensors left as protos."""
    value = helper.get_attribute_value(attr)
    if isinstance(value, bytes):
        return value.decode()
    if isinstance(value, list) and value and isinstance(value[0], bytes):
        return [v.decode() for v in value]
    return value


def _opaque(ctx: Lowering, node, inputs, expected, model) -> list[str]:
    """Keep the node whole: a one-node ONNX model that ONNX Runtime runs as its own kernel."""
    if any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in node.attribute):
        raise KorchError("control flow operators are not supported")
    # each input its own name, none an output's: a node may take one tensor twice (QLinearConcat's
    # scales)
    prefix = "in"
    while any(o.startswith(prefix) for o in node.output):
        prefix += "_"
    names = [f"{prefix}{i}" if v is not None else "" for i, v in enumerate(inputs)]
    present = [(n, v) for n, v in zip(names, inputs) if v is not None]
    constant = bool(present) and all(ctx.const_value(v) is not None for _, v in present)
    if not constant and node.domain in DEFAULT_DOMAINS and node.op_type in DATA_DEPENDENT_SHAPES:
        raise KorchError(
            "the shape of its output depends on its inputs' values, which korch's plans of "
            "static-shaped kernels cannot hold; cut the model before it (onnx.utils.extract_model)"
        )
    in_infos = [
        helper.make_tensor_value_info(n, to_onnx_dtype(ctx.dtype(v)), ctx.shape(v)) for n, v in present
    ]
    out_infos = [onnx.ValueInfoProto(name=o) for o in node.output if o]
    alone = onnx.NodeProto()
    alone.CopyFrom(node)
    alone.ClearField("input")
    alone.input.extend(names)
    one = helper.make_model(
        helper.make_graph([alone], "opaque", in_infos, out_infos),
        opset_imports=list(model.opset_import),
        ir_version=model.ir_version,
    )
    blob = one.SerializeToString()
    try:
        from korch.ir.numpy_ops import _opaque_session

        _opaque_session(blob)
    except Exception as e:
        raise KorchError(f"ONNX Runtime cannot run this operator either: {error_line(e)}") from None
    wanted = [o for o in node.output if o]  # an optional output left out has no name, and no value
    out_types = [expected.get(o) for o in wanted]
    if constant or None in out_types:
        # run it once: constant inputs fold here; otherwise the run tells the output types
        feeds = [
            ctx.const_value(v) if ctx.const_value(v) is not None else _ones(ctx.type(v)) for _, v in present
        ]
        try:
            results = Prim.OPAQUE.ref(feeds, {"model": blob})
        except Exception as e:
            raise KorchError(f"cannot determine the output types: {error_line(e)}") from None
        if constant:
            return _by_output(node, [ctx.const(r) for r in results])
        out_types = [t or TensorType.of(np.asarray(r)) for t, r in zip(out_types, results)]
    values = ctx.emit_multi(
        Prim.OPAQUE,
        [v for _, v in present],
        len(out_types),
        model=blob,
        op_type=node.op_type,
        in_types=[(ctx.shape(v), ctx.dtype(v)) for _, v in present],
        out_types=[(t.shape, t.dtype) for t in out_types],
    )
    return _by_output(node, values)


def _by_output(node, values: list[str]) -> list[str | None]:
    """The values of a node's named outputs, in the places of node.output (None where unnamed)."""
    it = iter(values)
    return [next(it) if o else None for o in node.output]


def _ones(t: TensorType) -> np.ndarray:
    """Probe input: ones, since zeros trap integer division and modulo."""
    if math.prod(t.shape) > 2**26:
        raise KorchError(f"opaque operator input {t} is too large to probe")
    return np.ones(t.shape, dtype=t.dtype)
