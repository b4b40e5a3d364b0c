"""Where Slurm's select/cons_tres starts a request now: a fixed shape (``slurm_select``,
nodes x GPUs per node; what ``backfill`` uses), ``first_fit`` for a fixed shape
(``fixed_first_fit``), and a flexible request (``slurm_select_flexible``, ``--gpus=N`` in
any split, and ``split_job_gpus``: how cons_tres splits the GPUs over the nodes it chose).
Pure and deterministic, as the generators (``generators``)."""

from __future__ import annotations

from collections.abc import Sequence

from linkwise.cluster.domain import Placement, Shape, Topology
from linkwise.cluster.placement.flexible_tree import flexible_tree_nodes
from linkwise.cluster.placement.generators import check_gpus

__all__ = [
    "fixed_first_fit",
    "slurm_select",
    "slurm_select_flexible",
    "slurm_select_usable",
    "split_job_gpus",
]


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

    - Several leaves (``topology/tree``): ``flexible_tree_nodes`` picks the nodes (Slurm's
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
    check_gpus(gpus)
    if sum(free) < gpus:
        return None
    if len(topo.leaf_names) > 1:
        nodes = flexible_tree_nodes(topo, free, gpus)
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
