"""ONNX control flow lowered at import: an If whose condition folds is the branch it takes, and a
Loop or Scan whose iterations the pinned shapes and folded values fix is unrolled (as korch unrolls
LSTM and GRU). Anything decided at run time is refused. Each body is lowered in place by the
importer (`lower`), reading the enclosing graph's values."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import onnx
from onnx import helper, numpy_helper

from korch.config import MAX_UNROLL
from korch.errors import KorchError, Unsupported
from korch.frontend.lowering import Lowering

LowerNodes = Callable[[list, dict], None]  # (nodes, ONNX name -> value): lowers them, naming their outputs


def lower_if(ctx: Lowering, node, env: dict[str, str], lower: LowerNodes, version: int) -> list[str]:
    """An If whose condition is known at import (a constant, or folded from pinned shapes or
    pinned input values) is the branch it takes: its nodes are lowered in place, reading the
    enclosing graph's values. A condition known only at run time is refused."""
    if not node.input or node.input[0] not in env:
        raise KorchError("its condition is not defined before this node")
    cond = ctx.const_value(env[node.input[0]])
    if cond is None:
        raise KorchError(
            f"its condition {node.input[0]!r} is known only at run time: korch takes the branch of an If "
            "whose condition folds to a constant (pin the inputs it depends on: --value NAME=V on the "
            "command line, values={'NAME': V} in Python)"
        )
    if np.size(cond) != 1:
        raise KorchError(f"its condition {node.input[0]!r} has {np.size(cond)} elements, not one")
    taken = "then_branch" if bool(np.asarray(cond).reshape(())) else "else_branch"
    branch = next((a.g for a in node.attribute if a.name == taken), None)
    if branch is None:
        raise KorchError(f"it has no {taken}")
    if len(branch.output) != len(node.output):
        raise KorchError(f"its {taken} has {len(branch.output)} outputs, the node {len(node.output)}")
    return _run_body(ctx, branch, env, [], lower)


def lower_loop(ctx: Lowering, node, env: dict[str, str], lower: LowerNodes, version: int) -> list[str]:
    """A Loop whose trip count and condition are known at import, and whose body's condition
    folds in every iteration, is its body unrolled (as korch unrolls LSTM and GRU): each iteration
    lowered in place with its number and carried values, the scan outputs stacked along a new
    first axis. Anything decided at run time is refused."""
    ins = list(node.input) + [""] * (2 - len(node.input))
    if any(n and n not in env for n in ins):
        raise KorchError(
            f"input {next(n for n in ins if n and n not in env)!r} is not defined before this node"
        )
    known = [ctx.const_value(env[n]) if n else None for n in ins[:2]]
    if any(n and k is None for n, k in zip(ins[:2], known)):
        raise KorchError(
            "its trip count or condition is known only at run time; korch unrolls loops it can count"
        )
    if not ins[0] and not ins[1]:
        raise KorchError("it has neither a trip count nor a condition: it would never end")
    if any(k is not None and np.size(k) != 1 for k in known):
        raise KorchError("its trip count and condition must hold one element each")
    trips = int(np.asarray(known[0]).reshape(())) if ins[0] else MAX_UNROLL + 1
    going = bool(np.asarray(known[1]).reshape(())) if ins[1] else True
    body = next((a.g for a in node.attribute if a.name == "body"), None)
    carried = [env[v] for v in ins[2:]]
    if body is None or len(body.input) != 2 + len(carried) or len(body.output) < 1 + len(carried):
        raise KorchError("its body does not match its inputs")
    scans: list[list[str]] = [[] for _ in body.output[1 + len(carried) :]]
    i = 0
    while going and i < trips:
        if i == MAX_UNROLL:
            raise KorchError(f"it runs more than {MAX_UNROLL} iterations: too many to unroll")
        number, condition = _scalar_like(body.input[0], np.int64(i)), _scalar_like(body.input[1], going)
        outs = _run_body(ctx, body, env, [ctx.const(number), ctx.const(condition), *carried], lower)
        going = ctx.const_value(outs[0])
        if going is None:
            raise KorchError(f"its condition is known only at run time after iteration {i}")
        going, carried, i = bool(np.asarray(going).reshape(())), outs[1 : 1 + len(carried)], i + 1
        for stack, v in zip(scans, outs[1 + len(carried) :]):
            stack.append(v)
    return carried + [_stack(ctx, stack, 0, False) for stack in scans]


def lower_scan(ctx: Lowering, node, env: dict[str, str], lower: LowerNodes, version: int) -> list[str]:
    """A Scan (opset 9 on) runs its body once per position along its scan inputs' axes, whose
    lengths the pinned shapes fix: it is unrolled, each scan input sliced at the position (from
    the end when its direction is 1), the scan outputs stacked along their axes."""
    if version < 9:
        raise Unsupported("Scan before opset 9 (a batch axis of its own) is not lowered")
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    body, m = attrs["body"], attrs["num_scan_inputs"]
    if any(n not in env for n in node.input):
        raise KorchError("an input is not defined before this node")
    values = [env[n] for n in node.input]
    if not 0 < m <= len(values):
        raise KorchError(f"num_scan_inputs is {m}, and it has {len(values)} inputs")
    states, xs = values[: len(values) - m], values[len(values) - m :]
    if any(ctx.rank(x) == 0 for x in xs):
        raise KorchError("a scan input is a scalar: it has no axis to scan")
    n_scans = len(body.output) - len(states)
    in_axes = [a % ctx.rank(x) for a, x in zip(attrs.get("scan_input_axes", [0] * m), xs)]
    in_back = attrs.get("scan_input_directions", [0] * m)
    out_back = attrs.get("scan_output_directions", [0] * n_scans)
    lengths = {ctx.shape(x)[a] for x, a in zip(xs, in_axes)}
    if len(lengths) != 1 or len(body.input) != len(values) or n_scans < 0:
        raise KorchError(f"its scan inputs' lengths {sorted(lengths)} or its body do not match")
    (length,) = lengths
    if length > MAX_UNROLL:
        raise KorchError(f"it runs {length} iterations, more than the {MAX_UNROLL} korch unrolls")
    scans: list[list[str]] = [[] for _ in range(n_scans)]
    for t in range(length):
        slices = []
        for x, axis, back in zip(xs, in_axes, in_back):
            piece = ctx.slice_axis(x, axis, length - 1 - t if back else t, 1)
            slices.append(ctx.reshape(piece, [d for i, d in enumerate(ctx.shape(piece)) if i != axis]))
        outs = _run_body(ctx, body, env, states + slices, lower)
        states = outs[: len(states)]
        for stack, v in zip(scans, outs[len(states) :]):
            stack.append(v)
    out_axes = attrs.get("scan_output_axes", [0] * n_scans)
    return states + [_stack(ctx, *s) for s in zip(scans, out_axes, out_back)]


def _run_body(
    ctx: Lowering, body: onnx.GraphProto, env: dict, fed: list[str], lower: LowerNodes
) -> list[str]:
    """A branch's or an iteration's outputs: its nodes lowered where the enclosing graph's names,
    its own initializers and the values `fed` to its inputs, in order, are visible."""
    inner = dict(env)
    for init in body.initializer:
        inner[init.name] = ctx.b.const(numpy_helper.to_array(init))
    inner.update(zip((vi.name for vi in body.input), fed))
    lower(body.node, inner)
    missing = [o.name for o in body.output if o.name not in inner]
    if missing:
        raise KorchError(f"its {body.name or 'body'} never computes {missing}")
    return [inner[o.name] for o in body.output]


def _stack(ctx: Lowering, values: list[str], axis: int, backwards: bool) -> str:
    """One value per iteration, stacked along a new `axis` (last iteration first if backwards)."""
    if not values:
        raise KorchError("it runs no iteration, so its scan outputs have no shape to take")
    axis = axis % (ctx.rank(values[0]) + 1)
    rows = [ctx.reshape(v, (*ctx.shape(v)[:axis], 1, *ctx.shape(v)[axis:])) for v in values]
    return ctx.concat(rows[::-1] if backwards else rows, axis)


def _scalar_like(info: onnx.ValueInfoProto, value) -> np.ndarray:
    """A loop body's iteration number or condition in the shape its input declares (a scalar,
    or one element)."""
    tt = info.type.tensor_type
    rank = len(tt.shape.dim) if tt.HasField("shape") else 0
    return np.asarray(value).reshape((1,) * rank)


CONTROL_FLOW = {"If": lower_if, "Loop": lower_loop, "Scan": lower_scan}
