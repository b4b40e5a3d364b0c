"""Preemption: what a composed policy may do to running jobs.

- ``none``: nothing; pending jobs are let in by the admission rule.
- ``priority``: preempt to admit, by priority. Every running and pending job is ranked by
  the order (a running job's score divided by ``margin``: a pending job must beat it by
  that factor to take its place), and admitted greedily while the cluster's GPUs suffice;
  running jobs left out are preempted, admitted pending jobs start in rank order on the
  placement rule. A running job within ``min_run_s`` of its last start is never preempted
  (it is admitted first). With ``refill`` (default) a preemption that would free nothing
  used is undone: a preempted job whose GPUs no start took keeps running, the GPUs still
  free go to the other pending jobs in rank order, and when nothing starts nothing changes
  (the SRTF ceiling's rule; without it, Tiresias' reference round).
- ``migrate``: DeepShare's rule: a running job spread over several nodes whose predicted
  shared/isolated throughput ratio (its progress rate next to the running jobs, by the
  contention model, 1.0 being isolated at its best placement) is at most ``ratio`` moves
  to a consolidated placement (the fewest nodes that can hold it) when one is free, at
  most one move per job per ``min_run_s``; ``mode=preempt`` preempts it instead (it goes
  back to the queue, as DeepShare's code also does). Pending jobs are then let in by the
  admission rule on the GPUs left.

The throughput ratio is predicted from placements and communication profiles, never read
from the simulator's true rates (``docs/INFORMATION.md``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import ClassVar, Protocol

from linkwise.cluster.contention import AnalyticModel, ContentionModel
from linkwise.cluster.domain import (
    ClusterState,
    Decision,
    PendingJob,
    RunningJob,
    Start,
    within_request,
)
from linkwise.cluster.placement.generators import (
    apply_placement,
    best_fit,
    min_nodes_for,
    release_placement,
)
from linkwise.cluster.profiles import load_calibration
from linkwise.policies.parts.admission import Admission, Greedy
from linkwise.policies.parts.orders import Order
from linkwise.policies.parts.placements import (
    PlacementRule,
    add_busy,
    add_flows,
    place_greedy,
)


class Preemption(Protocol):
    """What to do with running jobs, and then which pending jobs start (module docstring)."""

    name: ClassVar[str]
    preemptive: ClassVar[bool]
    migrates: ClassVar[bool]

    def decide(
        self, state: ClusterState, order: Order, rule: PlacementRule, admission: Admission
    ) -> Decision: ...


def _admit(
    state: ClusterState, order: Order, rule: PlacementRule, admission: Admission
) -> Decision:
    ordered = order.pending(state, state.pending)
    by_size = order.name == "gpus"  # by GPU count: the scan may stop at the first too large
    return Decision(starts=admission.admit(state, ordered, rule, by_size=by_size))


@dataclass(frozen=True, slots=True)
class NoPreemption:
    """Never touch a running job."""

    name: ClassVar[str] = "none"
    preemptive: ClassVar[bool] = False
    migrates: ClassVar[bool] = False

    def decide(
        self, state: ClusterState, order: Order, rule: PlacementRule, admission: Admission
    ) -> Decision:
        return _admit(state, order, rule, admission)


def _busy_without(
    state: ClusterState, gone: Sequence[RunningJob], rule: PlacementRule | None = None
) -> list[int]:
    """Running jobs per node without ``gone``, some of the state's running jobs (empty where
    ``rule`` does not read it)."""
    if rule is not None and not rule.uses_busy:
        return []
    busy = list(state.jobs_per_node)
    for r in gone:
        add_busy(busy, r.placement, -1)
    return busy


def _flows_of(
    state: ClusterState, running: Sequence[RunningJob], rule: PlacementRule | None = None
) -> list[int]:
    """Rings per link over ``running`` (empty where ``rule`` does not read it, or the state
    counts none)."""
    if not state.link_flows or (rule is not None and not rule.uses_flows):
        return []
    if len(running) == len(state.running):
        return list(state.link_flows)
    flows = [0] * len(state.topology.links)
    for r in running:
        add_flows(state.topology, flows, r.placement, job=r.job.job_id)
    return flows


@dataclass(frozen=True, slots=True)
class Priority:
    """Preempt to admit by priority (module docstring): ``margin``, ``min_run_s``, ``refill``."""

    name: ClassVar[str] = "priority"
    preemptive: ClassVar[bool] = True
    migrates: ClassVar[bool] = False
    margin: float = 1.0
    min_run_s: float = 0.0
    refill: bool = True

    def __post_init__(self) -> None:
        if not self.margin >= 1.0 or math.isinf(self.margin):
            raise ValueError(f"margin must be a finite number of at least 1, got {self.margin}")
        if not self.min_run_s >= 0.0:
            raise ValueError(f"min_run_s must be non-negative, got {self.min_run_s}")

    def decide(
        self, state: ClusterState, order: Order, rule: PlacementRule, admission: Admission
    ) -> Decision:
        now = state.time
        topo = state.topology
        running = state.running
        if not order.remembers:
            # fast paths (the same decision, cheaper): nothing pending, nothing to do; all
            # of the pending jobs fit the free GPUs, none needs a running job's place
            total = topo.total_gpus
            want = sum(p.job.num_gpus for p in state.pending if p.job.num_gpus <= total)
            if not want:
                return Decision()
            if want <= state.total_free_gpus:
                return _admit(state, order, rule, Greedy())
        # the pinned jobs are admitted first, the others may be preempted
        min_run_s = self.min_run_s
        pinned = [r for r in running if now - r.start_time < min_run_s]
        kept: set[int] = {r.job.job_id for r in pinned}
        left = state.total_free_gpus + sum([r.job.num_gpus for r in running])
        left -= sum([r.job.num_gpus for r in pinned])
        movable = (
            running
            if order.remembers or not pinned
            else [r for r in running if r.job.job_id not in kept]
        )
        # an order with memory sees every running job; the pinned ones are skipped below
        safe, ranked = order.rank_contested(state, movable, state.pending, self.margin)
        for r in safe:
            kept.add(r.job.job_id)
            left -= r.job.num_gpus
        admitted: list[PendingJob] = []
        in_rank: list[PendingJob] = []  # every pending job, in rank order
        for i, item in enumerate(ranked):
            if not left:
                # no GPU left: the rest is neither admitted nor kept
                if self.refill:
                    in_rank += [p for p in ranked[i:] if isinstance(p, PendingJob)]
                break
            gpus = item.job.num_gpus
            if isinstance(item, PendingJob):
                in_rank.append(item)
                if gpus <= left:
                    left -= gpus
                    admitted.append(item)
            elif gpus <= left and item.job.job_id not in kept:
                left -= gpus
                kept.add(item.job.job_id)
        # an order without memory has nothing to settle (it wakes nobody)
        wake = (
            order.settle(state, kept | {p.job.job_id for p in admitted})
            if order.remembers
            else math.inf
        )
        if not admitted:
            # nothing is preempted either (the running jobs all fit without a pending one),
            # and a pending job left out did not fit the free GPUs: nothing changes
            return Decision(wake_at=wake)
        preempted: list[RunningJob] = []
        staying: list[RunningJob] = list(running)
        if len(kept) < len(running):  # ``kept`` holds running jobs only
            preempted = [r for r in running if r.job.job_id not in kept]
            staying = [r for r in running if r.job.job_id in kept]
        free = list(state.free_gpus)
        for r in preempted:
            release_placement(free, r.placement)
        busy = _busy_without(state, preempted, rule)
        first = place_greedy(
            topo, [p.job for p in admitted], rule, free, busy, _flows_of(state, staying, rule)
        )
        if not self.refill:
            return Decision(
                starts=tuple(first),
                preempt=tuple(r.job.job_id for r in preempted),
                wake_at=wake,
            )
        # a preempted job whose GPUs no new start took keeps running
        gone: list[RunningJob] = []
        for r in preempted:
            if all(free[node] >= g for node, g in r.placement.alloc):
                apply_placement(free, r.placement)
                staying.append(r)
            else:
                gone.append(r)
        started = {s.job_id for s in first}
        again = [p for p in in_rank if p.job.job_id not in started]
        if not again or not any(free):
            second: list[Start] = []
        else:
            # the second pass counts busy-ness and flows of the jobs left running, not of
            # the first pass's starts (as the SRTF ceiling always did)
            second = place_greedy(
                topo,
                [p.job for p in again],
                rule,
                free,
                _busy_without(state, gone, rule),
                _flows_of(state, staying, rule),
            )
        starts = tuple(first) + tuple(second)
        if not starts:
            return Decision(wake_at=wake)
        return Decision(starts=starts, preempt=tuple(r.job.job_id for r in gone), wake_at=wake)


MIGRATE_MODES = ("migrate", "preempt")


@dataclass(frozen=True, slots=True)
class Migrate:
    """DeepShare's migration rule (module docstring): ``ratio``, ``min_run_s``, ``mode``."""

    name: ClassVar[str] = "migrate"
    preemptive: ClassVar[bool] = True
    migrates: ClassVar[bool] = True
    ratio: float = 0.6
    min_run_s: float = 0.0
    mode: str = "migrate"
    model: ContentionModel | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        if not 0.0 < self.ratio <= 1.0:
            raise ValueError(f"ratio must be in (0, 1], got {self.ratio}")
        if not self.min_run_s >= 0.0:
            raise ValueError(f"min_run_s must be non-negative, got {self.min_run_s}")
        if self.mode not in MIGRATE_MODES:
            raise ValueError(f"mode must be one of {MIGRATE_MODES}, got {self.mode!r}")
        if self.model is None:
            object.__setattr__(self, "model", AnalyticModel(load_calibration()))

    def moves(self, state: ClusterState) -> list[tuple[RunningJob, Start]]:
        """The split jobs to move, each with its consolidated target on free GPUs."""
        now = state.time
        topo = state.topology
        free = list(state.free_gpus)
        spare = sum(free)
        candidates = [
            r
            for r in state.running
            if r.placement.num_nodes > 1
            and now - r.start_time >= self.min_run_s
            and r.job.num_gpus <= spare
        ]
        if not candidates:
            return []
        assert self.model is not None
        try:
            rates = self.model.rates(topo, [(r.job, r.placement) for r in state.running])
        except ValueError:  # a job without a communication profile the model knows
            return []
        rate_of = {r.job.job_id: rate for r, rate in zip(state.running, rates, strict=True)}
        capacities = sorted((n.gpus for n in topo.nodes), reverse=True)
        out: list[tuple[RunningJob, Start]] = []
        for r in sorted(candidates, key=lambda r: (rate_of[r.job.job_id], r.job.job_id)):
            if rate_of[r.job.job_id] > self.ratio:
                break
            gpus = r.job.num_gpus
            fewest = min_nodes_for(capacities, gpus)
            if r.placement.num_nodes <= fewest or gpus > sum(free):
                continue
            target = best_fit(topo, free, gpus)
            if target is None or target.num_nodes > fewest:
                continue
            if not within_request(r.job, target, topo.max_gpus_per_node):
                continue
            apply_placement(free, target)
            out.append((r, Start(r.job.job_id, target)))
        return out

    def decide(
        self, state: ClusterState, order: Order, rule: PlacementRule, admission: Admission
    ) -> Decision:
        moves = self.moves(state)
        if not moves:
            return _admit(state, order, rule, admission)
        free = list(state.free_gpus)
        running = list(state.running)
        moved = {r.job.job_id for r, _ in moves}
        for _, target in moves:
            apply_placement(free, target.placement)
        if self.mode == "migrate":
            # the moved jobs hold their old GPUs while they drain and run on the targets
            after = running + [replace(r, placement=s.placement) for r, s in moves]
        else:
            after = running  # preempted: they hold their GPUs while they drain
            free = list(state.free_gpus)
        view = replace(
            state,
            free_gpus=tuple(free),
            running=tuple(after),
            link_flows=tuple(_flows_of(state, after)),
        )
        rest = _admit(view, order, rule, admission)
        if self.mode == "migrate":
            return Decision(starts=rest.starts, migrate=tuple(s for _, s in moves))
        return Decision(starts=rest.starts, preempt=tuple(sorted(moved)))


PREEMPTIONS: dict[str, type] = {p.name: p for p in (NoPreemption, Priority, Migrate)}
