"""Placement generators: exact size, feasibility, infeasibility only when forced, and each rule."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from linkwise.cluster.domain import Job, Placement, Shape, Topology, requested_shape
from linkwise.cluster.placement.generators import (
    GENERATOR_NAMES,
    all_placements,
    apply_placement,
    best_fit,
    distinct_placements,
    first_fit,
    fragment_first_fit,
    is_feasible,
    least_busy,
    release_placement,
    same_leaf,
)
from linkwise.cluster.placement.slurm_select import slurm_select
from linkwise.cluster.topology.spec import from_spec

Case = tuple[Topology, list[int], int, list[int]]


@st.composite
def cases(draw: st.DrawFn) -> Case:
    """A random topology, free GPUs per node, a job size (sometimes too big) and busy-ness."""
    nodes = draw(st.integers(1, 12))
    gpus = draw(st.integers(1, 8))
    leaf = draw(st.integers(1, 6))
    topo = from_spec(f"{nodes}x{gpus},leaf={leaf}")
    free = [draw(st.integers(0, gpus)) for _ in range(nodes)]
    jobs = [draw(st.integers(0, 3)) if f < gpus else draw(st.integers(0, 1)) for f in free]
    want = draw(st.integers(1, nodes * gpus + 2))
    return topo, free, want, jobs


def _check(p: Placement | None, free: Sequence[int], gpus: int) -> Placement:
    assert p is not None
    assert p.num_gpus == gpus
    assert is_feasible(free, p)
    nodes = [n for n, _ in p.alloc]
    assert nodes == sorted(set(nodes))
    assert all(g > 0 for _, g in p.alloc)
    return p


def _fewest_nodes(free: Sequence[int], gpus: int) -> int:
    """Fewest nodes whose free GPUs sum to ``gpus`` (a huge number if they cannot)."""
    if sum(free) < gpus:
        return 10**9
    k, need = 0, gpus
    for f in sorted(free, reverse=True):
        if need <= 0:
            break
        need -= f
        k += 1
    return k


@settings(max_examples=300, deadline=None)
@given(cases())
def test_total_free_generators_place_iff_enough_gpus(case: Case) -> None:
    topo, free, gpus, jobs = case
    before = list(free)
    gens: list[Callable[[], Placement | None]] = [
        lambda: first_fit(topo, free, gpus),
        lambda: best_fit(topo, free, gpus),
        lambda: least_busy(topo, free, gpus, jobs),
        lambda: fragment_first_fit(topo, free, gpus, jobs),
    ]
    for gen in gens:
        p = gen()
        if sum(free) < gpus:
            assert p is None
        else:
            _check(p, free, gpus)
    assert free == before  # generators never mutate their input


@settings(max_examples=300, deadline=None)
@given(cases())
def test_same_leaf_places_iff_one_leaf_has_room(case: Case) -> None:
    topo, free, gpus, _ = case
    leaf_free = [sum(free[i] for i in members) for members in topo.leaf_nodes]
    p = same_leaf(topo, free, gpus)
    if max(leaf_free) < gpus:
        assert p is None
        return
    p = _check(p, free, gpus)
    leaves = {topo.nodes[n].leaf for n in p.nodes}
    assert len(leaves) == 1
    (leaf,) = leaves
    # the fullest leaf that can hold it (ties: lowest index)
    fitting = [(f - gpus, i) for i, f in enumerate(leaf_free) if f >= gpus]
    assert (leaf_free[leaf] - gpus, leaf) == min(fitting)
    members = topo.leaf_nodes[leaf]
    assert p.num_nodes == _fewest_nodes([free[i] for i in members], gpus)


@settings(max_examples=300, deadline=None)
@given(cases())
def test_best_fit_is_tightest_node_or_fewest_nodes(case: Case) -> None:
    topo, free, gpus, _ = case
    assume(sum(free) >= gpus)
    p = _check(best_fit(topo, free, gpus), free, gpus)
    fitting = [(f, i) for i, f in enumerate(free) if f >= gpus]
    if fitting:
        assert p.alloc == ((min(fitting)[1], gpus),)
        return
    k = _fewest_nodes(free, gpus)
    assert p.num_nodes == k
    leaves = {topo.nodes[n].leaf for n in p.nodes}
    one_leaf_possible = any(
        _fewest_nodes([free[i] for i in members], gpus) == k for members in topo.leaf_nodes
    )
    assert (len(leaves) == 1) == one_leaf_possible


@settings(max_examples=300, deadline=None)
@given(cases())
def test_first_fit_takes_even_shares_in_index_order_else_spreads(case: Case) -> None:
    topo, free, gpus, _ = case
    if sum(free) < gpus:
        assert first_fit(topo, free, gpus) is None
        return
    p = _check(first_fit(topo, free, gpus), free, gpus)
    k = -(-gpus // topo.max_gpus_per_node)
    share = -(-gpus // k)
    roomy = [n for n, f in enumerate(free) if f >= share]
    if len(roomy) * share >= gpus:  # -N k --gpus-per-node=share fits: the first roomy nodes
        assert p.nodes == tuple(roomy[: len(p.nodes)])
        assert all(g <= share for _, g in p.alloc)
    else:  # --gpus=N: a prefix of the nodes, each taken whole but the last
        last = p.nodes[-1]
        for node in range(last):
            assert dict(p.alloc).get(node, 0) == free[node]


@settings(max_examples=300, deadline=None)
@given(cases())
def test_least_busy_prefers_idle_servers(case: Case) -> None:
    topo, free, gpus, jobs = case
    assume(sum(free) >= gpus)
    p = _check(least_busy(topo, free, gpus, jobs), free, gpus)
    taken = dict(p.alloc)
    key = {i: (jobs[i], -free[i], i) for i in range(len(free)) if free[i] > 0}
    worst_used = max(key[n] for n in taken)
    # every server ranked before the last one used is taken whole
    for i, k in key.items():
        if k < worst_used:
            assert taken.get(i, 0) == free[i]
        elif k > worst_used:
            assert i not in taken


@settings(max_examples=300, deadline=None)
@given(cases())
def test_fragment_first_fit_packs_onto_the_busiest_server(case: Case) -> None:
    topo, free, gpus, jobs = case
    assume(sum(free) >= gpus)
    p = _check(fragment_first_fit(topo, free, gpus, jobs), free, gpus)
    hosts = [(-jobs[i], i) for i, f in enumerate(free) if f >= gpus]
    if hosts:
        assert p.alloc == ((min(hosts)[1], gpus),)
    else:
        assert p.num_nodes > 1


@settings(max_examples=150, deadline=None)
@given(cases())
def test_all_and_distinct_placements(case: Case) -> None:
    topo, free, gpus, jobs = case
    every = all_placements(topo, free, gpus, jobs)
    assert len(every) == len(GENERATOR_NAMES)
    distinct = distinct_placements(topo, free, gpus, jobs)
    assert len(set(distinct)) == len(distinct)
    assert set(distinct) == {p for p in every if p is not None}


def test_best_fit_consolidates_on_the_tightest_node() -> None:
    topo = from_spec("4x8")
    assert best_fit(topo, [8, 3, 5, 4], 4) == Placement(((3, 4),))
    assert first_fit(topo, [8, 3, 5, 4], 4) == Placement(((0, 4),))
    assert first_fit(topo, [3, 2, 5, 4], 4) == Placement(((2, 4),))  # one node, not 3 + 1
    assert first_fit(topo, [3, 2, 1, 0], 4) == Placement(((0, 3), (1, 1)))  # spreads
    # 12 GPUs: two nodes (8 + the tightest holding 4), not three
    assert best_fit(topo, [3, 8, 5, 4], 12) == Placement(((1, 8), (3, 4)))


def test_best_fit_prefers_one_leaf_at_equal_node_count() -> None:
    topo = from_spec("4x8,leaf=2")  # leaves {0, 1} and {2, 3}
    assert best_fit(topo, [8, 0, 6, 6], 12) == Placement(((2, 6), (3, 6)))
    assert same_leaf(topo, [8, 0, 6, 6], 12) == Placement(((2, 6), (3, 6)))
    assert same_leaf(topo, [8, 0, 6, 2], 12) is None
    assert best_fit(topo, [8, 0, 6, 2], 12) == Placement(((0, 8), (2, 4)))


def test_sjf_bco_rules_on_busy_and_idle_servers() -> None:
    topo = from_spec("4x8")
    free, jobs = [8, 4, 8, 6], [0, 2, 0, 1]
    assert fragment_first_fit(topo, free, 4, jobs) == Placement(((1, 4),))
    assert fragment_first_fit(topo, free, 6, jobs) == Placement(((3, 6),))
    assert least_busy(topo, free, 12, jobs) == Placement(((0, 8), (2, 4)))
    assert least_busy(topo, free, 20, jobs) == Placement(((0, 8), (2, 8), (3, 4)))


def test_apply_and_release_round_trip() -> None:
    free = [4, 2, 0]
    p = Placement(((0, 3), (1, 2)))
    apply_placement(free, p)
    assert free == [1, 0, 0]
    with pytest.raises(ValueError):
        apply_placement(free, p)
    assert free == [1, 0, 0]  # a failed apply changes nothing
    release_placement(free, p)
    assert free == [4, 2, 0]
    assert not is_feasible(free, Placement(((3, 1),)))


def test_non_positive_sizes_are_rejected() -> None:
    topo = from_spec("2x8")
    with pytest.raises(ValueError):
        first_fit(topo, [8, 8], 0)


# -- Slurm's select/cons_tres for a requested shape --------------------------------------------


@settings(max_examples=300, deadline=None)
@given(cases(), st.integers(1, 4))
def test_slurm_select_gives_the_shape_or_none_only_when_too_few_nodes_are_usable(
    case: Case, nodes: int
) -> None:
    topo, free, _, _ = case
    per = max(1, topo.max_gpus_per_node // nodes)
    shape = Shape(nodes, per)
    placement = slurm_select(topo, free, shape)
    usable = [i for i, f in enumerate(free) if f >= per]
    if len(usable) < nodes:
        assert placement is None
        return
    assert placement is not None
    assert is_feasible(free, placement)
    assert placement.num_nodes == nodes
    assert all(g == per for _, g in placement.alloc)


def test_slurm_select_matches_what_a_real_slurm_chose() -> None:
    # observed on the local Slurm 22.05 (4 nodes x 4 GPUs, no topology.conf, CPUs in
    # proportion): a one-node job takes the tightest node; a multi-node job the first
    # nodes of the tightest run of consecutive usable nodes
    topo = from_spec("4x4")
    assert slurm_select(topo, [4, 1, 4, 4], Shape(1, 1)) == Placement(((1, 1),))
    assert slurm_select(topo, [4, 0, 4, 2], Shape(1, 2)) == Placement(((0, 2),))
    assert slurm_select(topo, [0, 2, 4, 4], Shape(2, 2)) == Placement(((1, 2), (2, 2)))
    assert slurm_select(topo, [0, 0, 2, 4], Shape(1, 1)) == Placement(((2, 1),))
    assert slurm_select(topo, [4, 0, 4, 4], Shape(1, 4)) == Placement(((0, 4),))


def test_slurm_select_on_a_tree_prefers_the_tightest_leaf_and_fewest_leaves() -> None:
    topo = from_spec("8x4,leaf=4")  # leaves {0..3} and {4..7}
    # two nodes fit in either leaf: the one with fewer usable nodes, nodes in index order
    assert slurm_select(topo, [4, 4, 4, 0, 4, 4, 0, 0], Shape(2, 4)) == Placement(((4, 4), (5, 4)))
    # no leaf holds four nodes: the fullest leaf first, then the rest from the other
    assert slurm_select(topo, [4, 4, 4, 0, 4, 4, 0, 0], Shape(4, 2)) == Placement(
        ((0, 2), (1, 2), (2, 2), (4, 2))
    )


def test_requested_shape_from_the_job_or_as_slurm_users_ask() -> None:
    assert requested_shape(Job(1, 0.0, 4, 1.0), 8) == Shape(1, 4)
    assert requested_shape(Job(1, 0.0, 8, 1.0), 8) == Shape(1, 8)
    assert requested_shape(Job(1, 0.0, 32, 1.0), 8) == Shape(4, 8)
    assert requested_shape(Job(1, 0.0, 12, 1.0), 8) == Shape(2, 6)
    assert requested_shape(Job(1, 0.0, 9, 1.0), 8) == Shape(3, 3)
    assert requested_shape(Job(1, 0.0, 4, 1.0, nodes=2), 8) == Shape(2, 2)
    with pytest.raises(ValueError, match="split evenly"):
        Job(1, 0.0, 3, 1.0, nodes=2)
