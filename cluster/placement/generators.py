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
- ``slurm_select``: where Slurm's select/cons_tres puts a job of a requested shape
  (nodes x GPUs per node); what ``backfill`` uses.
- ``bounded_placement``: SJF-BCO's rule (``fragment_first_fit`` for small jobs,
  ``least_busy`` for large ones) with its bound on the servers a job spans.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from linkwise.cluster.domain import Placement, Shape, Topology

GENERATOR_NAMES: tuple[str, ...] = (
    "best_fit",
    "same_leaf",
    "least_busy",
    "first_fit",
    "fragment_first_fit",
)


def _check_gpus(gpus: int) -> None:
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
    _check_gpus(gpus)
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
    _check_gpus(gpus)
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
    _check_gpus(gpus)
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
    _check_gpus(gpus)
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
    _check_gpus(gpus)
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
    _check_gpus(gpus)
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


def slurm_select(topo: Topology, free: Sequence[int], shape: Shape) -> Placement | None:
    """Where Slurm 22.05's select/cons_tres starts a job of this shape now, or None.

    A node is usable when it has the shape's GPUs per node free; the job gets exactly
    that many on each of ``shape.nodes`` usable nodes. CPUs are taken as proportional to
    GPUs (``DefCpuPerGPU`` = a node's CPUs / GPUs, as GPU clusters configure it), so
    Slurm's free-CPU counts are free-GPU counts here.

    - One leaf switch (what Slurm sees without a ``topology.conf``: ``_eval_nodes``):
      runs of consecutive usable nodes (by index); the run that holds the job with the
      fewest free GPUs, else the largest run first; inside it a one-node job takes the
      node with the fewest free GPUs that holds it (first on ties), a multi-node job the
      nodes in index order. Checked against a real Slurm by
      ``tests/evaluation/test_backfill_live.py``.
    - Several leaves (``topology/tree``, ``_eval_nodes_topo``): within the aggregation
      switch that holds the job with the fewest usable nodes (if one does), leaf switches
      one at a time: the one that holds the remaining nodes with the fewest usable nodes,
      else the one with the most; inside a leaf, usable nodes in index order.
    """
    per = shape.gpus_per_node
    if per <= 0 or shape.nodes <= 0:
        raise ValueError(f"a shape needs positive nodes and GPUs per node, got {shape}")
    return slurm_select_usable(topo, free, shape, [i for i, f in enumerate(free) if f >= per])


def slurm_select_usable(
    topo: Topology, free: Sequence[int], shape: Shape, usable: list[int]
) -> Placement | None:
    """``slurm_select`` given its usable nodes (those with ``shape.gpus_per_node`` free, in
    index order), for a caller that has them at hand (backfill's plan); ``free`` is read
    only on a single leaf switch (best fit by free GPUs)."""
    per = shape.gpus_per_node
    if len(usable) < shape.nodes:
        return None
    chosen: list[int] | None
    if len(topo.leaf_names) == 1:
        chosen = _consecutive_best_fit(usable, free, shape)
    else:
        chosen = _tree_best_fit(topo, usable, shape.nodes)
    if chosen is None:  # pragma: no cover - both rules succeed whenever enough nodes are usable
        return None
    return Placement(tuple((node, per) for node in sorted(chosen)))


def slurm_select_flexible(
    topo: Topology, free: Sequence[int], gpus: int, *, per_task: bool = False
) -> Placement | None:
    """Where select/cons_tres starts a flexible request (``--gpus=N``, any split; with
    ``per_task``, ``-n N --gpus-per-task=1``) now, or None (fewer than ``gpus`` GPUs free).

    CPUs are taken as proportional to GPUs (``--cpus-per-gpu``, as ``slurm_select`` assumes).

    - Several leaves (``topology/tree``): ``_flexible_tree_nodes`` picks the nodes (Slurm's
      ``_eval_nodes_topo`` with its node weights by free GPUs); ``split_job_gpus`` says how
      many GPUs each gets for ``--gpus=N``; one GPU per task, the nodes in the order they
      were picked take all their free GPUs (the last the rest), as cons_tres hands out CPUs
      and so tasks. Checked against Slurm 24.11 and 26.05 by ``benchmarks/flexible_vs_slurm.py``
      and ``tests/evaluation/test_flexible_live.py`` (``--gpus=N``, with and without
      ``--cpus-per-gpu``, ``-N 1-4 --gpus=N``, ``-n N --gpus-per-task=1``).
    - One leaf switch (no ``topology.conf``): packed in the shape a fixed request of these
      GPUs would have (``requested_shape``) on the nodes ``slurm_select`` picks, else spread
      over runs of consecutive nodes with free GPUs, the run that holds the rest with the
      fewest free GPUs, else the one with the most, all of each node's free GPUs taken in
      index order. Not checked against a real Slurm.
    """
    _check_gpus(gpus)
    if sum(free) < gpus:
        return None
    if len(topo.leaf_names) > 1:
        nodes = _flexible_tree_nodes(topo, free, gpus)
        if nodes is None:
            return None
        if not per_task:
            return split_job_gpus(nodes, free, gpus)
        takes, need = [], gpus
        for node in nodes:
            takes.append((node, min(free[node], need)))
            need -= takes[-1][1]
        return Placement.of(takes)
    node_gpus = topo.max_gpus_per_node
    n = 1 if gpus <= node_gpus else -(-gpus // max(1, node_gpus))
    while gpus % n:
        n += 1
    packed = slurm_select(topo, free, Shape(n, gpus // n))
    if packed is not None:
        return packed
    groups: list[list[int]] = []
    for node, f in enumerate(free):
        if f <= 0:
            continue
        if groups and groups[-1][-1] == node - 1:
            groups[-1].append(node)
        else:
            groups.append([node])
    totals = [sum(free[i] for i in g) for g in groups]
    need = gpus
    pairs: list[tuple[int, int]] = []
    while need > 0:
        holding = [k for k, t in enumerate(totals) if t >= need]
        if holding:
            k = min(holding, key=lambda k: (totals[k], k))
        else:
            k = max(range(len(groups)), key=lambda k: (totals[k], -k))
        for node in groups[k]:
            take = min(free[node], need)
            pairs.append((node, take))
            need -= take
            if not need:
                break
        totals[k] = -1
    return Placement.of(pairs)


def split_job_gpus(nodes: Sequence[int], free: Sequence[int], gpus: int) -> Placement | None:
    """How cons_tres splits a job's ``gpus`` (``--gpus=N``) over the nodes it chose
    (``gres_select_filter.c`` ``_set_job_bits1`` then ``_set_job_bits2``): nodes in index
    order, each taking at most its free GPUs and as many as leave one for each node after
    it (at least one); then, while GPUs are missing, the nodes in index order fill up.
    None when the nodes lack ``gpus`` free GPUs."""
    order = sorted(set(nodes))
    if sum(free[i] for i in order) < gpus:
        return None
    takes = [0] * len(order)
    total = 0
    for k, node in enumerate(order):
        after = len(order) - k - 1
        takes[k] = min(free[node], max(1, gpus - total - after))
        total += takes[k]
    for k, node in enumerate(order):
        if total >= gpus:
            break
        more = min(free[node] - takes[k], gpus - total)
        takes[k] += more
        total += more
    return Placement(tuple((node, t) for node, t in zip(order, takes, strict=True) if t > 0))


def _flexible_tree_nodes(topo: Topology, free: Sequence[int], gpus: int) -> list[int] | None:
    """The nodes cons_tres with ``topology/tree`` (``eval_nodes_tree.c`` ``_eval_nodes_topo``,
    Slurm 24.11 and 26.05) gives a request of ``gpus`` GPUs in any split, in the order it
    picks them, or None.

    1. Node weights: cons_tres favours nodes with more usable GPUs (``job_test.c``: the low
       byte of a node's scheduling weight is 0xff minus its free GPUs, capped at the
       request), so the nodes fall into groups by ``min(free, gpus)``, most first.
    2. Groups are taken whole, in that order, until they hold ``gpus`` free GPUs; all groups
       but the last are *required* (allocated whatever follows), the last only *offered*.
    3. The leaf switches of required nodes are filled first (offered nodes, index order),
       then other leaf switches one at a time (``_topo_choose_best_switch``): the closest to
       the switches used so far, then one that *fits* (enough offered nodes, and free GPUs on
       all its nodes for the rest) with the fewest offered nodes, else the one with the most
       (compared at the aggregation level when the leaves' parents differ), else the first;
       inside a leaf, offered nodes in index order, until the job holds ``gpus``.

    The job's topmost switch is the switch tree (``Topology.leaf_fabric``) that holds the
    request with the most usable GPUs on one node (the last on ties), as Slurm keeps the
    highest switch that holds it and has the lowest node weight.
    """
    n_leaves = len(topo.leaf_names)
    fabric = topo.leaf_fabric or (0,) * n_leaves
    cand = [i for i, f in enumerate(free) if f > 0 and fabric[topo.nodes[i].leaf] >= 0]
    by_fabric: dict[int, list[int]] = {}
    for i in cand:
        by_fabric.setdefault(fabric[topo.nodes[i].leaf], []).append(i)
    top, top_near = -1, -1
    for fab in sorted(by_fabric):
        members = by_fabric[fab]
        near = max(min(free[i], gpus) for i in members)
        if sum(free[i] for i in members) >= gpus and near >= top_near:
            top, top_near = fab, near
    if top < 0:
        return None
    cand = by_fabric[top]
    # 1-2: weight groups, most usable GPUs first
    levels = sorted({min(free[i], gpus) for i in cand}, reverse=True)
    offered: set[int] = set()
    required: list[int] = []
    held = 0
    for level in levels:
        required = sorted(offered)
        group = [i for i in cand if min(free[i], gpus) == level]
        offered.update(group)
        held += sum(free[i] for i in group)
        if held >= gpus:
            break
    leaf_of = [topo.nodes[i].leaf for i in range(len(free))]
    n_aggs = len(topo.agg_names)
    core = n_leaves + n_aggs if n_aggs > 1 else -1  # the switch above the aggregation layer

    def parent(s: int) -> int:
        if s < n_leaves:
            return n_leaves + topo.leaf_agg[s]
        return core if s < n_leaves + n_aggs else -1

    def ancestors(s: int) -> list[int]:
        out = [s]
        while parent(out[-1]) >= 0:
            out.append(parent(out[-1]))
        return out

    def hops(a: int, b: int) -> int:
        up_a, up_b = ancestors(a), ancestors(b)
        common = next((s for s in up_a if s in up_b), None)
        if common is None:
            return 1 << 20  # no shared switch: Slurm's INFINITE
        return up_a.index(common) + up_b.index(common)

    switches = range(n_leaves + n_aggs + (1 if core >= 0 else 0))
    count = dict.fromkeys(switches, 0)  # offered nodes under each switch
    room = dict.fromkeys(switches, 0)  # free GPUs of every candidate under each switch
    for i in cand:
        for s in ancestors(leaf_of[i]):
            room[s] += free[i]
            if i in offered:
                count[s] += 1
    need = gpus
    taken: list[int] = []
    for i in required:
        taken.append(i)
        need -= free[i]
    used = {s for i in required for s in ancestors(leaf_of[i])}
    by_leaf: dict[int, list[int]] = {}
    for i in sorted(offered):
        by_leaf.setdefault(leaf_of[i], []).append(i)

    def decrement(leaf: int, k: int) -> None:
        for s in ancestors(leaf):
            count[s] = max(0, count[s] - k)

    def fill(leaf: int) -> bool:
        nonlocal need
        for i in by_leaf.get(leaf, []):
            if i in taken:
                continue
            taken.append(i)
            need -= free[i]
            if need <= 0:
                return True
        return False

    # 3a: offered nodes on the leaf switches of required nodes (the count taken accumulates
    # over those leaves, as in Slurm)
    took = 0
    for leaf in sorted({leaf_of[i] for i in required}):
        before = len(taken)
        if fill(leaf):
            return taken
        took += len(taken) - before
        decrement(leaf, took)

    def fits(s: int, rem_nodes: int) -> bool:
        return count[s] >= rem_nodes and room[s] >= need

    def compare(i: int, j: int, rem_nodes: int) -> tuple[int, bool]:
        """``_topo_compare_switches``: 1 when leaf ``i`` fits better than ``j``, -1 when
        worse, 0 when neither; and whether ``i`` fits (at the level compared last)."""
        while True:
            i_fit, j_fit = fits(i, rem_nodes), fits(j, rem_nodes)
            if i_fit and j_fit:
                if count[i] != count[j]:
                    return (1 if count[i] < count[j] else -1), i_fit
                break
            if i_fit or j_fit:
                return (1 if i_fit else -1), i_fit
            if parent(i) != parent(j):
                i, j = parent(i), parent(j)
                continue
            break
        if count[i] != count[j]:
            return (1 if count[i] > count[j] else -1), i_fit
        return 0, i_fit

    # 3b: further leaf switches, one at a time; distances from every switch above a required
    # node and every leaf chosen since (``_topo_add_dist``)
    sources = sorted(used)
    far = 1 << 20
    while need > 0:
        rem_nodes = 1 - len(taken)
        dist = {leaf: sum(hops(r, leaf) for r in sources) for leaf in range(n_leaves)}
        best = -1
        for leaf in range(n_leaves):
            if leaf in used or not count[leaf] or dist[leaf] >= far:
                continue
            if best < 0:
                best = leaf
                continue
            better, i_fit = compare(leaf, best, rem_nodes)
            if (dist[leaf] < dist[best] and i_fit) or (dist[leaf] == dist[best] and better > 0):
                best = leaf
        if best < 0:
            return None
        used.add(best)
        sources.append(best)
        if fill(best):
            break
        decrement(best, count[best])
        count[best] = 0
    return taken


def fixed_first_fit(free: Sequence[int], shape: Shape) -> Placement | None:
    """A fixed shape on the first ``shape.nodes`` nodes in index order with its GPUs per node
    free (``first_fit`` for a fixed request), or None."""
    per, pairs = shape.gpus_per_node, []
    for node, f in enumerate(free):
        if f >= per:
            pairs.append((node, per))
            if len(pairs) == shape.nodes:
                return Placement(tuple(pairs))
    return None


def _consecutive_best_fit(usable: Sequence[int], free: Sequence[int], shape: Shape) -> list[int]:
    """cons_tres ``_eval_nodes`` without topology, on free GPUs (see ``slurm_select``)."""
    runs: list[list[int]] = []
    for node in usable:
        if runs and runs[-1][-1] == node - 1:
            runs[-1].append(node)
        else:
            runs.append([node])
    rem_nodes, rem = shape.nodes, shape.num_gpus
    chosen: list[int] = []
    while rem_nodes > 0:
        best, best_sum, best_ok = -1, 0, False
        for r, run in enumerate(runs):
            if not run:
                continue
            total = sum(free[i] for i in run)
            ok = total >= rem and len(run) >= rem_nodes
            if (
                best < 0
                or (ok and not best_ok)
                or (ok and total < best_sum)
                or (not ok and total > best_sum)
            ):
                best, best_sum, best_ok = r, total, ok
        run = runs[best]
        if rem_nodes == 1:
            # best fit single node: the fewest free GPUs that still hold the rest
            pick = min((i for i in run if free[i] >= rem), key=lambda i: free[i], default=run[0])
            return [*chosen, pick]
        for node in run[:rem_nodes]:
            chosen.append(node)
            rem_nodes -= 1
            rem -= free[node]
        runs[best] = []
    return chosen


def _tree_best_fit(topo: Topology, usable: Sequence[int], nodes: int) -> list[int] | None:
    """cons_tres ``_eval_nodes_topo`` on usable nodes (see ``slurm_select``)."""
    by_leaf: dict[int, list[int]] = {}
    for node in usable:
        by_leaf.setdefault(topo.nodes[node].leaf, []).append(node)
    by_agg: dict[int, int] = {}
    for leaf, members in by_leaf.items():
        agg = topo.leaf_agg[leaf]
        by_agg[agg] = by_agg.get(agg, 0) + len(members)
    fitting = [(count, agg) for agg, count in by_agg.items() if count >= nodes]
    if fitting:
        top = min(fitting)[1]
        by_leaf = {leaf: m for leaf, m in by_leaf.items() if topo.leaf_agg[leaf] == top}
    chosen: list[int] = []
    rem = nodes
    while rem > 0 and by_leaf:
        fits = [(len(m), leaf) for leaf, m in by_leaf.items() if len(m) >= rem]
        leaf = min(fits)[1] if fits else min((-len(m), leaf) for leaf, m in by_leaf.items())[1]
        take = by_leaf.pop(leaf)[:rem]
        chosen.extend(take)
        rem -= len(take)
    return chosen if rem == 0 else None


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
