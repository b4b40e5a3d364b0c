"""Parallel layouts of LLM jobs: pipeline stages over a placement (issue 33 item 4).

A job with ``Job.pp`` = P > 1 runs P pipeline-parallel (PP) stages, tensor parallelism (TP)
inside a node and data parallelism (DP) over each stage's nodes. Its ranks follow
Megatron-LM's default order (TP innermost, then DP, then PP outermost) over the placement's
node list (node index order, as Slurm lists an allocation's hosts), each node's GPUs
consecutive: stage s holds GPU ranks [s G/P, (s+1) G/P), so consecutive nodes, and rank j of
stage s sends its activations to rank j of stage s+1.

Its communication per iteration (``LayoutComm``, what ``contention.AnalyticModel`` times):

- per stage, one ring all-reduce over the stage's nodes of the gradient volume / P (the
  model's ring rule: ``(grad_gb / P / g) * 2 (g - 1)`` over the ring's bottleneck for g GPUs
  in the stage; on one node over the node's intra-node bandwidth); stages all-reduce at once,
  so the slowest stage counts;
- between consecutive stages, point-to-point: each pair of nodes that holds peer ranks
  carries ``CommProfile.act_gb`` per GPU pair over the links between them (on one node over
  its intra-node bandwidth); the slowest pair of the slowest boundary counts (the pipeline
  runs at its slowest hop; exposed, added to the iteration, a simplification).

Iteration time = compute + slowest stage's all-reduce + slowest point-to-point + the per-node
overhead, as the single ring's. A job counts once on each link any of its transfers crosses,
weighted as a ring is (its duty cycle), and its own transfers do not slow one another.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Any

from linkwise.cluster.domain import Job, Placement, Topology
from linkwise.cluster.profiles import CommProfile

Alloc = tuple[tuple[int, int], ...]  # (node, GPUs) pairs, in rank order


def stages(placement: Placement, pp: int) -> tuple[Alloc, ...]:
    """Each stage's (node, GPUs) in rank order: the placement's GPUs cut into ``pp`` equal
    consecutive runs (a node may fall in two stages where its GPUs do not split evenly)."""
    per = placement.num_gpus // pp
    out: list[Alloc] = []
    cur: list[tuple[int, int]] = []
    need = per
    for node, gpus in placement.alloc:
        while gpus > 0:
            take = min(gpus, need)
            cur.append((node, take))
            gpus -= take
            need -= take
            if need == 0:
                out.append(tuple(cur))
                cur, need = [], per
    return tuple(out)


def peer_pairs(a: Alloc, b: Alloc) -> tuple[tuple[int, int, int], ...]:
    """(node in stage s, node in stage s+1, GPU pairs between them): rank j of ``a`` talks
    to rank j of ``b``."""
    out: list[tuple[int, int, int]] = []
    i = j = 0
    left_a, left_b = (a[0][1], b[0][1]) if a and b else (0, 0)
    while i < len(a) and j < len(b):
        take = min(left_a, left_b)
        out.append((a[i][0], b[j][0], take))
        left_a -= take
        left_b -= take
        if left_a == 0:
            i += 1
            left_a = a[i][1] if i < len(a) else 0
        if left_b == 0:
            j += 1
            left_b = b[j][1] if j < len(b) else 0
    return tuple(out)


def stage_leaves(topo: Topology, placement: Placement, pp: int) -> tuple[int, ...]:
    """How many leaf switches each stage's nodes (its DP group) span."""
    return tuple(len({topo.nodes[n].leaf for n, _ in s}) for s in stages(placement, pp))


@dataclass(frozen=True, slots=True)
class Transfer:
    """One of a job's transfers: the links it crosses, its volume over its bottleneck
    bandwidth (GB, per lane on a rail fabric) and the bound no link raises (per lane)."""

    links: tuple[int, ...]
    volume: float
    bound: float

    def seconds(
        self, load: Sequence[float], gbps: Sequence[float], alpha: float, own: float
    ) -> float:
        """Its time with ``load[link]`` on each of its links (its own job's ``own`` included)."""
        if not self.volume:
            return 0.0
        bw = self.bound
        for link in self.links:
            k = 1.0 + max(0.0, load[link] - own)  # this job plus the others on the link
            bw = min(bw, gbps[link] / (k + alpha * (k - 1) if k > 1 else 1.0))
        return self.volume / bw


@dataclass(frozen=True, slots=True)
class LayoutComm:
    """A layout job's transfers at one placement and its iteration-time terms (module
    docstring); ``links`` and ``weight`` as a ring's, ``last`` the loads and time last timed."""

    dp: tuple[Transfer, ...]
    p2p: tuple[Transfer, ...]
    links: tuple[int, ...]  # every link any transfer crosses, once
    weight: float
    compute: float
    overhead: float
    last: list[Any] = field(default_factory=lambda: [None, 0.0], compare=False, repr=False)

    def time(self, load: Sequence[float], gbps: Sequence[float], alpha: float) -> float:
        """Per-iteration time with ``load[link]`` on each link (every job's weight on it)."""
        own = self.weight
        dp = max([t.seconds(load, gbps, alpha, own) for t in self.dp], default=0.0)
        p2p = max([t.seconds(load, gbps, alpha, own) for t in self.p2p], default=0.0)
        return self.compute + dp + p2p + self.overhead

    def alone(self, gbps: Sequence[float]) -> float:
        """Per-iteration time with nobody else on its links."""
        return self.time([self.weight] * len(gbps), gbps, 0.0)

    def with_weight(self, weight: float) -> LayoutComm:
        return LayoutComm(self.dp, self.p2p, self.links, weight, self.compute, self.overhead)


def layout_comm(
    topo: Topology,
    job: Job,
    placement: Placement,
    profile: CommProfile,
    overhead_s: float,
    *,
    ideal: bool = False,
) -> LayoutComm:
    """The job's transfers at ``placement`` (weight 0: the caller sets it). ``ideal``: the
    rate-1 reference, every transfer between nodes at the fastest NIC and intra-node link,
    crossing no shared link (``AnalyticModel.best_time``)."""
    pp = job.pp
    parts = stages(placement, pp)
    intra_max = max(n.intra_gbps for n in topo.nodes)
    nic_max = max(n.nic_gbps for n in topo.nodes)

    def transfer(alloc: Alloc, volume: float) -> Transfer:
        nodes = tuple(sorted({n for n, _ in alloc}))
        fewest = min(g for _, g in alloc)
        lanes = len(topo.job_rails(job.job_id, fewest)) if topo.rails and len(nodes) > 1 else 1
        lanes = max(1, lanes)
        if ideal:
            intra = intra_max / lanes if lanes > 1 else intra_max
            bound = intra if len(nodes) == 1 else min(intra, nic_max)
            return Transfer((), volume / lanes if lanes > 1 else volume, bound)
        intra = min(topo.nodes[n].intra_gbps for n in nodes)
        links = topo.ring_links(nodes, job.job_id, fewest if topo.rails else 0)
        return Transfer(
            links, volume / lanes if lanes > 1 else volume, intra / lanes if lanes > 1 else intra
        )

    grad = profile.grad_gb / pp
    dp = []
    for alloc in parts:
        g = sum(x for _, x in alloc)
        dp.append(transfer(alloc, (grad / g) * 2.0 * (g - 1) if g > 1 else 0.0))
    p2p = []
    for a, b in pairwise(parts):
        for src, dst, pairs in peer_pairs(a, b):
            alloc = ((src, pairs),) if src == dst else ((src, pairs), (dst, pairs))
            p2p.append(transfer(alloc, profile.act_gb * pairs))
    links = tuple(sorted({link for t in (*dp, *p2p) for link in t.links}))
    overhead = overhead_s * placement.num_nodes if placement.num_nodes > 1 else 0.0
    return LayoutComm(tuple(dp), tuple(p2p), links, 0.0, profile.compute_s, overhead)


def has_layout(job: Job, placement: Placement) -> bool:
    """Whether the job is modelled by its layout at this placement: stages over more than
    one node (on one node, or without stages, it is one ring as before layouts)."""
    return job.pp > 1 and len(placement.alloc) > 1 and job.num_gpus > 1
