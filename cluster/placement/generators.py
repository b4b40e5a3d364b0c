"""Deterministic placement generators: where a job of ``gpus`` GPUs could go right now.

Every generator takes the topology, the free GPUs per node (indexed like
``topology.nodes``) and the GPU count, and returns a ``Placement`` giving exactly
``gpus`` GPUs with at most ``free[i]`` on node ``i``, or ``None`` when it cannot place
the job. Ties are always broken by node (or leaf) index, so the same inputs give the
same placement. They are pure and cheap (plain loops and one sort over the nodes):
they run at every decision point.

- ``first_fit``: Slurm select/cons_tres-like, nodes in index order (even per-node shares
  first, then spreading).
- ``best_fit``: consolidated: the tightest single node, else the fewest nodes.
- ``same_leaf``: best fit inside the fullest leaf switch that can hold the job.
- ``least_busy``: SJF-BCO's LBSGF, least-busy servers first (large jobs).
- ``fragment_first_fit``: SJF-BCO's small-job rule, packing onto busy servers.
- ``bounded_placement``: SJF-BCO's rule (``fragment_first_fit`` for small jobs,
  ``least_busy`` for large ones) with its bound on the servers a job spans.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from linkwise.cluster.domain import Placement, Topology

GENERATOR_NAMES: tuple[str, ...] = (
    "best_fit",
    "same_leaf",
    "least_busy",
    "first_fit",
    "fragment_first_fit",
)


def check_gpus(gpus: int) -> None:
    """Refuse a GPU count a placement cannot have (not positive)."""
    if gpus <= 0:
        raise ValueError(f"a placement needs a positive GPU count, got {gpus}")


def _sorted_alloc(pairs: list[tuple[int, int]]) -> Placement:
    pairs.sort()
    return Placement(tuple(pairs))


def is_feasible(free: Sequence[int], placement: Placement) -> bool:
    """Whether every node of ``placement`` exists and has the GPUs it takes free."""
    n = len(free)
    return all(0 <= node < n and 0 < g <= free[node] for node, g in placement.alloc)


def apply_placement(free: list[int], placement: Placement) -> None:
    """Take the placement's GPUs out of ``free`` (in place); ValueError if infeasible."""
    if not is_feasible(free, placement):
        raise ValueError(f"placement {placement.alloc} does not fit free GPUs {free}")
    for node, g in placement.alloc:
        free[node] -= g


def release_placement(free: list[int], placement: Placement) -> None:
    """Give the placement's GPUs back to ``free`` (in place)."""
    for node, g in placement.alloc:
        free[node] += g


def first_fit(topo: Topology, free: Sequence[int], gpus: int) -> Placement | None:
    """Slurm select/cons_tres-like first fit, for a job asking ``k = ceil(gpus / node size)``
    nodes with an even share of GPUs each (``-N k --gpus-per-node``): the first ``k`` nodes in
    index order with room for their share. When no such ``k`` nodes exist, it spreads
    like ``--gpus=N``: nodes in index order, all free GPUs of each until ``gpus`` are taken.

    None iff fewer than ``gpus`` GPUs are free in total.
    """
    check_gpus(gpus)
    k = -(-gpus // max(1, topo.max_gpus_per_node))
    share = -(-gpus // k)
    need = gpus
    pairs: list[tuple[int, int]] = []
    for node, f in enumerate(free):
        if f >= share:
            take = share if share < need else need
            pairs.append((node, take))
            need -= take
            if need == 0:
                return Placement(tuple(pairs))
    return spread_first_fit(free, gpus)


def spread_first_fit(free: Sequence[int], gpus: int) -> Placement | None:
    """Nodes in index order, taking all free GPUs of each until ``gpus`` are taken.

    None iff fewer than ``gpus`` GPUs are free in total.
    """
    check_gpus(gpus)
    need = gpus
    pairs: list[tuple[int, int]] = []
    for node, f in enumerate(free):
        if f <= 0:
            continue
        take = f if f < need else need
        pairs.append((node, take))
        need -= take
        if need == 0:
            return Placement(tuple(pairs))
    return None


def _consolidate(nodes: Sequence[int], free: Sequence[int], gpus: int) -> Placement | None:
    """The fewest of ``nodes`` that hold ``gpus``: the fullest-free ones, then the tightest tail.

    Takes the ``k-1`` nodes with most free GPUs whole (``k`` the minimal node count),
    then the remainder from the node with the fewest free GPUs that still holds it.
    """
    order = sorted((i for i in nodes if free[i] > 0), key=lambda i: (-free[i], i))
    need = gpus
    pairs: list[tuple[int, int]] = []
    for pos, node in enumerate(order):
        f = free[node]
        if f < need:
            pairs.append((node, f))
            need -= f
            continue
        # ``node`` holds the remainder; so may later (smaller) ones: take the tightest
        best = node
        for other in order[pos + 1 :]:
            if free[other] < need:
                break
            if free[other] < free[best]:
                best = other
        pairs.append((best, need))
        return _sorted_alloc(pairs)
    return None


def _min_nodes(nodes: Sequence[int], free: Sequence[int], gpus: int) -> int:
    """Fewest of ``nodes`` whose free GPUs sum to ``gpus`` (a large number if impossible)."""
    caps = sorted((free[i] for i in nodes if free[i] > 0), reverse=True)
    need = gpus
    for k, f in enumerate(caps, start=1):
        need -= f
        if need <= 0:
            return k
    return len(free) + 1


def _tightest_node(nodes: Sequence[int], free: Sequence[int], gpus: int) -> int:
    """The node among ``nodes`` with the fewest free GPUs that still holds ``gpus`` (-1: none)."""
    best, best_free = -1, 0
    for i in nodes:
        f = free[i]
        if f >= gpus and (best < 0 or f < best_free):
            best, best_free = i, f
    return best


def best_fit(topo: Topology, free: Sequence[int], gpus: int) -> Placement | None:
    """Consolidate: the tightest single node that holds the job, else the fewest nodes.

    A multi-node job goes on the minimal number of nodes (most free first, the tail on
    the tightest node that fits); among the leaves that can host it on that same minimal
    number of nodes, the one left with the fewest free GPUs is preferred, so the ring
    stays under one leaf switch whenever that costs no extra node. None iff fewer than
    ``gpus`` GPUs are free in total.
    """
    check_gpus(gpus)
    all_nodes = range(len(free))
    single = _tightest_node(all_nodes, free, gpus)
    if single >= 0:
        return Placement(((single, gpus),))
    if sum(free) < gpus:
        return None
    k_all = _min_nodes(all_nodes, free, gpus)
    best_leaf, best_left = -1, 0
    for leaf, members in enumerate(topo.leaf_nodes):
        leaf_free = sum(free[i] for i in members)
        if leaf_free < gpus:
            continue
        left = leaf_free - gpus
        if (best_leaf < 0 or left < best_left) and _min_nodes(members, free, gpus) == k_all:
            best_leaf, best_left = leaf, left
    if best_leaf >= 0:
        return _consolidate(topo.leaf_nodes[best_leaf], free, gpus)
    return _consolidate(all_nodes, free, gpus)


def same_leaf(topo: Topology, free: Sequence[int], gpus: int) -> Placement | None:
    """Best fit inside the leaf that holds the job with the fewest free GPUs left over.

    None iff no single leaf switch has ``gpus`` free GPUs.
    """
    check_gpus(gpus)
    best_leaf, best_left = -1, 0
    for leaf, members in enumerate(topo.leaf_nodes):
        leaf_free = sum(free[i] for i in members)
        if leaf_free >= gpus and (best_leaf < 0 or leaf_free - gpus < best_left):
            best_leaf, best_left = leaf, leaf_free - gpus
    if best_leaf < 0:
        return None
    members = topo.leaf_nodes[best_leaf]
    single = _tightest_node(members, free, gpus)
    if single >= 0:
        return Placement(((single, gpus),))
    return _consolidate(members, free, gpus)


def _take_in_order(order: Sequence[int], free: Sequence[int], gpus: int) -> Placement | None:
    need = gpus
    pairs: list[tuple[int, int]] = []
    for node in order:
        f = free[node]
        take = f if f < need else need
        pairs.append((node, take))
        need -= take
        if need == 0:
            return _sorted_alloc(pairs)
    return None


def least_busy(
    topo: Topology, free: Sequence[int], gpus: int, jobs_per_node: Sequence[int]
) -> Placement | None:
    """SJF-BCO's LBSGF (least-busy server GPU first), the rule for large jobs.

    Servers ordered by number of running jobs (ascending), then most free GPUs, then
    index; GPUs are taken from them in that order. None iff fewer than ``gpus`` are free.
    """
    check_gpus(gpus)
    order = sorted(
        (i for i in range(len(free)) if free[i] > 0),
        key=lambda i: (jobs_per_node[i], -free[i], i),
    )
    return _take_in_order(order, free, gpus)


def fragment_first_fit(
    topo: Topology, free: Sequence[int], gpus: int, jobs_per_node: Sequence[int]
) -> Placement | None:
    """SJF-BCO's rule for small jobs: first fit onto the busiest server that holds it whole.

    Among servers with ``gpus`` free, the one running the most jobs (then lowest index),
    so fragments on servers already in use are filled before a fresh server is opened.
    If no server holds the whole job, it is spread over servers busiest first (then by
    index). None iff fewer than ``gpus`` GPUs are free.
    """
    check_gpus(gpus)
    best, best_jobs = -1, -1
    for i, f in enumerate(free):
        if f >= gpus and jobs_per_node[i] > best_jobs:
            best, best_jobs = i, jobs_per_node[i]
    if best >= 0:
        return Placement(((best, gpus),))
    order = sorted(
        (i for i in range(len(free)) if free[i] > 0), key=lambda i: (-jobs_per_node[i], i)
    )
    return _take_in_order(order, free, gpus)


def all_placements(
    topo: Topology, free: Sequence[int], gpus: int, jobs_per_node: Sequence[int]
) -> tuple[Placement | None, ...]:
    """Every generator's placement, in ``GENERATOR_NAMES`` order (None where infeasible)."""
    return (
        best_fit(topo, free, gpus),
        same_leaf(topo, free, gpus),
        least_busy(topo, free, gpus, jobs_per_node),
        first_fit(topo, free, gpus),
        fragment_first_fit(topo, free, gpus, jobs_per_node),
    )


def distinct_placements(
    topo: Topology, free: Sequence[int], gpus: int, jobs_per_node: Sequence[int]
) -> tuple[Placement, ...]:
    """The distinct feasible placements of all generators, in ``GENERATOR_NAMES`` order."""
    out: list[Placement] = []
    for p in all_placements(topo, free, gpus, jobs_per_node):
        if p is not None and p not in out:
            out.append(p)
    return tuple(out)


def min_nodes_for(capacities_desc: Sequence[int], gpus: int) -> int:
    """Fewest nodes of these capacities (sorted descending) that hold ``gpus`` GPUs (>= 1)."""
    need = gpus
    k = 0
    for cap in capacities_desc:
        if need <= 0:
            break
        need -= cap
        k += 1
    return max(k, 1)


def bounded_placement(
    topo: Topology,
    free: Sequence[int],
    busy: Sequence[int],
    gpus: int,
    kappa: int | None = None,
    lam: float = 1.0,
    capacities_desc: Sequence[int] | None = None,
) -> Placement | None:
    """SJF-BCO's placement of one job (Yu et al., MobiHoc'22), None if it must wait.

    A job with ``gpus <= kappa`` (None: the GPUs of the largest node) is placed by
    ``fragment_first_fit`` (FA-FFP), a larger one by ``least_busy`` (LBSGF). ``lam`` bounds
    the servers a job spans to ``ceil(lam * n_min)``, ``n_min`` being the fewest servers of
    the cluster that could hold it: when the rule's placement spans more, the consolidated
    ``best_fit`` placement is tried instead, and when that spans more too there is none (the
    job waits for consolidation); ``lam = inf`` removes the bound. ``capacities_desc``: the
    nodes' GPU counts sorted descending (computed when None)."""
    if kappa is None:
        kappa = topo.max_gpus_per_node
    placement: Placement | None
    if gpus <= kappa:
        placement = fragment_first_fit(topo, free, gpus, busy)
    else:
        placement = least_busy(topo, free, gpus, busy)
    if placement is None or math.isinf(lam):
        return placement
    if capacities_desc is None:
        capacities_desc = sorted((n.gpus for n in topo.nodes), reverse=True)
    bound = math.ceil(lam * min_nodes_for(capacities_desc, gpus) - 1e-9)
    if placement.num_nodes <= bound:
        return placement
    placement = best_fit(topo, free, gpus)
    return placement if placement is not None and placement.num_nodes <= bound else None
