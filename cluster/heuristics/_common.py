"""Small helpers shared by the heuristic schedulers (the parts themselves live in
``cluster.compose``; these names stay for the modules that import them from here)."""

from __future__ import annotations

from collections.abc import Iterable

from linkwise.cluster.compose.orders import MissingPredictions
from linkwise.cluster.compose.placements import (
    Bounded,
    add_busy,
    bounded_placement,
    check_bco_params,
    min_nodes_for,
    place_greedy,
)
from linkwise.cluster.domain import ClusterState, Decision, PendingJob, Placement

__all__ = [
    "MissingPredictions",
    "add_jobs",
    "bounded_placement",
    "can_ever_run",
    "check_bco_params",
    "min_nodes_for",
    "start_bounded",
]


def can_ever_run(state: ClusterState, job: PendingJob) -> bool:
    """Whether the job fits the cluster at all (a larger one is ignored, never blocks)."""
    return job.job.num_gpus <= state.topology.total_gpus


def add_jobs(jobs_per_node: list[int], placement: Placement) -> None:
    """Count one more running job on every node of ``placement`` (in place)."""
    add_busy(jobs_per_node, placement)


def start_bounded(
    state: ClusterState,
    order: Iterable[PendingJob],
    kappa: int | None = None,
    lam: float = 1.0,
    *,
    by_size: bool = False,
) -> Decision:
    """SJF-BCO's placement step over pending jobs in a given order: every job that fits is
    started, in that order, where ``bounded_placement`` puts it (``compose.placements``:
    ``place_greedy`` with the ``bounded`` placement)."""
    starts = place_greedy(
        state.topology,
        [p.job for p in order],
        Bounded(kappa, lam),
        list(state.free_gpus),
        list(state.jobs_per_node),
        list(state.link_flows),
        by_size=by_size,
    )
    return Decision(starts=tuple(starts))
