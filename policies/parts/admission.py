"""Admission: how a non-preemptive composed policy lets pending jobs in, in its order.

- ``greedy``: every job that can be placed now starts; one that cannot waits and the scan
  goes on (a large job can wait long behind a stream of small ones);
- ``strict``: the scan stops at the first job that cannot be placed (strict FIFO);
- ``easy``: EASY backfill as Slurm's sched/backfill runs it: the fitting prefix starts, then
  every later job starts only where it delays no reservation of an earlier one, by the time
  limits (the planner: ``parts.backfill``; it places with Slurm's select on requested
  shapes, so it takes ``placement=select`` only).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import ClassVar, Protocol

from linkwise.cluster.domain import ClusterState, Decision, PendingJob, Start
from linkwise.policies.parts.backfill import DEFAULT_LIMIT_S, plan_backfill
from linkwise.policies.parts.placements import PlacementRule, Select, place_greedy


class Admission(Protocol):
    """Pending jobs in priority order -> the starts (see the module docstring)."""

    name: ClassVar[str]

    def admit(
        self,
        state: ClusterState,
        ordered: Sequence[PendingJob],
        rule: PlacementRule,
        *,
        by_size: bool = False,
    ) -> tuple[Start, ...]: ...


@dataclass(frozen=True, slots=True)
class Greedy:
    """Start every job that can be placed now, in order."""

    name: ClassVar[str] = "greedy"

    def admit(
        self,
        state: ClusterState,
        ordered: Sequence[PendingJob],
        rule: PlacementRule,
        *,
        by_size: bool = False,
    ) -> tuple[Start, ...]:
        starts = place_greedy(
            state.topology,
            [p.job for p in ordered],
            rule,
            list(state.free_gpus),
            list(state.jobs_per_node),
            list(state.link_flows),
            by_size=by_size,
        )
        return tuple(starts)


@dataclass(frozen=True, slots=True)
class Strict:
    """Start the longest prefix of the order that can be placed now (strict FIFO)."""

    name: ClassVar[str] = "strict"

    def admit(
        self,
        state: ClusterState,
        ordered: Sequence[PendingJob],
        rule: PlacementRule,
        *,
        by_size: bool = False,
    ) -> tuple[Start, ...]:
        starts = place_greedy(
            state.topology,
            [p.job for p in ordered],
            rule,
            list(state.free_gpus),
            list(state.jobs_per_node),
            list(state.link_flows),
            strict=True,
        )
        return tuple(starts)


@dataclass(frozen=True, slots=True)
class Easy:
    """EASY backfill's reservations (Slurm's sched/backfill; parameters as ``backfill``'s)."""

    name: ClassVar[str] = "easy"
    max_job_test: int = 100
    default_limit_s: float = DEFAULT_LIMIT_S
    window_s: float = DEFAULT_LIMIT_S
    resolution_s: float = 60.0

    def admit(
        self,
        state: ClusterState,
        ordered: Sequence[PendingJob],
        rule: PlacementRule,
        *,
        by_size: bool = False,
    ) -> tuple[Start, ...]:
        if not isinstance(rule, Select):
            raise ValueError("admission=easy places with Slurm's select: use placement=select")
        queue = tuple(ordered)
        view = state if queue == state.pending else replace(state, pending=queue)
        return plan_backfill(
            view,
            max_job_test=self.max_job_test,
            default_limit_s=self.default_limit_s,
            window_s=self.window_s,
            resolution_s=self.resolution_s,
            switches=rule if rule.switches else None,
        )


ADMISSIONS: dict[str, type] = {a.name: a for a in (Greedy, Strict, Easy)}


def admit_decision(starts: tuple[Start, ...], wake_at: float = float("inf")) -> Decision:
    """A decision that only starts jobs."""
    return Decision(starts=starts, wake_at=wake_at)
