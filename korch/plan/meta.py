"""What korch.optimize recorded about a plan (PlanMeta): its provenance and the reports that the CLI,
`korch explain` and the runtime read, kept as plan.json's "meta" object and read back whole."""

from __future__ import annotations

import dataclasses
import functools
import platform
import types
import typing
from dataclasses import dataclass, field
from typing import Any

from korch.config import VERSION
from korch.errors import KorchError

RERUN = "re-run `korch optimize` to make it again"


@dataclass
class PlanMeta:
    """A plan assembled by hand (not by korch.optimize) keeps the empty defaults."""

    # korch, torch, onnxruntime, onnx, numpy and "backend:NAME": the versions the plan was built with
    versions: dict[str, str] = field(default_factory=dict)
    device_name: str | None = None  # the device it was profiled on (korch.measure.device.device_name)
    python: str = field(default_factory=platform.python_version)  # the Python version that built it
    # source ("onnx" or "torch"), onnx_nodes or aten_nodes, primitives, opaque_ops
    fission: dict[str, Any] = field(default_factory=dict)
    rewrites: list[str] = field(default_factory=list)  # one line per rewrite of the primitive graph
    candidates: dict[str, Any] = field(default_factory=dict)  # the enumeration's summary, with "seeds"
    profiling: dict[str, Any] = field(default_factory=dict)  # the profiler's: profiled, cache_hits, ...
    solver: dict[str, Any] = field(default_factory=dict)  # the selection's summary: status, gap, ...
    greedy_ms: float | None = None  # the greedy fusion baseline's predicted time; None: no baseline
    greedy_kernels: int | None = None  # the greedy baseline's kernels
    ceilings: dict[str, float] = field(default_factory=dict)  # the device's measured copy and matmul rates
    input_bounds: dict[str, list] = field(default_factory=dict)  # integer input -> [low, high(, "sorted")]
    index_limits: dict[str, int] = field(default_factory=dict)  # integer input -> the size it indexes
    alternatives: list[list[dict[str, Any]]] = field(default_factory=list)  # per kernel, what was rejected
    search: dict[str, Any] | None = None  # the search with bounds' summary (optimize --json's "search")
    decided_by: str | None = None  # what the plan is: "source-model", "whole-graph" or "solver"
    seconds: float | None = None  # optimize's wall time
    measured: dict[str, Any] | None = None  # the plan run whole, each kernel timed in place
    refine: list[dict[str, Any]] = field(default_factory=list)  # each plan measured in place while refining
    runoff: dict[str, Any] | None = None  # the side-by-side runoff of the plans measured close, if any
    extra_ms_per_kernel: dict[str, float] = field(default_factory=dict)  # backend -> ms added per kernel

    def to_json(self) -> dict:
        return dataclasses.asdict(self)

    @staticmethod
    def from_json(doc) -> PlanMeta:
        """The metadata plan.json holds: every field, no other, each of its type; else refused
        with one line (a plan of an older korch lacks some or has others)."""
        if not isinstance(doc, dict):
            raise KorchError(f"plan metadata is {_kind(doc)}, not an object; {RERUN}")
        hints = _hints()
        missing = [name for name in hints if name not in doc]
        unknown = sorted(set(doc) - set(hints))
        if missing or unknown:
            what = [f"lacks {', '.join(missing)}"] if missing else []
            what += [f"has unknown fields {', '.join(map(str, unknown))}"] if unknown else []
            raise KorchError(f"plan metadata {' and '.join(what)}; {RERUN}")
        for name, hint in hints.items():
            if not _fits(doc[name], hint):
                raise KorchError(f"plan metadata {name} is not of type {_shown(hint)}; {RERUN}")
        return PlanMeta(**doc)


@functools.cache
def _hints() -> dict[str, Any]:
    """Field name -> its type, in the order of the fields."""
    hints = typing.get_type_hints(PlanMeta)
    return {f.name: hints[f.name] for f in dataclasses.fields(PlanMeta)}


def _fits(value, hint) -> bool:
    """Whether a JSON value has the type `hint` (int for float; dicts' keys are strings in JSON)."""
    if hint is Any:
        return True
    args = typing.get_args(hint)
    if isinstance(hint, types.UnionType):
        return any(_fits(value, h) for h in args)
    if hint is type(None):
        return value is None
    base = typing.get_origin(hint) or hint
    if isinstance(value, bool):
        return base is bool
    if base is float:
        return isinstance(value, (int, float))
    if not isinstance(value, base):
        return False
    if base is dict and args:
        return all(_fits(v, args[1]) for v in value.values())
    if base is list and args:
        return all(_fits(v, args[0]) for v in value)
    return True


def _shown(hint) -> str:
    return str(hint).replace("typing.", "")


def _kind(value) -> str:
    return "null" if value is None else f"a {type(value).__name__}"


def built_with(backends) -> dict[str, str]:
    """The versions a plan made with `backends` (Backend objects) records (PlanMeta.versions)."""
    import numpy
    import onnx
    import onnxruntime
    import torch

    out = {
        "korch": VERSION,
        "torch": torch.__version__,
        "onnxruntime": onnxruntime.__version__,
        "onnx": onnx.__version__,
        "numpy": numpy.__version__,
    }
    out.update({f"backend:{b.name}": b.version() for b in backends})
    return out
