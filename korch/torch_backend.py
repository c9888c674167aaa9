"""The torch.compile backend "korch": each Dynamo graph becomes a plan; eager on any korch failure."""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import fields

import torch

from korch.backends.inductor import outside_dynamo
from korch.errors import KorchError, error_line
from korch.pipeline import OptimizeOptions

# torch.compile options={...} keys, with the defaults the backend uses (a short profiling budget)
DEFAULTS = {"time_budget": 30.0, "progress": False, "freeze": True}
_OPTION_NAMES = {f.name for f in fields(OptimizeOptions)} | {"freeze"}


def korch_backend(gm: torch.fx.GraphModule, example_inputs: Sequence, options: dict | None = None, **_):
    """Dynamo backend: `torch.compile(model, backend="korch", options={"time_budget": 60})`.
    Parameters and buffers are frozen into the plan as constants (options={"freeze": False} keeps
    them as inputs), except those the graph writes in place (a KV cache): the plan returns their
    new values, copied back after each call. Graphs korch cannot lower run eagerly, with one warning each."""
    opts = _options(options, example_inputs)
    try:
        with outside_dynamo():
            return compile_graph(gm, list(example_inputs), opts)
    except Exception as e:  # korch must never break the user's program: eager is always correct
        warnings.warn(
            f"korch: running this graph eagerly ({type(e).__name__}: {error_line(e)})", stacklevel=2
        )
        return gm.forward


def _options(options: dict | None, example_inputs: Sequence) -> dict:
    opts = {**DEFAULTS, **(options or {})}
    unknown = sorted(set(opts) - _OPTION_NAMES)
    if unknown:
        raise TypeError(f"unknown korch options {unknown}; known: {sorted(_OPTION_NAMES)}")
    if "device" not in opts:
        cuda = any(isinstance(x, torch.Tensor) and x.is_cuda for x in example_inputs)
        opts["device"] = "cuda" if cuda else "cpu"
    return opts


def weight_positions(gm: torch.fx.GraphModule, example_inputs: Sequence) -> list[int]:
    """Inputs Dynamo lifted from the module: parameters and buffers (by their source names)."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    positions = []
    for i, (node, value) in enumerate(zip(placeholders, example_inputs)):
        source = getattr(node.meta.get("grapharg"), "source", None)
        name = source.name if source is not None else ""
        if isinstance(value, torch.nn.Parameter) or "._buffers[" in name or "._parameters[" in name:
            positions.append(i)
    return positions


def compile_graph(gm: torch.fx.GraphModule, example_inputs: list, opts: dict):
    """Lower, optimize and wrap one Dynamo graph; raises on anything korch cannot do."""
    from torch._subclasses.fake_tensor import is_fake

    from korch.frontend.torch.importer import export, import_exported, written_inputs
    from korch.pipeline import optimize_fission

    # a plan is built for fixed shapes and profiled on real values
    if not all(isinstance(x, torch.Tensor) and not is_fake(x) for x in example_inputs):
        raise KorchError("symbolic, fake or non-tensor graph inputs (compile with dynamic=False)")
    if torch.is_grad_enabled() and any(x.requires_grad for x in example_inputs):
        raise KorchError("korch compiles inference graphs; use torch.no_grad() or requires_grad_(False)")
    ep = export(gm, example_inputs)
    # an input the graph writes (a KV cache, a running count) is run-time state, never frozen;
    # the plan returns its new value and `run` copies it back, as eager would have left it
    written = [position for position, _ in written_inputs(ep)]
    freeze = opts.pop("freeze")
    frozen = [i for i in weight_positions(gm, example_inputs) if i not in written] if freeze else []
    fission = import_exported(ep, {i: example_inputs[i] for i in frozen}, writes_inputs=True)
    plan = optimize_fission(fission, OptimizeOptions(**opts))
    executable = plan.executable()
    live = [i for i in range(len(example_inputs)) if i not in set(frozen)]
    names = list(fission.graph.inputs)
    as_list = isinstance(gm.graph.output_node().args[0], list)
    returned = len(fission.graph.outputs) - len(written)

    def run(*args):
        outs = executable.run_owned({n: args[i].contiguous() for n, i in zip(names, live)})
        for position, value in zip(written, outs[returned:]):
            args[position].copy_(value)
        outs = outs[:returned]
        return list(outs) if as_list else tuple(outs)

    run.plan = plan  # for inspection and tests
    return run
