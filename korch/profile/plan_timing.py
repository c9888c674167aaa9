"""What optimize measured of whole plans, kept in the profile database: each plan measured in place,
and each runoff between plans (korch.plan.refine). A later optimize that reaches the same plans on
the same prices (a warm run) takes these instead of compiling and running the plans again, so it
decides exactly as the run that measured them did."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Callable, Iterable

from korch.ir.graph import Graph, to_text
from korch.profile.database import ProfileDB


class PlanTimings:
    """The plan timings of one graph, in `db` under the versions and the device (with its thread
    count) the plans run with. Without a database nothing is kept and everything is measured."""

    def __init__(self, db: ProfileDB | None, graph: Graph, versions: dict, device: str):
        self.db = db
        self.version = json.dumps(versions, sort_keys=True)
        self.device = device
        text = to_text(dataclasses.replace(graph, name="g"))
        self._graph = hashlib.sha256(text.encode()).hexdigest()

    def plan_key(self, kernels: Iterable[tuple[str, str]]) -> str:
        """A plan of the graph, by its (kernel key, backend) pairs in any order."""
        lines = "\n".join(sorted(f"{key}\t{backend}" for key, backend in kernels))
        return "plan:" + hashlib.sha256(f"{self._graph}\n{lines}".encode()).hexdigest()[:32]

    def in_place(self, key: str, measure: Callable[[], dict]) -> tuple[dict, bool]:
        """(the plan's in-place measurement, whether it was kept from an earlier run): kept, or
        measured now by `measure` (korch.plan.runtime.measure_in_place) and kept."""
        return self._kept(key, measure, lambda m: (m["ms"], m["min_ms"]), ("ms", "min_ms", "kernels_ms"))

    def runoff(self, keys: list[str], run: Callable[[], dict]) -> tuple[dict, bool]:
        """(a runoff's report between the plans of `keys`, in that order; kept or run now)."""
        key = "runoff:" + hashlib.sha256("\n".join(keys).encode()).hexdigest()[:32]

        def winner(report: dict) -> tuple[float, float]:
            return report["medians_ms"][report["winner"]], report["min_ms"][report["winner"]]

        return self._kept(key, run, winner, ("winner", "medians_ms", "min_ms"))

    def _kept(
        self, key: str, measure: Callable[[], dict], numbers, fields: tuple[str, ...]
    ) -> tuple[dict, bool]:
        kept = self.db.plan_timing(key, self.version, self.device) if self.db is not None else None
        if kept is not None and all(f in kept for f in fields):  # (else written by something else)
            return kept, True
        result = measure()
        if self.db is not None:
            self.db.store_plan_timing(key, self.version, self.device, *numbers(result), result)
        return result, False
