"""Candidate enumeration against brute force on random DAGs, plus keys and partitioning."""

import itertools
from collections import Counter

import numpy as np
import pytest

from korch.ir.graph import GraphBuilder
from korch.ir.prims import Kind, Prim, TensorType
from korch.search.candidates import CandidateOptions, _KeyMaker, enumerate_candidates, is_convex
from korch.search.legality import LegalityOptions, final_reason, monotone_reason
from korch.search.partition import PartitionOptions, partition

T = TensorType((4, 4), "float32")


def random_graph(seed, n_ops=9):
    """A random DAG over 4x4 tensors mixing elementwise, reduce(+broadcast), layout and linear."""
    rng = np.random.default_rng(seed)
    b = GraphBuilder()
    values = [b.input("x", T), b.input("y", T)]
    for _ in range(n_ops):
        op = rng.choice(
            ["add", "mul", "exp", "neg", "transpose", "matmul", "reduce"],
            p=[0.2, 0.15, 0.15, 0.1, 0.1, 0.15, 0.15],
        )
        pick = [values[i] for i in rng.choice(len(values), 2)]
        if op in ("add", "mul", "matmul"):
            prim = {"add": Prim.ADD, "mul": Prim.MUL, "matmul": Prim.MATMUL}[op]
            (v,) = b.emit(prim, pick)
        elif op in ("exp", "neg"):
            (v,) = b.emit(Prim.EXP if op == "exp" else Prim.NEG, pick[:1])
        elif op == "transpose":
            (v,) = b.emit(Prim.TRANSPOSE, pick[:1], perm=(1, 0))
        else:
            (r,) = b.emit(Prim.REDUCE_SUM, pick[:1], axes=(1,))
            (v,) = b.emit(Prim.BROADCAST, [r], shape=(4, 4))
        values.append(v)
    used = {i for n in b.nodes for i in n.inputs}
    outputs = [v for n in b.nodes for v in n.outputs if v not in used]
    return b.build(outputs, outputs)


def brute_force(graph, options, ranges):
    """Every subset of nodes inside one range that is connected, convex, legal and small enough."""
    consumers = graph.consumers()
    index = {v: i for i, n in enumerate(graph.nodes) for v in n.outputs}
    outputs = set(graph.outputs)
    found = set()
    for lo, hi in ranges:
        ids = range(lo, hi)
        for r in range(1, len(ids) + 1):
            for subset in itertools.combinations(ids, r):
                members = set(subset)
                counted = sum(graph.nodes[i].kind is not Kind.BROADCAST for i in members)
                if counted > options.max_size or not _connected(graph, members, index):
                    continue
                if not is_convex(graph, members):
                    continue
                kinds = Counter(graph.nodes[i].kind for i in members)
                if monotone_reason(kinds, options.legality):
                    continue
                written = [
                    v
                    for i in members
                    for v in graph.nodes[i].outputs
                    if v in outputs or any(index[c.outputs[0]] not in members for c in consumers.get(v, []))
                ]
                if final_reason(len(written), options.legality):
                    continue
                found.add(frozenset(members))
    return found


def _connected(graph, members, index):
    members = set(members)
    start = next(iter(members))
    seen, stack = {start}, [start]
    while stack:
        i = stack.pop()
        neighbours = {index[v] for v in graph.nodes[i].inputs if v in index}
        neighbours |= {j for j in members if set(graph.nodes[j].inputs) & set(graph.nodes[i].outputs)}
        for j in neighbours & members - seen:
            seen.add(j)
            stack.append(j)
    return seen == members


@pytest.mark.parametrize("seed", range(120))
def test_enumeration_equals_brute_force(seed):
    graph = random_graph(seed)
    options = CandidateOptions(
        max_size=4 + seed % 4, legality=LegalityOptions(max_reductions=1 + seed % 2, max_outputs=2 + seed % 3)
    )
    result = enumerate_candidates(graph, options)
    got = [frozenset(c.nodes) for c in result.candidates]
    assert len(got) == len(set(got)), "duplicates"
    ranges = [(p.start, p.stop) for p in result.partitions]
    assert set(got) == brute_force(graph, options, ranges)
    for c in result.candidates:
        assert is_convex(graph, c.nodes)


@pytest.mark.parametrize("seed", range(40))
def test_enumeration_with_forced_partitions(seed):
    graph = random_graph(1000 + seed, n_ops=12)
    options = CandidateOptions(max_size=5, partition=PartitionOptions(min_nodes=3, max_nodes=6))
    result = enumerate_candidates(graph, options)
    ranges = [(p.start, p.stop) for p in result.partitions]
    assert ranges[0][0] == 0 and ranges[-1][1] == len(graph.nodes)
    assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:]))
    assert {frozenset(c.nodes) for c in result.candidates} == brute_force(graph, options, ranges)


def test_every_single_primitive_is_a_candidate():
    graph = random_graph(7, n_ops=14)
    singles = {c.nodes for c in enumerate_candidates(graph).candidates if len(c.nodes) == 1}
    assert singles == {(i,) for i in range(len(graph.nodes))}


def _fan_out(chains=5, length=2):
    """One value read by `chains` chains of elementwise primitives summed pairwise at the end (an
    unrolled scan's gathers from one tensor): connected sets through the hub grow combinatorially."""
    b = GraphBuilder()
    (hub,) = b.emit(Prim.EXP, [b.input("x", T)])
    ends = []
    for _ in range(chains):
        v = hub
        for _ in range(length):
            (v,) = b.emit(Prim.NEG, [v])
        ends.append(v)
    total = ends[0]
    for v in ends[1:]:
        (total,) = b.emit(Prim.ADD, [total, v])
    return b.build([total], ["y"])


@pytest.mark.parametrize("cap", [40, 115, 300])
def test_a_dense_partition_gets_the_largest_size_bound_under_the_cap(cap):
    """The sets are exactly brute force's at the lowered bound, which is the largest whose sets
    number no more than the cap (and every primitive keeps its single)."""
    graph = _fan_out()
    options = CandidateOptions(max_size=8, max_per_partition=cap)
    result = enumerate_candidates(graph, options)
    (part,) = result.partitions
    bound = result.lowered[part.index]
    assert bound < 8 and list(result.lowered) == [part.index]

    def exact(size):
        return brute_force(graph, CandidateOptions(max_size=size), [(part.start, part.stop)])

    assert {frozenset(c.nodes) for c in result.candidates} == exact(bound)
    assert len(exact(bound)) <= cap < len(exact(bound + 1))
    assert f"bound lowered: 0 ({len(graph.nodes)} primitives) to {bound}" in result.lowered_note(8, cap)
    unbounded = enumerate_candidates(graph, CandidateOptions(max_size=8))
    assert not unbounded.lowered and unbounded.lowered_note(8, cap) is None
    assert {frozenset(c.nodes) for c in unbounded.candidates} == exact(8)


def test_singles_stay_when_even_they_pass_the_cap():
    graph = _fan_out()
    result = enumerate_candidates(graph, CandidateOptions(max_size=8, max_per_partition=5))
    assert sorted(c.nodes for c in result.candidates) == [(i,) for i in range(len(graph.nodes))]
    assert result.lowered == {0: 1}


def _rows_repeated(rows=10):
    """Keras' UpSampling1D as tf2onnx writes it: a tensor split into single rows, each
    concatenated twice. Sets of rows with their source are connected and convex, but write every
    row they hold: past max_outputs rows a set is rejected only once finished (with 64 rows and 12
    primitives a set, about 10^11 of them)."""
    b = GraphBuilder()
    (x,) = b.emit(Prim.EXP, [b.input("x", TensorType((rows, 4), "float32"))])
    parts = [b.emit(Prim.SLICE, [x], starts=(i, 0), steps=(1, 1), sizes=(1, 4))[0] for i in range(rows)]
    (y,) = b.emit(Prim.CONCAT, [p for p in parts for _ in range(2)], axis=0)
    return b.build([y], ["y"])


def test_a_partition_whose_sets_are_rejected_once_finished_gets_a_lower_bound():
    """The bound is the largest whose enumeration looks at no more than max_visits sets (counted
    here directly), and the sets kept are brute force's at that bound."""
    from korch.search.candidates import _enumerate_region, _Region

    graph = _rows_repeated()
    cap = 1000  # (8 primitives take 1946 visits, 6 take 1286)
    result = enumerate_candidates(graph, CandidateOptions(max_size=8, max_visits=cap))
    (part,) = result.partitions
    bound = result.lowered[part.index]

    def visits(size):
        region = _Region(graph, part)
        return sum(1 for _ in _enumerate_region(region, CandidateOptions(max_size=size), Counter()))

    assert 1 < bound < 8 and visits(bound) <= cap < visits(bound + 1)
    kept = {frozenset(c.nodes) for c in result.candidates}
    assert kept == brute_force(graph, CandidateOptions(max_size=bound), [(part.start, part.stop)])
    unbounded = enumerate_candidates(graph, CandidateOptions(max_size=8))
    assert not unbounded.lowered


def _two_blocks(scale_a=0.5, scale_b=0.5):
    b = GraphBuilder()
    x = b.input("x", T)
    for scale in (scale_a, scale_b):
        (m,) = b.emit(Prim.MATMUL, [x, b.const(np.ones((4, 4), "float32") * scale * 3)])
        (e,) = b.emit(Prim.MUL, [m, b.const(np.float32(scale))])
        (x,) = b.emit(Prim.EXP, [e])
    return b.build([x], ["y"])


def test_identical_blocks_share_keys():
    cs = enumerate_candidates(_two_blocks()).candidates
    by_nodes = {c.nodes: c.key for c in cs}
    assert by_nodes[(0, 1)] == by_nodes[(3, 4)]  # matmul+mul of each block; weights differ in value only
    assert by_nodes[(0,)] == by_nodes[(3,)]
    assert by_nodes[(2,)] == by_nodes[(5,)]  # both exps write their result
    assert by_nodes[(1,)] != by_nodes[(2,)]  # mul and exp


def test_small_constants_are_part_of_the_key():
    a = enumerate_candidates(_two_blocks(0.5, 0.25)).candidates
    by_nodes = {c.nodes: c.key for c in a}
    assert by_nodes[(1,)] != by_nodes[(4,)]  # mul by 0.5 vs mul by 0.25
    assert by_nodes[(0,)] == by_nodes[(3,)]  # big weights: only their type matters


def test_key_ignores_value_names():
    g = _two_blocks()
    keys = _KeyMaker(g)
    k1, ins = keys.key((0, 1), (g.nodes[1].outputs[0],))
    assert len(k1) == 24 and ins == ("x", g.nodes[0].inputs[1], g.nodes[1].inputs[1])


def test_partition_prefers_cuts_read_only_by_linear_primitives():
    b = GraphBuilder()
    x = b.input("x", T)
    w = b.const(np.ones((4, 4), "float32"))
    for _ in range(6):
        (m,) = b.emit(Prim.MATMUL, [x, w])
        (e,) = b.emit(Prim.EXP, [m])
        (x,) = b.emit(Prim.NEG, [e])
    g = b.build([x], ["y"])
    parts = partition(g, PartitionOptions(min_nodes=2, max_nodes=7))
    for p in parts[:-1]:
        assert g.nodes[p.stop].prim is Prim.MATMUL  # each region ends before a matmul
        assert p.crossing == (g.nodes[p.stop - 1].outputs[0],)
