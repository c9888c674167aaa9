"""Legality: can one kernel run this set of primitives? Every rejection carries a named reason."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from korch.ir.prims import Kind


@dataclass(frozen=True)
class LegalityOptions:
    max_reductions: int = 2  # softmax and layer norm need two
    max_outputs: int = 4


# Reasons that hold for every superset too: enumeration stops growing a set that has one.
MONOTONE_REASONS = (
    "opaque-fused",
    "multiple-linear",
    "linear-with-reduce",
    "linear-with-layout",
    "too-many-reductions",
)


def monotone_reason(kinds: Counter, options: LegalityOptions) -> str | None:
    """Rules that no larger set can repair, checked from the kind histogram of the set."""
    size = sum(kinds.values())
    if kinds[Kind.OPAQUE] and size > 1:
        return "opaque-fused"  # an opaque operator runs whole, in ONNX Runtime, alone
    if kinds[Kind.LINEAR] > 1:
        return "multiple-linear"
    if kinds[Kind.LINEAR]:
        # a linear primitive carries elementwise/broadcast prologues and epilogues only
        if kinds[Kind.REDUCE]:
            return "linear-with-reduce"
        if kinds[Kind.LAYOUT]:
            return "linear-with-layout"
    if kinds[Kind.REDUCE] > options.max_reductions:
        return "too-many-reductions"
    return None


def final_reason(n_outputs: int, options: LegalityOptions) -> str | None:
    """Rules on the finished set that a larger set might still satisfy."""
    if n_outputs > options.max_outputs:
        return "too-many-outputs"
    return None
