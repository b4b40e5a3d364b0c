"""Contention models: how fast each job progresses given everything placed beside it.

A job's *rate* is its isolated per-iteration time at its best placement divided by its
per-iteration time where it runs now, next to the others: 1.0 means "as fast as alone
and consolidated", 0.5 means "takes twice as long". Rates never exceed 1.

Two models share one interface (``ContentionModel``):

- ``AnalyticModel``: SJF-BCO's ring all-reduce model (MobiHoc'22) generalised to the
  topology. A ring over one node runs at the node's intra-node bandwidth; a ring split
  across nodes is bottlenecked by the slowest network link it crosses (NICs, leaf and
  aggregation uplinks), each link shared among the k rings crossing it with the penalty
  f(k) = k + alpha (k - 1). Only split jobs use the network, so only they contend.
- ``EmpiricalModel``: DeepShare's measured pairwise shared/isolated throughput ratios
  applied directly to split jobs sharing a node (product over neighbours).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from linkwise.cluster.domain import Job, Placement, Topology
from linkwise.cluster.profiles import Calibration, CommProfile


def sharing_penalty(k: int, alpha: float) -> float:
    """SJF-BCO's f(k) = k + alpha (k - 1): effective divisor of a link shared by k rings."""
    return k + alpha * (k - 1) if k > 1 else 1.0


def ring_iteration_time(
    profile: CommProfile, gpus: int, nodes: int, bandwidth_gbps: float, overhead_s: float
) -> float:
    """Per-iteration time of a ring all-reduce job (SJF-BCO's tau_j).

    ``bandwidth_gbps`` is the ring's bottleneck: intra-node bandwidth on one node, the
    (shared) network bottleneck otherwise. The reduction term is folded into compute.
    """
    if gpus <= 1:
        return profile.compute_s
    comm = (profile.grad_gb / gpus) * 2.0 * (gpus - 1) / bandwidth_gbps
    overhead = overhead_s * nodes if nodes > 1 else 0.0
    return profile.compute_s + comm + overhead


class ContentionModel(Protocol):
    """Progress rates of placed jobs; the simulator's only view of the network."""

    @property
    def name(self) -> str: ...

    def rates(self, topo: Topology, placed: Sequence[tuple[Job, Placement]]) -> list[float]:
        """Rate of each job (same order) when all of them run at once."""
        ...

    def best_time(self, topo: Topology, job: Job) -> float:
        """Isolated per-iteration time at the job's best placement (the rate-1 reference)."""
        ...


def min_nodes(topo: Topology, gpus: int) -> int:
    """Fewest nodes that can hold ``gpus`` GPUs in this topology."""
    return max(1, math.ceil(gpus / topo.max_gpus_per_node))


@dataclass(frozen=True)
class AnalyticModel:
    """SJF-BCO's ring model on the real topology, with calibrated profiles."""

    calibration: Calibration
    name: str = "analytic"
    _best: dict[tuple[str, int, int], float] = field(
        default_factory=dict, compare=False, repr=False
    )

    def profile(self, job: Job) -> CommProfile:
        try:
            return self.calibration.profiles[job.profile]
        except KeyError:
            known = ", ".join(sorted(self.calibration.profiles))
            raise ValueError(
                f"job {job.job_id}: unknown profile {job.profile!r} (known: {known})"
            ) from None

    def best_time(self, topo: Topology, job: Job) -> float:
        key = (job.profile, job.num_gpus, id(topo))
        cached = self._best.get(key)
        if cached is not None:
            return cached
        prof = self.profile(job)
        n = min_nodes(topo, job.num_gpus)
        if n == 1:
            bw = max(node.intra_gbps for node in topo.nodes)
        else:
            bw = max(node.nic_gbps for node in topo.nodes)
        best = ring_iteration_time(prof, job.num_gpus, n, bw, self.calibration.overhead_s)
        self._best[key] = best
        return best

    def iteration_times(
        self, topo: Topology, placed: Sequence[tuple[Job, Placement]]
    ) -> list[float]:
        """Per-iteration time of each placed job next to all the others."""
        flows = link_flows(topo, (p for _, p in placed))
        alpha = self.calibration.alpha
        gbps = topo.link_gbps
        out: list[float] = []
        for job, placement in placed:
            prof = self.profile(job)
            nodes = placement.nodes
            if len(nodes) == 1:
                bw = topo.nodes[nodes[0]].intra_gbps
            else:
                bw = min(
                    gbps[link] / sharing_penalty(flows[link], alpha)
                    for link in topo.ring_links(nodes)
                )
            out.append(
                ring_iteration_time(prof, job.num_gpus, len(nodes), bw, self.calibration.overhead_s)
            )
        return out

    def rates(self, topo: Topology, placed: Sequence[tuple[Job, Placement]]) -> list[float]:
        times = self.iteration_times(topo, placed)
        return [
            min(1.0, self.best_time(topo, job) / t)
            for (job, _), t in zip(placed, times, strict=True)
        ]


def link_flows(topo: Topology, placements: Iterable[Placement]) -> list[int]:
    """Number of split rings crossing each link of the topology."""
    flows = [0] * len(topo.links)
    for placement in placements:
        if placement.num_nodes > 1:
            for link in topo.ring_links(placement.nodes):
                flows[link] += 1
    return flows


@dataclass(frozen=True)
class PairwiseTable:
    """DeepShare's measurements: isolated throughput and shared/isolated ratio per job type.

    A job type is ``(model, total GPUs, nodes)``, e.g. ``("MoE", 8, 4)``.
    """

    isolated: Mapping[tuple[str, int, int], float]
    ratio: Mapping[tuple[tuple[str, int, int], tuple[str, int, int]], float]

    @property
    def models(self) -> tuple[str, ...]:
        return tuple(sorted({m for m, _, _ in self.isolated}))

    def nearest_type(self, model: str, gpus: int, nodes: int) -> tuple[str, int, int]:
        """The measured type closest to a job's shape (log distance in GPUs, then nodes)."""
        candidates = [t for t in self.isolated if t[0] == model]
        if not candidates:
            raise ValueError(f"no DeepShare measurements for model {model!r} (have {self.models})")
        return min(
            candidates,
            key=lambda t: (
                abs(math.log2(t[1]) - math.log2(gpus)),
                abs(math.log2(t[2]) - math.log2(nodes)),
            ),
        )


@dataclass(frozen=True)
class EmpiricalModel:
    """DeepShare's measured pairwise ratios: a split job's rate is the product of its
    measured ratios against every other split job it shares a node with, times its
    measured isolated locality penalty (throughput at this spread / at the fewest nodes)."""

    table: PairwiseTable
    name: str = "empirical"

    def best_time(self, topo: Topology, job: Job) -> float:
        t = self.table.nearest_type(job.profile, job.num_gpus, min_nodes(topo, job.num_gpus))
        return 1.0 / self.table.isolated[t]

    def rates(self, topo: Topology, placed: Sequence[tuple[Job, Placement]]) -> list[float]:
        types = [
            self.table.nearest_type(job.profile, job.num_gpus, placement.num_nodes)
            for job, placement in placed
        ]
        node_sets = [set(p.nodes) if p.num_nodes > 1 else set() for _, p in placed]
        out: list[float] = []
        for i, (job, _) in enumerate(placed):
            rate = min(1.0, self.table.isolated[types[i]] * self.best_time(topo, job))
            if node_sets[i]:
                for j in range(len(placed)):
                    if j != i and node_sets[i] & node_sets[j]:
                        rate *= self.table.ratio[(types[i], types[j])]
            out.append(rate)
        return out
