"""Placements: where a composed policy puts a job it starts (or migrates).

Each placement is a small frozen value with ``place(topo, free, busy, flows, job)`` (None:
no placement now) and ``memo_key(job)``: within one decision free GPUs only shrink, so a
job of the same key that found no placement finds none later either (``place_greedy``
skips it). ``busy`` counts running jobs per node (SJF-BCO's busy-ness), ``flows`` the rings
crossing each link; both are kept up to date as jobs are placed.

- ``first_fit``: Slurm cons_tres-like first fit (``placement.first_fit``; ``fifo``'s);
- ``select``: Slurm's select on the job's requested shape (``placement.slurm_select``;
  ``backfill``'s);
- ``best_fit``: the tightest node, else the fewest nodes under one leaf
  (``placement.best_fit``);
- ``bounded``: SJF-BCO's consolidated/bounded rule (``bounded_placement``: FA-FFP for small
  jobs, LBSGF for large ones, a span of at most ``ceil(lam * n_min)`` servers);
- ``least_contention``: among the generators' placements, the one whose ring adds the
  least contention, counted in rings already on the links it would cross (SJF-BCO's
  ``flows`` sharing), then the fewest nodes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

from linkwise.cluster.domain import (
    ClusterState,
    Job,
    PendingJob,
    Placement,
    Start,
    Topology,
    fixed_shape,
    requested_shape,
)
from linkwise.cluster.placement.generators import (
    apply_placement,
    best_fit,
    bounded_placement,
    first_fit,
    fragment_first_fit,
    least_busy,
    same_leaf,
)
from linkwise.cluster.placement.slurm_select import (
    fixed_first_fit,
    slurm_select,
    slurm_select_flexible,
)


class PlacementRule(Protocol):
    """Where a job goes (see the module docstring)."""

    name: ClassVar[str]
    uses_busy: ClassVar[bool]  # whether it reads ``busy`` (else it may be passed empty)
    uses_flows: ClassVar[bool]  # whether it reads ``flows``

    def place(
        self,
        topo: Topology,
        free: Sequence[int],
        busy: Sequence[int],
        flows: Sequence[int],
        job: Job,
    ) -> Placement | None: ...

    def memo_key(self, job: Job) -> tuple[int, int]: ...


MEMO_SIZE = 4096  # placements ``Bounded`` remembers (about 1 MB on a 64-node cluster)


def can_ever_run(state: ClusterState, job: PendingJob) -> bool:
    """Whether the job fits the cluster at all (a larger one is ignored, never blocks)."""
    return job.job.num_gpus <= state.topology.total_gpus


def check_bco_params(kappa: int | None, lam: float) -> None:
    """SJF-BCO's parameter checks (ValueError): ``kappa >= 0`` or None, ``lam >= 1``."""
    if kappa is not None and kappa < 0:
        raise ValueError(f"kappa must be non-negative, got {kappa}")
    if not lam >= 1.0:
        raise ValueError(f"lam must be at least 1, got {lam}")


@dataclass(frozen=True, slots=True)
class FirstFit:
    """Slurm cons_tres-like first fit (``fifo``'s placement)."""

    name: ClassVar[str] = "first_fit"
    uses_busy: ClassVar[bool] = False
    uses_flows: ClassVar[bool] = False

    def place(
        self,
        topo: Topology,
        free: Sequence[int],
        busy: Sequence[int],
        flows: Sequence[int],
        job: Job,
    ) -> Placement | None:
        shape = fixed_shape(job, topo.max_gpus_per_node)
        if shape is not None:
            return fixed_first_fit(free, shape)
        return first_fit(topo, free, job.num_gpus)

    def memo_key(self, job: Job) -> tuple[int, int]:
        return _free_key(job)


@dataclass(frozen=True, slots=True)
class Select:
    """Slurm's select/cons_tres on the job's requested shape (``backfill``'s placement)."""

    name: ClassVar[str] = "select"
    uses_busy: ClassVar[bool] = False
    uses_flows: ClassVar[bool] = False

    def place(
        self,
        topo: Topology,
        free: Sequence[int],
        busy: Sequence[int],
        flows: Sequence[int],
        job: Job,
    ) -> Placement | None:
        if job.flexible:
            return slurm_select_flexible(topo, free, job.num_gpus)
        return slurm_select(topo, free, requested_shape(job, topo.max_gpus_per_node))

    def memo_key(self, job: Job) -> tuple[int, int]:
        return (job.num_gpus, -1 if job.flexible else job.nodes)


@dataclass(frozen=True, slots=True)
class BestFit:
    """Consolidated best fit (``placement.best_fit``)."""

    name: ClassVar[str] = "best_fit"
    uses_busy: ClassVar[bool] = False
    uses_flows: ClassVar[bool] = False

    def place(
        self,
        topo: Topology,
        free: Sequence[int],
        busy: Sequence[int],
        flows: Sequence[int],
        job: Job,
    ) -> Placement | None:
        shape = fixed_shape(job, topo.max_gpus_per_node)
        if shape is not None:
            return slurm_select(topo, free, shape)
        return best_fit(topo, free, job.num_gpus)

    def memo_key(self, job: Job) -> tuple[int, int]:
        return _free_key(job)


@dataclass(frozen=True, slots=True)
class Bounded:
    """SJF-BCO's consolidated/bounded placement (``bounded_placement``; ``kappa``, ``lam``)."""

    name: ClassVar[str] = "bounded"
    uses_busy: ClassVar[bool] = True
    uses_flows: ClassVar[bool] = False
    kappa: int | None = None
    lam: float = 1.0
    # the nodes' GPU counts, descending, of the topology last seen (it is immutable)
    _caps: list[tuple[Topology, list[int]]] = field(
        default_factory=list, init=False, compare=False, repr=False
    )
    # ``bounded_placement`` is a pure function of (free, busy, GPUs) on one topology: its
    # answers on the topology last seen, by exactly those (a decision point often meets the
    # free GPUs and busy-ness of the one before); emptied when full or the topology changes
    _memo: dict[tuple[tuple[int, ...], tuple[int, ...], int], Placement | None] = field(
        default_factory=dict, init=False, compare=False, repr=False
    )

    def __post_init__(self) -> None:
        check_bco_params(self.kappa, self.lam)

    def __deepcopy__(self, memo: dict[int, Any]) -> Bounded:
        """A copy sharing the caches (pure: their answers depend only on their keys): a
        policy forked at every decision point (``cluster.fork.fresh``, the residual's
        deviation) does not copy 4,096 remembered placements each time."""
        new = Bounded(kappa=self.kappa, lam=self.lam)
        object.__setattr__(new, "_caps", self._caps)
        object.__setattr__(new, "_memo", self._memo)
        memo[id(self)] = new
        return new

    def place(
        self,
        topo: Topology,
        free: Sequence[int],
        busy: Sequence[int],
        flows: Sequence[int],
        job: Job,
    ) -> Placement | None:
        shape = fixed_shape(job, topo.max_gpus_per_node)
        if shape is not None:
            return slurm_select(topo, free, shape)
        caps = self._caps
        memo = self._memo
        if not caps or caps[0][0] is not topo:
            caps[:] = [(topo, sorted((n.gpus for n in topo.nodes), reverse=True))]
            memo.clear()
        gpus = job.num_gpus
        key = (tuple(free), tuple(busy), gpus)
        if key in memo:
            return memo[key]
        if len(memo) >= MEMO_SIZE:
            memo.clear()
        placement = bounded_placement(topo, free, busy, gpus, self.kappa, self.lam, caps[0][1])
        memo[key] = placement
        return placement

    def memo_key(self, job: Job) -> tuple[int, int]:
        return _free_key(job)


_POOL = (best_fit, same_leaf, first_fit)


@dataclass(frozen=True, slots=True)
class LeastContention:
    """The generators' placement whose ring adds the least contention (module docstring)."""

    name: ClassVar[str] = "least_contention"
    uses_busy: ClassVar[bool] = True
    uses_flows: ClassVar[bool] = True

    def place(
        self,
        topo: Topology,
        free: Sequence[int],
        busy: Sequence[int],
        flows: Sequence[int],
        job: Job,
    ) -> Placement | None:
        gpus = job.num_gpus
        shape = fixed_shape(job, topo.max_gpus_per_node)
        if shape is not None:
            return slurm_select(topo, free, shape)
        pool = [gen(topo, free, gpus) for gen in _POOL]
        pool += [least_busy(topo, free, gpus, busy), fragment_first_fit(topo, free, gpus, busy)]
        best: Placement | None = None
        best_key = (0, 0)
        for p in pool:
            if p is None:
                continue
            added = (
                sum(flows[link] for link in topo.ring_links(p.nodes, job.job_id)) if flows else 0
            )
            key = (added, p.num_nodes)
            if best is None or key < best_key:
                best, best_key = p, key
        return best

    def memo_key(self, job: Job) -> tuple[int, int]:
        return _free_key(job)


def _free_key(job: Job) -> tuple[int, int]:
    """``memo_key`` of the placements that split a job as they see fit: its GPUs, and for a
    fixed request (which they place in its shape) its node count, below zero."""
    return (job.num_gpus, -1 - job.nodes if job.flexible is False else 0)


PLACEMENTS: dict[str, type] = {
    p.name: p for p in (FirstFit, Select, BestFit, Bounded, LeastContention)
}


def add_flows(
    topo: Topology, flows: list[int], placement: Placement, sign: int = 1, job: int = 0
) -> None:
    """Count a ring over ``placement`` on the links it crosses (in place; ``sign=-1`` removes;
    ``job``: its job's id, which picks its uplinks under ECMP)."""
    if placement.num_nodes > 1 and flows:
        for link in topo.ring_links(placement.nodes, job):
            flows[link] += sign


def add_busy(busy: list[int], placement: Placement, sign: int = 1) -> None:
    """Count one more (``sign=-1``: one fewer) running job on every node of ``placement``."""
    for node, _ in placement.alloc:
        busy[node] += sign


def place_greedy(
    topo: Topology,
    jobs: Sequence[Job],
    rule: PlacementRule,
    free: list[int],
    busy: list[int],
    flows: list[int],
    *,
    strict: bool = False,
    by_size: bool = False,
) -> list[Start]:
    """Start ``jobs`` in this order where ``rule`` places them, updating ``free``, ``busy``
    and ``flows`` in place (each only where ``rule`` reads it: ``uses_busy``,
    ``uses_flows``; otherwise it may be passed empty). Greedy (default): a job that cannot
    be placed now waits and the scan goes on; ``strict``: the scan stops at the first such
    job (FIFO's head-of-line blocking). ``by_size``: ``jobs`` is by GPU count ascending,
    so the scan stops at the first job larger than the free GPUs. Jobs larger than the
    cluster are skipped."""
    total = sum(free)
    cluster = topo.total_gpus
    track_busy, track_flows = rule.uses_busy, rule.uses_flows and bool(flows)
    starts: list[Start] = []
    unplaceable: set[tuple[int, int]] = set()
    for job in jobs:
        gpus = job.num_gpus
        if gpus > cluster:
            continue
        if gpus > total:
            if strict or by_size:
                break
            continue
        key = rule.memo_key(job)
        if key in unplaceable:
            continue
        placement = rule.place(topo, free, busy, flows, job)
        if placement is None:
            if strict:
                break
            unplaceable.add(key)
            continue
        apply_placement(free, placement)
        if track_busy:
            add_busy(busy, placement)
        if track_flows:
            add_flows(topo, flows, placement, job=job.job_id)
        total -= gpus
        starts.append(Start(job.job_id, placement))
    return starts
