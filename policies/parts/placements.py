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
  ``flows`` sharing), then the fewest nodes;
- ``least_loaded``: the most compact node set (fewest nodes, then fewest leaves) whose ring
  meets the least traffic: its most loaded uplink (under ECMP the parallel uplinks its hops
  hash onto), then the load on all its links, traffic being the running rings' estimated
  demand (``parts.traffic``); a fixed request in its shape, on the leaf that suits best;
- ``apart``: ``least_loaded``, but a communication-heavy job (its profile's demand at least
  ``heavy_gbps``) first avoids links carrying another heavy ring, among node sets equally
  compact;
- ``wait_or_spread``: a flexible job starts on a compact node set (the fewest nodes and
  leaves that could hold it on an empty cluster) when one is free; else it waits up to
  ``wait_s`` from its submission (Slurm's ``--switches=N@T``, 300 s by default), then
  spreads on the ``least_loaded`` choice within ``ceil(lam * n_min)`` nodes (and, with
  ``min_rate``, only where the contention model predicts it at least that rate alone);
- ``group_aware``: ``bounded``, but a job with pipeline stages (``Job.pp``) whose bounded
  placement splits a stage's DP group over leaves takes ``placement.aligned``'s choice
  (Arnold's alignment: each DP group under one leaf, the stages under the fewest switches).

A rule is bound to the decision's state (``at``) before it places anything: the three
above read the running jobs' placements and profiles and the time there, and keep the
decision's own starts in their traffic (``wake_at``: when a job waiting for a compact set
spreads, the decision point they ask for).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar, Protocol

from linkwise.cluster.contention import AnalyticModel, ContentionModel
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
from linkwise.cluster.layout import stage_leaves
from linkwise.cluster.placement.aligned import aligned_placement
from linkwise.cluster.placement.generators import (
    apply_placement,
    best_fit,
    bounded_placement,
    first_fit,
    fragment_first_fit,
    least_busy,
    min_nodes_for,
    same_leaf,
)
from linkwise.cluster.placement.slurm_select import (
    fixed_first_fit,
    slurm_select,
    slurm_select_flexible,
)
from linkwise.cluster.profiles import load_calibration
from linkwise.policies.parts.traffic import (
    HEAVY_GBPS,
    LinkLoad,
    demand_of,
    fewest_leaves,
    fixed_candidates,
    flexible_candidates,
    leaves_of,
    profile_demands,
    span_bound,
    traffic_of,
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

    def at(self, state: ClusterState) -> PlacementRule:
        """The rule as it applies at this decision (itself where it reads nothing of it)."""
        ...

    def wake_at(self) -> float:
        """The decision point a bound rule asks for (inf: none)."""
        ...


class Stateless:
    """``at`` and ``wake_at`` of a rule that reads nothing of the decision's state."""

    __slots__ = ()

    def at(self, state: ClusterState) -> PlacementRule:
        return self  # type: ignore[return-value]

    def wake_at(self) -> float:
        return math.inf


WAIT_S = 300.0  # Slurm's default max wait of --switches (max_switch_wait, SchedulerParameters)
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
class FirstFit(Stateless):
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
class Select(Stateless):
    """Slurm's select/cons_tres on the job's requested shape (``backfill``'s placement);
    with ``switches`` N > 0 Slurm's ``--switches=N@max_wait_s``: a start spanning more
    than N leaf switches waits until ``max_wait_s`` after the job's submission
    (``held``), and the decision asks for a decision point when the first pending
    job's wait ends (Slurm's next pass then places it anywhere)."""

    name: ClassVar[str] = "select"
    uses_busy: ClassVar[bool] = False
    uses_flows: ClassVar[bool] = False
    switches: int = 0
    max_wait_s: float = WAIT_S
    _now: float = field(default=math.inf, compare=False, repr=False)
    _wake: float = field(default=math.inf, compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.switches < 0:
            raise ValueError(f"switches must be non-negative, got {self.switches}")
        if not self.max_wait_s >= 0:
            raise ValueError(f"max_wait_s must be non-negative, got {self.max_wait_s}")

    def at(self, state: ClusterState) -> PlacementRule:
        if not self.switches:
            return self
        ends = (p.job.submit_time + self.max_wait_s for p in state.pending)
        wake = min((t for t in ends if t > state.time), default=math.inf)
        return replace(self, _now=state.time, _wake=wake)

    def wake_at(self) -> float:
        return self._wake

    def place(
        self,
        topo: Topology,
        free: Sequence[int],
        busy: Sequence[int],
        flows: Sequence[int],
        job: Job,
    ) -> Placement | None:
        if job.flexible:
            found = slurm_select_flexible(topo, free, job.num_gpus)
        else:
            found = slurm_select(topo, free, requested_shape(job, topo.max_gpus_per_node))
        if self.held(topo, found, job, self._now):
            return None
        return found

    def held(self, topo: Topology, placement: Placement | None, job: Job, now: float) -> bool:
        """Whether the job's ``--switches`` keep it from ``placement`` now: it spans more
        than N leaf switches and the job is still ``waiting``."""
        return (
            placement is not None
            and self.waiting(job, now)
            and leaves_of(topo, placement) > self.switches
        )

    def waiting(self, job: Job, now: float) -> bool:
        """Whether the job's ``--switches`` still hold it to N leaf switches at ``now``: it
        was submitted less than T ago (Slurm counts from eligibility; here the submission,
        which a preempted job's requeue does not reset)."""
        return self.switches > 0 and now < job.submit_time + self.max_wait_s

    def memo_key(self, job: Job) -> tuple[int, int]:
        key = (job.num_gpus, -1 if job.flexible else job.nodes)
        if self.waiting(job, self._now):
            return (key[0], key[1] + (1 << 31))  # still held to its switches
        return key


@dataclass(frozen=True, slots=True)
class BestFit(Stateless):
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
class Bounded(Stateless):
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


@dataclass(frozen=True, slots=True)
class GroupAware(Stateless):
    """``bounded`` (``kappa``, ``lam``), a layout job's DP groups kept under one leaf each
    where its bounded placement splits one and an aligned set is free (module docstring)."""

    name: ClassVar[str] = "group_aware"
    uses_busy: ClassVar[bool] = True
    uses_flows: ClassVar[bool] = False
    kappa: int | None = None
    lam: float = 1.0
    _base: Bounded = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_base", Bounded(self.kappa, self.lam))

    def place(
        self,
        topo: Topology,
        free: Sequence[int],
        busy: Sequence[int],
        flows: Sequence[int],
        job: Job,
    ) -> Placement | None:
        found = self._base.place(topo, free, busy, flows, job)
        if job.pp <= 1 or (found is not None and max(stage_leaves(topo, found, job.pp)) == 1):
            return found
        return aligned_placement(topo, free, job) or found

    def memo_key(self, job: Job) -> tuple[int, int]:
        key = _free_key(job)
        return key if job.pp <= 1 else (key[0], key[1] - (job.pp << 32))


_POOL = (best_fit, same_leaf, first_fit)


@dataclass(frozen=True, slots=True)
class LeastContention(Stateless):
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


@dataclass(slots=True)
class _Bound:
    """What a network-aware rule knows at one decision: its time, the traffic (counted from
    the state's running jobs when first asked, then updated by every start it places) and
    the earliest time a job it held back may spread."""

    now: float
    state: ClusterState | None
    demands: dict[str, float]
    heavy_gbps: float
    wake: float = math.inf
    _load: LinkLoad | None = None

    @property
    def load(self) -> LinkLoad:
        if self._load is None:
            assert self.state is not None  # ``_idle`` gives its load
            self._load = traffic_of(self.state, self.demands, self.heavy_gbps)
        return self._load


def _idle(topo: Topology) -> _Bound:
    """A rule used without ``at``: an idle fabric, and a time at which nothing waits."""
    n = len(topo.links)
    return _Bound(math.inf, None, {}, HEAVY_GBPS, _load=LinkLoad(topo, [0.0] * n, [0] * n))


def _demands(model: ContentionModel | None) -> dict[str, float]:
    """The profiles' demands from the model's calibration (the shipped one otherwise)."""
    cal = model.calibration if isinstance(model, AnalyticModel) else load_calibration()
    return profile_demands(cal)


def _candidates(topo: Topology, free: Sequence[int], job: Job, load: LinkLoad) -> list[Placement]:
    """The node sets a network-aware rule weighs (``parts.traffic``)."""
    shape = fixed_shape(job, topo.max_gpus_per_node)
    if shape is not None:
        return fixed_candidates(topo, free, shape)
    return flexible_candidates(topo, free, job.num_gpus, load)


def _loaded_key(topo: Topology, load: LinkLoad, p: Placement, job: Job) -> tuple[Any, ...]:
    """``least_loaded``'s preference: fewest nodes, fewest leaves, least loaded uplink,
    least load on all its links."""
    up, total, _ = load.score(p, job.job_id)
    return (p.num_nodes, leaves_of(topo, p), up, total)


@dataclass(frozen=True, slots=True)
class _NetworkRule(Stateless):
    """What ``least_loaded``, ``apart`` and ``wait_or_spread`` share: the profiles' demands,
    the binding to a decision, and the traffic kept up to date with their own starts."""

    uses_busy: ClassVar[bool] = False
    uses_flows: ClassVar[bool] = False
    heavy_gbps: float = HEAVY_GBPS
    model: ContentionModel | None = field(default=None, compare=False, repr=False)
    _demands: dict[str, float] = field(default_factory=dict, compare=False, repr=False)
    _bound: _Bound | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        if not self.heavy_gbps >= 0:
            raise ValueError(f"heavy_gbps must be non-negative, got {self.heavy_gbps}")
        if not self._demands:
            object.__setattr__(self, "_demands", _demands(self.model))

    def at(self, state: ClusterState) -> PlacementRule:
        bound = _Bound(state.time, state, self._demands, self.heavy_gbps)
        return replace(self, _bound=bound)  # type: ignore[return-value]

    def wake_at(self) -> float:
        return math.inf if self._bound is None else self._bound.wake

    def place(
        self,
        topo: Topology,
        free: Sequence[int],
        busy: Sequence[int],
        flows: Sequence[int],
        job: Job,
    ) -> Placement | None:
        bound = self._bound if self._bound is not None else _idle(topo)
        demand = demand_of(self._demands, job.profile)
        chosen = self.choose(topo, free, job, bound, demand)
        if chosen is not None:
            bound.load.add(chosen, job.job_id, demand, demand >= self.heavy_gbps)
        return chosen

    def choose(
        self, topo: Topology, free: Sequence[int], job: Job, bound: _Bound, demand: float
    ) -> Placement | None:
        raise NotImplementedError

    def memo_key(self, job: Job) -> tuple[int, int]:
        return _free_key(job)


@dataclass(frozen=True, slots=True)
class LeastLoaded(_NetworkRule):
    """The most compact node set whose ring meets the least traffic (module docstring)."""

    name: ClassVar[str] = "least_loaded"

    def choose(
        self, topo: Topology, free: Sequence[int], job: Job, bound: _Bound, demand: float
    ) -> Placement | None:
        pool = _candidates(topo, free, job, bound.load)
        return min(pool, key=lambda p: _loaded_key(topo, bound.load, p, job), default=None)


@dataclass(frozen=True, slots=True)
class Apart(_NetworkRule):
    """``least_loaded``, heavy rings kept off links with another heavy ring (docstring)."""

    name: ClassVar[str] = "apart"

    def choose(
        self, topo: Topology, free: Sequence[int], job: Job, bound: _Bound, demand: float
    ) -> Placement | None:
        pool = _candidates(topo, free, job, bound.load)
        key = _apart_key if demand >= self.heavy_gbps else _loaded_key
        return min(pool, key=lambda p: key(topo, bound.load, p, job), default=None)


def _apart_key(topo: Topology, load: LinkLoad, p: Placement, job: Job) -> tuple[Any, ...]:
    """``apart``'s preference for a heavy job: fewest nodes, fewest leaves, fewest heavy
    rings on its links, then as ``least_loaded``."""
    up, total, heavy = load.score(p, job.job_id)
    return (p.num_nodes, leaves_of(topo, p), heavy, up, total)


@dataclass(frozen=True, slots=True)
class WaitOrSpread(_NetworkRule):
    """A flexible job waits up to ``wait_s`` for a compact node set, then spreads
    (module docstring): ``wait_s``, ``lam``, ``min_rate``, ``heavy_gbps``; ``apart``
    chooses among node sets as ``apart`` does."""

    name: ClassVar[str] = "wait_or_spread"
    wait_s: float = WAIT_S
    lam: float = math.inf
    min_rate: float = 0.0
    apart: bool = False  # choose as ``apart`` does (else as ``least_loaded``)

    def __post_init__(self) -> None:
        _NetworkRule.__post_init__(self)
        if not self.wait_s >= 0:
            raise ValueError(f"wait_s must be non-negative, got {self.wait_s}")
        if not self.lam >= 1.0:
            raise ValueError(f"lam must be at least 1, got {self.lam}")
        if not 0.0 <= self.min_rate <= 1.0:
            raise ValueError(f"min_rate must be in [0, 1], got {self.min_rate}")
        if self.min_rate > 0 and self.model is None:
            object.__setattr__(self, "model", AnalyticModel(load_calibration()))

    def choose(
        self, topo: Topology, free: Sequence[int], job: Job, bound: _Bound, demand: float
    ) -> Placement | None:
        pool = _candidates(topo, free, job, bound.load)
        if not pool:
            return None
        rank = _apart_key if self.apart and demand >= self.heavy_gbps else _loaded_key

        def key(p: Placement) -> tuple[Any, ...]:
            return rank(topo, bound.load, p, job)

        if fixed_shape(job, topo.max_gpus_per_node) is not None:
            return min(pool, key=key)  # a fixed shape has nothing to wait for
        n_min, l_min = _compact(topo, job.num_gpus)
        compact = [p for p in pool if p.num_nodes <= n_min and leaves_of(topo, p) <= l_min]
        if compact:
            return min(compact, key=key)
        spread_at = job.submit_time + self.wait_s
        if bound.now < spread_at:
            bound.wake = min(bound.wake, spread_at)
            return None
        most = span_bound(n_min, self.lam)
        allowed = [p for p in pool if p.num_nodes <= most and self._fast_enough(topo, job, p)]
        return min(allowed, key=key, default=None)

    def _fast_enough(self, topo: Topology, job: Job, p: Placement) -> bool:
        """Whether the model predicts the job at least ``min_rate`` alone at ``p``."""
        if self.min_rate <= 0 or p.num_nodes <= 1:
            return True
        assert self.model is not None
        try:
            return self.model.rates(topo, [(job, p)])[0] >= self.min_rate
        except ValueError:  # a profile the model does not know: not predicted, not spread
            return False

    def memo_key(self, job: Job) -> tuple[int, int]:
        key = _free_key(job)
        if key[1] < 0 or self._bound is None:
            return key
        # a job still waiting for a compact set may fail where one that may spread succeeds
        if self._bound.now < job.submit_time + self.wait_s:
            return (key[0], 1)
        # with ``min_rate`` whether it may spread depends on its profile: never shared
        return (key[0], 2 + job.job_id) if self.min_rate > 0 else key


def _compact(topo: Topology, gpus: int) -> tuple[int, int]:
    """The fewest nodes and leaves that could hold ``gpus`` on an empty cluster."""
    caps = sorted((n.gpus for n in topo.nodes), reverse=True)
    return min_nodes_for(caps, gpus), fewest_leaves(topo, gpus)


def _free_key(job: Job) -> tuple[int, int]:
    """``memo_key`` of the placements that split a job as they see fit: its GPUs, and for a
    fixed request (which they place in its shape) its node count, below zero."""
    return (job.num_gpus, -1 - job.nodes if job.flexible is False else 0)


PLACEMENTS: dict[str, type] = {
    p.name: p
    for p in (
        FirstFit,
        Select,
        BestFit,
        Bounded,
        GroupAware,
        LeastContention,
        LeastLoaded,
        Apart,
        WaitOrSpread,
    )
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
