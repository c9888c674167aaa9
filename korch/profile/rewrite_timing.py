"""Timing a rewrite of the primitive graph on the target device: the rewrites (korch.rewrite) are
handed a RewriteTimer by korch.pipeline, and their decisions are kept in the profile database."""

from __future__ import annotations

import dataclasses
import hashlib
import math

import torch

from korch.backends.torch_ops import graph_function
from korch.ir.graph import Graph, to_text
from korch.measure.device import device_name, example_tensors
from korch.measure.heap import keep_heap
from korch.measure.timing import time_fn
from korch.profile.database import ProfileDB


def time_rewrite(before: Graph, after: Graph, device: str, rounds: int = 3) -> tuple[float, float]:
    """Milliseconds of two graphs computing the same thing (run op by op in PyTorch: the
    convolutions Inductor and the vendor backend call), each the fastest of interleaved rounds of
    the profiler's timer. If either fails to run (a dtype without a kernel, out of memory), the
    rewritten one counts as never faster."""
    keep_heap()  # timed as a plan would run them (korch.measure.heap)
    best = [float("inf"), float("inf")]
    try:
        inputs = example_tensors(before, device)
        fns = [graph_function(g, device) for g in (before, after)]
        with torch.no_grad():
            for _ in range(rounds):
                for k, fn in enumerate(fns):
                    best[k] = min(best[k], time_fn(fn, inputs, device, min_time=0.02)[0])
    except Exception:  # the rewrite is an optimization: never let it fail the optimize
        return 1.0, float("inf")
    return best[0], best[1]


class RewriteTimer:
    """Times a rewrite against the nodes it replaces on a device (`time_rewrite`): a
    korch.rewrite.common.Timing. Given a profile database, each timing is kept there under the
    pair's structure (weights' values aside), the torch version and the device, so a later
    optimize makes the same decision without timing again (a decision near the FASTER line would
    otherwise flip between runs and change every candidate key downstream). Timings that failed
    are not kept."""

    def __init__(self, device: str, db: ProfileDB | None = None):
        self.device = device
        self.db = db

    def __call__(self, before: Graph, after: Graph) -> tuple[float, float]:
        if self.db is None:
            return time_rewrite(before, after, self.device)
        where = (_pair_key(before, after), f"torch {torch.__version__}", device_name(self.device))
        kept = self.db.rewrite_timing(*where)
        if kept is not None:
            return kept
        ms = time_rewrite(before, after, self.device)
        if math.isfinite(ms[0]) and math.isfinite(ms[1]):
            self.db.store_rewrite_timing(*where, *ms)
        return ms


def _pair_key(before: Graph, after: Graph) -> str:
    text = "\n".join(to_text(dataclasses.replace(g, name="g")) for g in (before, after))
    return hashlib.sha256(text.encode()).hexdigest()[:24]
