"""What the solver turned down: for each chosen kernel, the cheapest other ways to run its primitives."""

from __future__ import annotations

import math
from collections import defaultdict

from korch.config import SPLIT_LIMIT, TOP
from korch.search.candidates import Candidate


def _entry(what: str, ms: float, backend: str | None, kernels: int, nodes: int) -> dict:
    return {"what": what, "ms": round(ms, 6), "backend": backend, "kernels": kernels, "primitives": nodes}


def _other_backends(chosen, profiles) -> list[dict]:
    out = []
    for name, prof in profiles.profiles.get(chosen.candidate.key, {}).items():
        if name != chosen.backend and math.isfinite(prof.cost_ms):
            n = len(chosen.candidate.nodes)
            out.append(_entry(f"same primitives on {name}", prof.cost_ms, name, 1, n))
    return out


def _split(nodes: tuple[int, ...], parts: list[Candidate], cost) -> dict | None:
    """The cheapest way to cover exactly these primitives with two or more smaller candidates
    (dynamic programming over covered subsets: the lowest uncovered primitive picks its kernel)."""
    if len(nodes) > SPLIT_LIMIT:
        return _greedy_cover(nodes, parts, cost)
    if len(nodes) < 2:
        return None
    bit = {n: 1 << i for i, n in enumerate(nodes)}
    by_low: dict[int, list[tuple[int, float, str]]] = defaultdict(list)
    for c in parts:
        ms, backend = cost(c.key)
        if math.isfinite(ms) and len(c.nodes) < len(nodes):
            mask = sum(bit[n] for n in c.nodes)
            by_low[(mask & -mask).bit_length() - 1].append((mask, ms, backend))
    full = (1 << len(nodes)) - 1
    best: dict[int, tuple[float, list[str]]] = {0: (0.0, [])}
    for mask in range(full):  # every part adds bits, so masks only grow: increasing order is safe
        if mask not in best:
            continue
        low = ((~mask) & (mask + 1)).bit_length() - 1
        here, used = best[mask]
        for part, ms, backend in by_low.get(low, []):
            if part & mask == 0 and here + ms < best.get(mask | part, (math.inf,))[0]:
                best[mask | part] = (here + ms, [*used, backend])
    if full not in best:
        return None
    ms, used = best[full]
    counts = ", ".join(f"{used.count(b)} {b}" for b in sorted(set(used)))
    return _entry(f"split into {len(used)} smaller kernels ({counts})", ms, None, len(used), len(nodes))


def _greedy_cover(nodes: tuple[int, ...], parts: list[Candidate], cost) -> dict | None:
    """For large kernels (whole partitions): disjoint smaller candidates, cheapest per primitive
    first, an upper bound on running the same primitives as smaller kernels."""
    priced = [(cost(c.key), c) for c in parts]
    priced = [(ms / len(c.nodes), ms, b, c) for (ms, b), c in priced if math.isfinite(ms)]
    covered: set[int] = set()
    total, used = 0.0, []
    for _, ms, backend, c in sorted(priced, key=lambda p: (p[0], -len(p[3].nodes))):
        if not covered.intersection(c.nodes):
            covered.update(c.nodes)
            total += ms
            used.append(backend)
    if covered != set(nodes):
        return None
    return _entry(f"greedy cover by {len(used)} smaller kernels", total, None, len(used), len(nodes))


def _unfused(nodes: tuple[int, ...], singles: dict[int, Candidate], cost) -> dict | None:
    if len(nodes) < 2 or not all(n in singles for n in nodes):
        return None
    total = sum(cost(singles[n].key)[0] for n in nodes)
    if not math.isfinite(total):
        return None
    return _entry("each primitive alone", total, None, len(nodes), len(nodes))


def _overlapping(chosen, others: list[Candidate], cost) -> list[dict]:
    """Other kernels that start at the same primitive but cover a different set."""
    mine = set(chosen.candidate.nodes)
    out = []
    for c in others:
        ms, backend = cost(c.key)
        if math.isfinite(ms):
            shared = len(mine.intersection(c.nodes))
            what = f"other kernel: {shared} of these primitives + {len(c.nodes) - shared} others"
            out.append(_entry(what, ms, backend, 1, len(c.nodes)))
    return sorted(out, key=lambda e: e["ms"])


def rejected_alternatives(
    solution, candidates: list[Candidate], profiles, top: int = TOP
) -> list[list[dict]]:
    """Per chosen kernel (in plan order) up to `top` alternatives, cheapest first: ways to run the
    same primitives (another backend, smaller kernels, one kernel per primitive), then other
    candidates containing its first primitive. `profiles` is a korch.profile.profiler.ProfileResult."""
    cost = profiles.cost
    owner: dict[int, list[int]] = defaultdict(list)  # primitive -> chosen kernels holding it
    for i, ch in enumerate(solution.chosen):
        for n in ch.candidate.nodes:
            owner[n].append(i)
    inside: dict[int, list[Candidate]] = defaultdict(list)  # strict subsets of chosen kernels
    starting: dict[int, list[Candidate]] = defaultdict(list)  # other sets with a kernel's first node
    singles: dict[int, Candidate] = {}
    sets = [frozenset(ch.candidate.nodes) for ch in solution.chosen]
    firsts = {min(s): i for i, s in enumerate(sets) if s}
    for c in (c for c in candidates if c.nodes):
        nodes = frozenset(c.nodes)
        if len(nodes) == 1:
            singles.setdefault(c.nodes[0], c)
        for i in owner.get(c.nodes[0], []):
            if nodes < sets[i]:
                inside[i].append(c)
        for i in {firsts[n] for n in nodes if n in firsts}:
            if not nodes <= sets[i]:  # subsets are priced by the split above
                starting[i].append(c)
    result = []
    for i, ch in enumerate(solution.chosen):
        nodes = tuple(sorted(ch.candidate.nodes))
        same = _other_backends(ch, profiles)
        same += [e for e in (_split(nodes, inside[i], cost), _unfused(nodes, singles, cost)) if e]
        same.sort(key=lambda e: e["ms"])
        result.append((same + _overlapping(ch, starting[i], cost))[:top])
    return result
