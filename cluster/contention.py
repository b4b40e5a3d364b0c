"""Contention models: how fast each job progresses given everything placed beside it.

A job's *rate* is its isolated per-iteration time at its best placement divided by its
per-iteration time where it runs now, next to the others: 1.0 means "as fast as alone
and consolidated", 0.5 means "takes twice as long". Rates never exceed 1.

Two models share one interface (``ContentionModel``):

- ``AnalyticModel``: SJF-BCO's ring all-reduce model (MobiHoc'22) generalised to the
  topology. A ring over one node runs at the node's intra-node bandwidth; a ring split
  across nodes is bottlenecked by the slowest network link it crosses (NICs, leaf and
  aggregation uplinks; never faster than its nodes' intra-node links), each link shared
  among the k rings crossing it with the penalty f(k) = k + alpha (k - 1). Only split
  jobs use the network, so only they contend.
  With ``sharing="duty"`` (the default) a neighbouring ring counts on a link by its
  duty cycle (the share of its isolated iteration spent communicating) rather than
  as a whole ring: k = 1 + sum of the neighbours' duty cycles. ``sharing="flows"`` is
  SJF-BCO's original count. Fitted on DeepShare's measured pairs, the flow count
  predicts worse than a constant; the duty-cycle count does not (see
  ``benchmarks/contention_validation.md``).
- ``EmpiricalModel``: DeepShare's measured pairwise shared/isolated throughput ratios
  applied directly to split jobs sharing a node (product over neighbours).
- ``NoContention``: every rate is 1 (pure queueing, ``--contention none``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

from linkwise.cluster.domain import Job, Placement, Topology
from linkwise.cluster.layout import LayoutComm, has_layout, layout_comm
from linkwise.cluster.profiles import Calibration, CommProfile

SHARING_MODES = ("duty", "flows")
SETS_KEPT = 16
"""How many running sets' derived tables ``AnalyticModel.remembered`` keeps (the newest)."""

T = TypeVar("T")
P = TypeVar("P")


def sharing_penalty(k: float, alpha: float) -> float:
    """SJF-BCO's f(k) = k + alpha (k - 1): effective divisor of a link shared by k rings.

    ``k`` may be fractional (rings weighted by their duty cycles); f(k) = 1 for k <= 1.
    """
    return k + alpha * (k - 1) if k > 1 else 1.0


def ring_comm_time(profile: CommProfile, gpus: int, bandwidth_gbps: float, lanes: int = 1) -> float:
    """Time of one ring all-reduce of the profile's gradient over ``gpus`` workers, split
    over ``lanes`` parallel rings (one per rail of a rail fabric) of ``bandwidth_gbps`` each."""
    if gpus <= 1:
        return 0.0
    volume = (profile.grad_gb / gpus) * 2.0 * (gpus - 1)
    return (volume / lanes if lanes > 1 else volume) / bandwidth_gbps


def ring_iteration_time(
    profile: CommProfile,
    gpus: int,
    nodes: int,
    bandwidth_gbps: float,
    overhead_s: float,
    lanes: int = 1,
) -> float:
    """Per-iteration time of a ring all-reduce job (SJF-BCO's tau_j).

    ``bandwidth_gbps`` is the ring's bottleneck: intra-node bandwidth on one node, the
    (shared) network bottleneck otherwise; per lane where the ring runs as ``lanes`` parallel
    rings, one per rail (``Topology.job_rails``). The reduction term is folded into compute.
    """
    if gpus <= 1:
        return profile.compute_s
    overhead = overhead_s * nodes if nodes > 1 else 0.0
    return profile.compute_s + ring_comm_time(profile, gpus, bandwidth_gbps, lanes) + overhead


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
    """SJF-BCO's ring model on the real topology, with calibrated profiles.

    ``sharing`` says how rings on a link are counted: ``"duty"`` (default) weights each
    neighbouring ring by its isolated duty cycle, ``"flows"`` counts whole rings
    (SJF-BCO). The calibration's ``alpha`` is fitted for one of them (its
    ``fit["sharing"]``); ``fit["alpha_flows"]`` holds the fit for the other.
    """

    calibration: Calibration
    name: str = "analytic"
    sharing: str = "duty"
    # memo tables keyed by id(topology); each entry keeps its topology alive, so an id is
    # never reused while its entries exist
    _best: dict[tuple[str, int, int, int], tuple[Topology, float]] = field(
        default_factory=dict, compare=False, repr=False
    )
    _duty: dict[tuple[str, int, Placement, int, int], tuple[Topology, float]] = field(
        default_factory=dict, compare=False, repr=False
    )
    _rings: dict[tuple[str, int, Placement, int, int], tuple[Topology, _SplitRing]] = field(
        default_factory=dict, compare=False, repr=False
    )
    # layout jobs' transfers (``cluster.layout``), keyed as ``_rings`` with the stages
    _layouts: dict[tuple[str, int, int, Placement, int, int], tuple[Topology, LayoutComm]] = field(
        default_factory=dict, compare=False, repr=False
    )
    # what callers derive from the model for one set of placed rings (``remembered``), keyed
    # by (id(topology), the caller's key), the newest SETS_KEPT of them
    _sets: dict[tuple[int, Any], tuple[Topology, Any]] = field(
        default_factory=dict, compare=False, repr=False
    )

    def __post_init__(self) -> None:
        if self.sharing not in SHARING_MODES:
            raise ValueError(
                f"unknown sharing {self.sharing!r} (known: {', '.join(SHARING_MODES)})"
            )

    def __getstate__(self) -> dict[str, Any]:
        """Pickled and deep-copied without ``remembered``'s tables (a cache, rebuilt)."""
        return {**self.__dict__, "_sets": {}}

    def profile(self, job: Job) -> CommProfile:
        try:
            return self.calibration.profiles[job.profile]
        except KeyError:
            known = ", ".join(sorted(self.calibration.profiles))
            raise ValueError(
                f"job {job.job_id}: unknown profile {job.profile!r} (known: {known})"
            ) from None

    def best_time(self, topo: Topology, job: Job) -> float:
        key = (job.profile, job.num_gpus, id(topo), job.pp)
        cached = self._best.get(key)
        if cached is not None:
            return cached[1]
        prof = self.profile(job)
        n = min_nodes(topo, job.num_gpus)
        if job.pp > 1 and n > 1:  # its stages over the fewest nodes, at the fastest links
            cap, gpus = topo.max_gpus_per_node, job.num_gpus
            ideal = Placement.of([(i, min(cap, gpus - i * cap)) for i in range(n)])
            comm = layout_comm(topo, job, ideal, prof, self.calibration.overhead_s, ideal=True)
            best = comm.alone(topo.link_gbps)
            self._best[key] = (topo, best)
            return best
        intra = max(node.intra_gbps for node in topo.nodes)
        # on a rail fabric a consolidated split ring uses a rail per GPU of a node
        lanes = min(topo.rails, job.num_gpus // n) if topo.rails and n > 1 else 1
        nic = max(node.nic_gbps for node in topo.nodes)
        bw = intra if n == 1 else min(_per_lane(intra, lanes), nic)
        best = ring_iteration_time(prof, job.num_gpus, n, bw, self.calibration.overhead_s, lanes)
        self._best[key] = (topo, best)
        return best

    def remembered(self, topo: Topology, kind: str, key: Any, build: Callable[[T | None], T]) -> T:
        """``build(newest)``, remembered by (topology, ``kind``, ``key``) for the newest
        ``SETS_KEPT`` entries, ``newest`` being the newest value of this topology and kind (or
        None): for tables that are a pure function of the model, the topology and ``key``
        (the contention predictions of one set of running rings, ``cluster.mdp.slowdown``),
        built from the last ones where they share parts."""
        k = (id(topo), (kind, key))
        sets = self._sets
        hit = sets.pop(k, None)
        if hit is None:
            newest: T | None = None
            for (tid, (other, _)), (_, kept) in reversed(sets.items()):
                if tid == id(topo) and other == kind:
                    newest = kept
                    break
            hit = (topo, build(newest))
            if len(sets) >= SETS_KEPT:
                del sets[next(iter(sets))]
        sets[k] = hit  # the newest last
        value: T = hit[1]
        return value

    def _bandwidth_alone(self, topo: Topology, placement: Placement, job: int = 0) -> float:
        """The ring's bottleneck bandwidth with nobody else on the network, per lane (``job``:
        its id, which picks its uplinks under ECMP and its rails on a rail fabric)."""
        nodes = placement.nodes
        if len(nodes) == 1:
            return _intra_cap(topo, placement)
        bw = _per_lane(_intra_cap(topo, placement), _lanes(topo, placement, job))
        gbps = topo.link_gbps
        return min(bw, min(gbps[link] for link in _ring_links(topo, placement, job)))

    def duty_cycle(self, topo: Topology, job: Job, placement: Placement) -> float:
        """Share of the job's isolated iteration at this placement spent in the ring all-reduce
        (a layout job's: in its transfers, ``cluster.layout``)."""
        if has_layout(job, placement):
            comm = self._layout(topo, job, placement)
            total = comm.alone(topo.link_gbps)
            return (total - comm.compute - comm.overhead) / total if total > 0 else 0.0
        key = (job.profile, job.num_gpus, placement, id(topo), _path_key(topo, job))
        cached = self._duty.get(key)
        if cached is not None:
            return cached[1]
        prof = self.profile(job)
        bw = self._bandwidth_alone(topo, placement, job.job_id)
        overhead = self.calibration.overhead_s
        lanes = _lanes(topo, placement, job.job_id) if placement.num_nodes > 1 else 1
        total = ring_iteration_time(prof, job.num_gpus, placement.num_nodes, bw, overhead, lanes)
        duty = ring_comm_time(prof, job.num_gpus, bw, lanes) / total if total > 0 else 0.0
        self._duty[key] = (topo, duty)
        return duty

    def _split_ring(self, topo: Topology, job: Job, placement: Placement) -> _SplitRing:
        """A split ring's links, weight and iteration-time terms, remembered."""
        key = (job.profile, job.num_gpus, placement, id(topo), _path_key(topo, job))
        hit = self._rings.get(key)
        if hit is None:
            prof = self.profile(job)
            weight = 1.0 if self.sharing == "flows" else self.duty_cycle(topo, job, placement)
            lanes = _lanes(topo, placement, job.job_id)
            comm = (prof.grad_gb / job.num_gpus) * 2.0 * (job.num_gpus - 1)
            hit = self._rings[key] = (
                topo,
                _SplitRing(
                    links=_ring_links(topo, placement, job.job_id),
                    weight=weight,
                    intra=_per_lane(_intra_cap(topo, placement), lanes),
                    compute=prof.compute_s,
                    comm=comm / lanes if lanes > 1 else comm,
                    overhead=self.calibration.overhead_s * placement.num_nodes,
                ),
            )
        return hit[1]

    def _layout(self, topo: Topology, job: Job, placement: Placement) -> LayoutComm:
        """A layout job's transfers and weight on its links (``cluster.layout``), remembered."""
        key = (job.profile, job.num_gpus, job.pp, placement, id(topo), _path_key(topo, job))
        hit = self._layouts.get(key)
        if hit is None:
            prof = self.profile(job)
            comm = layout_comm(topo, job, placement, prof, self.calibration.overhead_s)
            if self.sharing == "flows":
                weight = 1.0
            else:
                total = comm.alone(topo.link_gbps)
                weight = (total - comm.compute - comm.overhead) / total if total > 0 else 0.0
            hit = self._layouts[key] = (topo, comm.with_weight(weight))
        return hit[1]

    def _comm(self, topo: Topology, job: Job, placement: Placement) -> _SplitRing | LayoutComm:
        """A split job's ring, or its layout's transfers."""
        if has_layout(job, placement):
            return self._layout(topo, job, placement)
        return self._split_ring(topo, job, placement)

    def iteration_times(
        self, topo: Topology, placed: Sequence[tuple[Job, Placement]]
    ) -> list[float]:
        """Per-iteration time of each placed job next to all the others (the same operations
        as ``_iteration_times_reference``, a split ring's fixed parts remembered, and its time
        where the loads on its links are those it was last timed at)."""
        rings = [
            self._comm(topo, j, p) if len(p.alloc) > 1 and j.num_gpus > 1 else None
            for j, p in placed
        ]
        load = [0.0] * len(topo.links)
        for ring in rings:
            if ring is not None:
                w = ring.weight
                for link in ring.links:
                    load[link] += w
        alpha = self.calibration.alpha
        gbps = topo.link_gbps
        out: list[float] = []
        for (job, placement), ring in zip(placed, rings, strict=True):
            if ring is None:
                out.append(self._iteration_times_reference(topo, [(job, placement)])[0])
                continue
            loads = tuple([load[link] for link in ring.links])
            last = ring.last
            if last[0] == loads:  # the same loads on its links as last time: the same time
                out.append(last[1])
                continue
            t = ring.time(load, gbps, alpha)
            last[0], last[1] = loads, t
            out.append(t)
        return out

    def _iteration_times_reference(
        self, topo: Topology, placed: Sequence[tuple[Job, Placement]]
    ) -> list[float]:
        """``iteration_times`` as first written: the reference it is tested against (and the
        rule for a job alone on one node, which no other ring slows)."""
        if self.sharing == "flows":
            weights = [1.0 if p.num_nodes > 1 else 0.0 for _, p in placed]
        else:
            weights = [self.duty_cycle(topo, j, p) if p.num_nodes > 1 else 0.0 for j, p in placed]
        load = [0.0] * len(topo.links)
        for (job, placement), w in zip(placed, weights, strict=True):
            if has_layout(job, placement):
                links = self._layout(topo, job, placement).links
            else:
                links = _ring_links(topo, placement, job.job_id) if placement.num_nodes > 1 else ()
            for link in links:
                load[link] += w
        alpha = self.calibration.alpha
        gbps = topo.link_gbps
        out: list[float] = []
        for (job, placement), own in zip(placed, weights, strict=True):
            if has_layout(job, placement):
                out.append(self._layout(topo, job, placement).time(load, gbps, alpha))
                continue
            prof = self.profile(job)
            nodes = placement.nodes
            bw = _intra_cap(topo, placement)
            lanes = 1
            if len(nodes) > 1:
                lanes = _lanes(topo, placement, job.job_id)
                bw = _per_lane(bw, lanes)
                for link in _ring_links(topo, placement, job.job_id):
                    k = 1.0 + max(0.0, load[link] - own)  # this ring plus the others on the link
                    bw = min(bw, gbps[link] / sharing_penalty(k, alpha))
            out.append(
                ring_iteration_time(
                    prof, job.num_gpus, len(nodes), bw, self.calibration.overhead_s, lanes
                )
            )
        return out

    def rates(self, topo: Topology, placed: Sequence[tuple[Job, Placement]]) -> list[float]:
        times = self.iteration_times(topo, placed)
        return [
            min(1.0, self.best_time(topo, job) / t)
            for (job, _), t in zip(placed, times, strict=True)
        ]


@dataclass(frozen=True, slots=True)
class _SplitRing:
    """What a split ring's job and placement fix: its links, weight on them, intra-node bound
    and ``ring_iteration_time``'s terms (``compute + comm / bw + overhead``, the same
    operations in the same order)."""

    links: tuple[int, ...]
    weight: float
    intra: float  # per lane on a rail fabric (``_per_lane``)
    compute: float
    # ring_comm_time's numerator: (grad_gb / gpus) * 2.0 * (gpus - 1), over its lanes
    comm: float
    overhead: float
    # the loads on its links when last timed and the time then (``iteration_times``: the
    # time is a function of these loads and the fields above alone)
    last: list[Any] = field(default_factory=lambda: [None, 0.0], compare=False, repr=False)

    def time(self, load: Sequence[float], gbps: Sequence[float], alpha: float) -> float:
        """Per-iteration time with ``load[link]`` on each of its links (every ring's weight
        on it, its own included): a function of those loads and the fields above alone."""
        own = self.weight
        bw = self.intra
        for link in self.links:
            k = 1.0 + max(0.0, load[link] - own)  # this ring plus the others on the link
            bw = min(bw, gbps[link] / (k + alpha * (k - 1) if k > 1 else 1.0))
        return self.time_at(bw)

    def share(self, link: int, lv: float, gbps: Sequence[float], alpha: float) -> float:
        """Its bandwidth on ``link`` under load ``lv``: the term ``time`` takes the min of
        (the same operations), so ``time`` is ``time_at(min(intra, shares))``."""
        k = 1.0 + max(0.0, lv - self.weight)
        return gbps[link] / (k + alpha * (k - 1) if k > 1 else 1.0)

    def time_at(self, bw: float) -> float:
        """Per-iteration time at bottleneck bandwidth ``bw``."""
        return self.compute + self.comm / bw + self.overhead


def _path_key(topo: Topology, job: Job) -> int:
    """What of the job its ring's links depend on besides the placement: its id under ECMP
    (the hash of its flows) and on a rail fabric (its rails), nothing (-1) otherwise."""
    return job.job_id if topo.ecmp_spines or topo.rails else -1


def _ring_links(topo: Topology, placement: Placement, job: int) -> tuple[int, ...]:
    """The links of the job's ring at this placement (``Topology.ring_links``; on a rail
    fabric its rails follow from its fewest GPUs on one node)."""
    gpus = min([g for _, g in placement.alloc]) if topo.rails and placement.alloc else 0
    return topo.ring_links(placement.nodes, job, gpus)


def _lanes(topo: Topology, placement: Placement, job: int) -> int:
    """How many parallel rings (rails) a split job's all-reduce runs as: 1 off rail fabrics."""
    if not topo.rails or not placement.alloc:
        return 1
    return len(topo.job_rails(job, min([g for _, g in placement.alloc])))


def _per_lane(intra: float, lanes: int) -> float:
    """The intra-node bound per lane: the node's bandwidth shared by its ``lanes`` rings."""
    return intra / lanes if lanes > 1 else intra


def _intra_cap(topo: Topology, placement: Placement) -> float:
    """The slowest intra-node link of the placement's nodes: no ring runs faster.

    On one node the ring runs over it; across nodes every GPU's traffic to the NIC crosses it
    (PCIe on PCIe nodes), so a split ring is never faster than a consolidated one.
    """
    return min(topo.nodes[n].intra_gbps for n in placement.nodes)


def link_flows(
    topo: Topology, placements: Iterable[Placement], jobs: Iterable[int] | None = None
) -> list[int]:
    """Number of split rings crossing each link of the topology (``jobs``: the id of each
    placement's job, which picks its uplinks under ECMP; without them, id 0's)."""
    flows = [0] * len(topo.links)
    ids = iter(jobs) if jobs is not None else None
    for placement in placements:
        job = next(ids) if ids is not None else 0
        if placement.num_nodes > 1:
            for link in _ring_links(topo, placement, job):
                flows[link] += 1
    return flows


def incremental_rates(model: ContentionModel) -> bool:
    """Whether ``SplitRates`` gives ``model.rates``: an ``AnalyticModel`` whose rules are
    its class's own (a subclass overriding one of them does not qualify)."""
    return isinstance(model, AnalyticModel) and all(
        getattr(type(model), name) is getattr(AnalyticModel, name)
        for name in (
            "rates",
            "iteration_times",
            "best_time",
            "_split_ring",
            "duty_cycle",
            "_layout",
            "_comm",
        )
    )


@dataclass(slots=True)
class _Member(Generic[P]):
    payload: P
    links: tuple[int, ...]  # the links it is counted on in ``link_flows``
    # None: a split job without a ring (one GPU): a fixed rate; a layout job's transfers are
    # retimed whenever a link of theirs changes (no bottleneck bookkeeping)
    ring: _SplitRing | LayoutComm | None
    best: float  # ``best_time``, or the fixed rate
    # its bottleneck min(intra, its ``_SplitRing.share`` on each link) at the loads now, and
    # per link that share or (where the link got lighter since) a lower bound of it that is
    # above ``bw`` (set when it is timed)
    shares: dict[int, float] = field(default_factory=dict)
    bw: float = math.inf


class SplitRates(Generic[P]):
    """An ``AnalyticModel``'s rates of a changing set of split jobs, kept up to date.

    Members are ordered by when they were added; ``changed()`` gives, bit for bit, what
    ``model.rates(topo, members in that order)`` gives, for the members whose rate may differ
    from the last ``changed()``: those added since, and those on a link whose load differs,
    except where the bottleneck cannot have moved.
    A link's load is the fold of its members' weights from 0.0 in member order, as
    ``iteration_times`` sums it: an addition (the newest member) adds its weight, a removal
    re-folds the link. A ring's time is ``time_at(min(intra, its shares))``, a share being a
    function of one link's load: where a changed link's share was above the ring's
    bottleneck and still is not below it, the bottleneck is the same float (a link that got
    lighter: its share did not fall, when alpha >= 0).
    """

    def __init__(self, model: AnalyticModel, topo: Topology) -> None:
        self._model = model
        self._topo = topo
        n = len(topo.links)
        self._users: list[dict[int, float]] = [{} for _ in range(n)]  # member -> weight, in order
        self._load = [0.0] * n
        self._flows = [0] * n
        self._members: dict[int, _Member[P]] = {}
        self._next = 0
        self._new: set[int] = set()
        self._before: dict[int, float] = {}  # touched link -> its load at the last changed()
        self._refold: set[int] = set()  # links a member left since

    def __len__(self) -> int:
        return len(self._members)

    def add(self, payload: P, job: Job, placement: Placement) -> int | None:
        """Add a split job as the newest member; its id, or None (and nothing added) for a
        placement over a node twice, which this bookkeeping does not cover."""
        topo, model = self._topo, self._model
        links = _ring_links(topo, placement, job.job_id)
        if len(set(links)) != len(links):
            return None
        if len(placement.alloc) > 1 and job.num_gpus > 1:
            ring: _SplitRing | LayoutComm | None = model._comm(topo, job, placement)
            best = model.best_time(topo, job)
        else:
            ring, best = None, model.rates(topo, [(job, placement)])[0]
        mid = self._next
        self._next += 1
        self._members[mid] = _Member(payload, links, ring, best)
        self._new.add(mid)
        flows = self._flows
        for link in links:
            flows[link] += 1
        if ring is not None:
            w = ring.weight
            users, load, before, refold = self._users, self._load, self._before, self._refold
            for link in ring.links:
                users[link][mid] = w
                if link not in before:
                    before[link] = load[link]
                if link not in refold:
                    load[link] += w
        return mid

    def remove(self, mid: int) -> None:
        """Remove a member."""
        m = self._members.pop(mid)
        self._new.discard(mid)
        flows = self._flows
        for link in m.links:
            flows[link] -= 1
        if m.ring is not None:
            users, load, before = self._users, self._load, self._before
            for link in m.ring.links:
                del users[link][mid]
                if link not in before:
                    before[link] = load[link]
                self._refold.add(link)

    def changed(self) -> list[tuple[P, float]]:
        """(payload, rate) of the members added since the last call and of those whose
        bottleneck may have moved, in member order; the others' rates are what they were."""
        load, users = self._load, self._users
        for link in self._refold:
            total = 0.0
            for w in users[link].values():
                total += w
            load[link] = total
        gbps = self._topo.link_gbps
        alpha = self._model.calibration.alpha
        members = self._members
        # a share never rises with its link's load where alpha >= 0 (each operation rounds
        # monotonically): a lighter link's share is above what is kept, which stays a bound
        lighter_is_wider = alpha >= 0
        todo = self._new
        for link, old in self._before.items():
            lv = load[link]
            if lv == old:
                continue
            lighter = lighter_is_wider and lv < old
            for mid in users[link]:
                if mid in todo:
                    continue
                m = members[mid]
                if isinstance(m.ring, LayoutComm) or m.shares[link] <= m.bw:  # may bottleneck
                    todo.add(mid)
                elif not lighter:
                    split = m.ring
                    assert isinstance(split, _SplitRing)
                    share = split.share(link, lv, gbps, alpha)
                    if share < m.bw:
                        todo.add(mid)
                    else:
                        m.shares[link] = share
        self._refold = set()
        self._before = {}
        self._new = set()
        out: list[tuple[P, float]] = []
        for mid in sorted(todo):
            m = members[mid]
            ring = m.ring
            if ring is None:
                out.append((m.payload, m.best))
                continue
            if isinstance(ring, LayoutComm):
                out.append((m.payload, min(1.0, m.best / ring.time(load, gbps, alpha))))
                continue
            shares = {link: ring.share(link, load[link], gbps, alpha) for link in ring.links}
            m.shares = shares
            m.bw = bw = min([ring.intra, *shares.values()])
            out.append((m.payload, min(1.0, m.best / ring.time_at(bw))))
        return out

    @property
    def flows(self) -> tuple[int, ...]:
        """``link_flows`` of the members."""
        return tuple(self._flows)


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


@dataclass(frozen=True)
class NoContention:
    """Pure queueing: every job runs at its isolated speed wherever it is placed."""

    name: str = "none"

    def best_time(self, topo: Topology, job: Job) -> float:
        return 1.0

    def rates(self, topo: Topology, placed: Sequence[tuple[Job, Placement]]) -> list[float]:
        return [1.0] * len(placed)
