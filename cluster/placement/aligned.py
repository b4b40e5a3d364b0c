"""Group-aligned placement of a job with pipeline stages (Arnold's alignment, issue 33 item 4).

Arnold (He et al., "Efficient Pre-Training of LLMs via Topology-Aware Communication Alignment
on More Than 9600 GPUs", NeurIPS'25) places an LLM job's communication groups to match the
fat-tree: data-parallel groups, whose all-reduce is the heavy traffic, kept under as few
switches as may be, pipeline point-to-point traffic (smaller) allowed to cross. This is our
own greedy rule for the same aim, not Arnold's solver:

- the job takes whole nodes (``k`` GPUs on each: its fixed shape's, else a node's GPUs) in
  ``P`` stages of ``d`` nodes (``cluster.layout``: stage s is the s-th run of ``d`` nodes
  in node order);
- each leaf with ``c`` nodes that have ``k`` GPUs free can hold ``c // d`` whole stages;
- the stages go under one aggregation switch where one can hold them all (the one that
  holds the fewest more than needed), else over the aggregation switches holding the most;
  within one, on the leaves holding the most stages first, the last taking the leaf that
  fits its remainder tightest (so the job spans the fewest leaves);
- within a leaf, the nodes with the fewest free GPUs first (then the lowest index).

None where the free nodes cannot hold every stage under one leaf, or where the stages in
node order would not fall so (a topology whose leaves are not runs of node indices).
"""

from __future__ import annotations

from collections.abc import Sequence

from linkwise.cluster.domain import Job, Placement, Topology, fixed_shape
from linkwise.cluster.layout import stage_leaves


def aligned_placement(topo: Topology, free: Sequence[int], job: Job) -> Placement | None:
    """The job's group-aligned placement on the free GPUs (module docstring), or None."""
    pp = job.pp
    shape = fixed_shape(job, topo.max_gpus_per_node)
    k = shape.gpus_per_node if shape is not None else topo.max_gpus_per_node
    if pp <= 1 or k <= 0 or job.num_gpus % k:
        return None
    n = job.num_gpus // k
    if n < 2 or n % pp:
        return None
    d = n // pp
    eligible: list[list[int]] = [[] for _ in topo.leaf_names]
    for i, node in enumerate(topo.nodes):
        if free[i] >= k:
            eligible[node.leaf].append(i)
    held = [len(e) // d for e in eligible]
    by_agg: dict[int, list[int]] = {}
    for leaf, h in enumerate(held):
        if h:
            by_agg.setdefault(topo.leaf_agg[leaf], []).append(leaf)
    total = {a: sum(held[leaf] for leaf in leaves) for a, leaves in by_agg.items()}
    if sum(total.values()) < pp:
        return None
    fits = [a for a in by_agg if total[a] >= pp]
    aggs = (
        [min(fits, key=lambda a: (total[a], a))]
        if fits
        else sorted(by_agg, key=lambda a: (-total[a], a))
    )
    chosen: list[int] = []
    need = pp
    for agg in aggs:
        leaves = sorted(by_agg[agg], key=lambda leaf: (-held[leaf], leaf))
        while need and leaves:
            tight = [leaf for leaf in leaves if held[leaf] >= need]
            leaf = min(tight, key=lambda x: (held[x], x)) if tight else leaves[0]
            leaves.remove(leaf)
            take = min(held[leaf], need)
            nodes = sorted(eligible[leaf], key=lambda i: (free[i], i))
            chosen.extend(nodes[: take * d])
            need -= take
        if not need:
            break
    placement = Placement.of([(i, k) for i in chosen])
    return placement if max(stage_leaves(topo, placement, pp)) == 1 else None
