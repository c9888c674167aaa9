"""PyTorch import: torch.export a module, decompose to core ATen, lower every ATen op to primitives."""

from __future__ import annotations

import contextlib
import logging
import operator
import warnings
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from korch.errors import KorchError, Unsupported, error_line
from korch.frontend.lowering import FissionResult, Lowering
from korch.frontend.torch import (  # noqa: F401  (registrations)
    rules_functions,
    rules_index,
    rules_math,
    rules_pool,
    rules_shape,
)
from korch.frontend.torch.aten import ATEN_RULES, AtenNode, TorchLowering, meta_type, torch_dtype_name
from korch.ir.graph import GraphBuilder, verify

# ops korch lowers itself better than their decompositions (one primitive instead of index
# arithmetic), or that torch decomposes into a graph it cannot run (attention: see its rule)
_KEEP = (
    "reflection_pad1d",
    "reflection_pad2d",
    "reflection_pad3d",
    "replication_pad1d",
    "replication_pad2d",
    "replication_pad3d",
    "mish",
    "softplus",
    "hardswish",
    "hardsigmoid",
    "scaled_dot_product_attention",
)


def decomposition_table() -> dict:
    """PyTorch's core ATen decompositions, minus the ops with a dedicated korch rule."""
    import torch

    table = torch.export.default_decompositions()
    for op in list(table):
        if op.name().split("::")[-1].split(".")[0] in _KEEP:
            del table[op]
    return table


def export(module, example_inputs: Sequence[Any]):
    """torch.export the module and decompose it; every failure is a one-line KorchError."""
    import torch

    try:
        with warnings.catch_warnings(), _quiet(FAKE_TENSOR_LOG):
            warnings.simplefilter("ignore")
            ep = torch.export.export(module, tuple(example_inputs))
            return ep.run_decompositions(decomposition_table())
    except Exception as e:
        raise KorchError(f"torch.export failed: {type(e).__name__}: {error_line(e)}") from None


# Logs a traceback (about 19 lines on stderr) for every meta kernel that fails, then re-raises:
# the error korch reports says the same in one line.
FAKE_TENSOR_LOG = "torch._subclasses.fake_tensor"


@contextlib.contextmanager
def _quiet(name: str) -> Iterator[None]:
    """Only critical records from the logger `name` while the block runs."""
    logger = logging.getLogger(name)
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        logger.setLevel(level)


def import_torch(
    module,
    example_inputs: Sequence[Any],
    frozen: Sequence[int] = (),
    output_names: Sequence[str] | None = None,
) -> FissionResult:
    """Export a module and lower it to a primitive graph. Parameters and buffers become constants,
    and so do the user inputs at the positions in `frozen` (weights Dynamo passes as inputs)."""
    ep = export(module, example_inputs)
    return import_exported(ep, {i: example_inputs[i] for i in frozen}, output_names, _training(module))


def import_exported(
    ep,
    frozen: dict[int, Any],
    output_names: Sequence[str] | None = None,
    training: bool | None = None,
    writes_inputs: bool = False,
) -> FissionResult:
    """Lower an ExportedProgram (already decomposed); `frozen` maps user-input positions to values.
    `training`: whether the exported module (or a submodule) was in training mode, None if unknown.

    Outputs are the leaves of what forward returns, in torch.utils._pytree flatten order (the
    order torch.export uses): tuples and lists in order, dicts by insertion order, depth first;
    `((a, b), {"k": c})` gives [a, b, c].

    A forward that writes to its inputs in place (a KV cache's `index_copy_`) is refused unless
    `writes_inputs`: then each written input's final value is one more output, after the user's,
    in the order of `written_inputs(ep)`, for the caller to copy back (korch.torch_backend)."""
    _refuse_training(ep, training)
    b = GraphBuilder()
    ctx = TorchLowering(b)
    env = _placeholders(ep, b, frozen)
    count = 0
    for node in ep.graph_module.graph.nodes:
        if node.op != "call_function":
            continue
        count += 1
        b.origin = f"{_op_name(node.target)}:{node.name}"
        env[node.name] = _lower(ctx, node, env)
    outputs = _user_outputs(ep, env, writes_inputs)
    names = list(
        output_names or (["output"] if len(outputs) == 1 else [f"output{i}" for i in range(len(outputs))])
    )
    if len(names) != len(outputs):
        raise KorchError(f"{len(names)} output names for {len(outputs)} outputs")
    for position, value in written_inputs(ep) if writes_inputs else []:
        if position in frozen:
            raise KorchError(f"input {position} is written in place, so it cannot be frozen")
        outputs.append(env[value])
        names.append(f"written_input{position}")
    values = [o if isinstance(o, str) else ctx.const(np.asarray(o)) for o in outputs]
    graph = b.build(values, names, name=type(ep.module()).__name__ or "main")
    verify(graph)
    return FissionResult(graph, None, count, source="torch")


def _training(module) -> bool | None:
    """Whether any submodule is in training mode; None for an FX graph (a Dynamo graph's own flag
    says nothing about the module it was traced from)."""
    import torch.fx

    if isinstance(module, torch.fx.GraphModule) or not hasattr(module, "modules"):
        return None
    return any(m.training for m in module.modules())


# ATen ops that compute something else in training mode than in inference, by the flag that says
# so: dropout's random masks, batch norm's batch statistics (and running-stat updates), RReLU's
# random slopes. A batch norm without running statistics uses batch statistics in both modes.
_TRAINING_OPS = {
    "aten.native_dropout.default": ("dropout", "train"),
    "aten._native_batch_norm_legit_functional.default": ("normalization by batch statistics", "training"),
    "aten._native_batch_norm_legit.default": ("normalization by batch statistics", "training"),
    "aten.native_batch_norm.default": ("normalization by batch statistics", "training"),
    "aten.rrelu_with_noise.default": ("RReLU with random slopes", "training"),
    "aten.rrelu_with_noise_functional.default": ("RReLU with random slopes", "training"),
}


def _refuse_training(ep, training: bool | None) -> None:
    """A one-line error naming the fix when the program computes in training mode; checked before
    lowering, so it wins over "no korch lowering" and over the running-stat buffer writes."""
    for node in ep.graph_module.graph.nodes:
        if node.op != "call_function" or getattr(node.target, "_schema", None) is None:
            continue
        name = _op_name(node.target)
        what, flag = _TRAINING_OPS.get(name, (None, None))
        if what is not None:
            if not _arg(node, flag) or ("batch_norm" in name and _arg(node, "running_mean") is None):
                continue
        elif name.startswith("aten.bernoulli.") and training is not False:
            what = "random dropout masks"  # Dropout2d/3d, AlphaDropout, FeatureAlphaDropout
        else:
            continue
        if training is False:
            raise KorchError(
                f"{what} runs in training mode ({name}) though the module is in eval "
                "mode (a functional call with training=True?); korch optimizes inference"
            )
        raise KorchError(
            f"the module is in training mode ({what}: {name}); korch optimizes "
            "inference: call module.eval() first"
        )


def _arg(node, name: str) -> Any:
    """An FX call's argument by its schema name (positional, keyword or default)."""
    for i, arg in enumerate(node.target._schema.arguments):
        if arg.name == name:
            if i < len(node.args):
                return node.args[i]
            if name in node.kwargs:
                return node.kwargs[name]
            return arg.default_value if arg.has_default_value() else None
    return None


def _placeholders(ep, b: GraphBuilder, frozen: dict[int, Any]) -> dict[str, Any]:
    from torch.export.graph_signature import InputKind

    env: dict[str, Any] = {}
    state = {**ep.state_dict, **ep.constants}
    placeholders = {n.name: n for n in ep.graph_module.graph.nodes if n.op == "placeholder"}
    user_index = 0
    for spec in ep.graph_signature.input_specs:
        name = spec.arg.name
        node = placeholders[name]
        if spec.kind == InputKind.USER_INPUT:
            val = node.meta.get("val")
            ttype = meta_type(val)
            if ttype is None:
                raise KorchError(f"input {name!r} is not a tensor ({type(val).__name__})")
            if user_index in frozen:
                env[name] = b.const(_to_numpy(frozen[user_index]))
            else:
                env[name] = b.input(name, ttype)
            user_index += 1
        elif spec.kind in (InputKind.PARAMETER, InputKind.BUFFER, InputKind.CONSTANT_TENSOR):
            env[name] = b.const(_to_numpy(state[spec.target]))
        elif "Generator" in getattr(spec.arg, "class_fqn", ""):
            raise KorchError("forward uses a torch.Generator: random numbers are not supported")
        else:
            raise KorchError(f"unsupported exported input kind {spec.kind.name} ({name})")
    return env


def _to_numpy(tensor) -> np.ndarray:
    from korch.ir.tensors import to_numpy

    torch_dtype_name(tensor.dtype)
    return to_numpy(tensor.contiguous()).copy()


def written_inputs(ep) -> list[tuple[int, str]]:
    """(position, name of the final value) of each user input forward writes in place."""
    from torch.export.graph_signature import InputKind, OutputKind

    users = [s.arg.name for s in ep.graph_signature.input_specs if s.kind == InputKind.USER_INPUT]
    return [
        (users.index(s.target), s.arg.name)
        for s in ep.graph_signature.output_specs
        if s.kind == OutputKind.USER_INPUT_MUTATION
    ]


def _user_outputs(ep, env, writes_inputs: bool = False) -> list[Any]:
    from torch.export.graph_signature import OutputKind

    outs = []
    for spec in ep.graph_signature.output_specs:
        if spec.kind == OutputKind.BUFFER_MUTATION:
            raise KorchError(
                f"the module writes to its buffer {spec.target!r} during forward (a plan is a "
                "pure function): compile it with torch.compile(module, backend='korch'), which "
                "writes the new value back, or return the new value as an output"
            )
        if spec.kind == OutputKind.PARAMETER_MUTATION:
            raise KorchError(
                f"the module writes to its parameter {spec.target!r} during forward (korch "
                "compiles pure functions); not supported"
            )
        if spec.kind == OutputKind.USER_INPUT_MUTATION:
            if writes_inputs:
                continue
            raise KorchError(
                f"the module writes to its input {spec.target!r} in place during forward (korch "
                "compiles pure functions); use an out-of-place op (x = x * 2, not x.mul_(2))"
            )
        if spec.kind != OutputKind.USER_OUTPUT:
            raise KorchError(
                f"the exported program has a {spec.kind.name.lower()} output ({spec.target}); "
                "korch compiles inference graphs"
            )
        arg = spec.arg
        value = env.get(arg.name) if hasattr(arg, "name") else getattr(arg, "value", None)
        if value is None:
            raise KorchError(f"output {arg} is not a tensor")
        outs.append(value)
    return outs


def _op_name(target) -> str:
    if target is operator.getitem:
        return "getitem"
    import torch

    name = str(target)  # an OpOverload names its namespace: aten.add.Tensor, transformers.x.default
    return name if isinstance(target, torch._ops.OpOverload) else getattr(target, "__name__", name)


def _map_arg(a, env):
    import torch.fx

    if isinstance(a, torch.fx.Node):
        return env[a.name]
    if isinstance(a, (list, tuple)):
        return type(a)(_map_arg(x, env) for x in a)
    return a


def _lower(ctx: Lowering, node, env) -> Any:
    name = _op_name(node.target)
    if name == "getitem":
        values, index = _map_arg(node.args[0], env), node.args[1]
        if values[index] is None:
            raise KorchError(f"output {index} of {node.args[0].name} is not supported")
        return values[index]
    rule = ATEN_RULES.get(name)
    if rule is None:
        kind = "ATen operator" if name.startswith("aten.") else "operator"
        raise KorchError(f"{kind} {name} has no korch lowering")
    aten_node = _aten_node(node, name, env)
    try:
        result = rule(ctx, aten_node)
    except (KorchError, Unsupported) as e:
        raise KorchError(f"{name} ({node.name}): {e}") from None
    _check_types(name, node, result, aten_node.out_types, ctx)
    return result


def _aten_node(node, name: str, env) -> AtenNode:
    import torch.fx

    schema = node.target._schema
    params: dict[str, Any] = {}
    vals: dict[str, Any] = {}
    for i, arg in enumerate(schema.arguments):
        if i < len(node.args):
            raw = node.args[i]
        elif arg.name in node.kwargs:
            raw = node.kwargs[arg.name]
        else:
            raw = arg.default_value if arg.has_default_value() else None
        params[arg.name] = _map_arg(raw, env)
        if isinstance(raw, torch.fx.Node):
            vals[arg.name] = raw.meta.get("val")
    val = node.meta.get("val")
    outs = list(val) if isinstance(val, (list, tuple)) else [val]
    return AtenNode(name, params, [meta_type(v) for v in outs], vals, node.target, node)


def _check_types(name, node, result, want, ctx: Lowering) -> None:
    """torch's fake-tensor types are the oracle: a lowering that disagrees is a korch bug."""
    got = result if isinstance(result, (list, tuple)) else [result]
    for g, w in zip(got, want):
        if isinstance(g, str) and w is not None and ctx.type(g) != w:
            raise KorchError(f"{name} ({node.name}): lowered to {ctx.type(g)}, torch says {w}")
