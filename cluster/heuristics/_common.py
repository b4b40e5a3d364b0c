"""Small helpers shared by the heuristic schedulers."""

from __future__ import annotations

from collections.abc import Sequence

from linkwise.cluster.domain import ClusterState, PendingJob, Placement


def can_ever_run(state: ClusterState, job: PendingJob) -> bool:
    """Whether the job fits the cluster at all (a larger one is ignored, never blocks)."""
    return job.job.num_gpus <= state.topology.total_gpus


def add_jobs(jobs_per_node: list[int], placement: Placement) -> None:
    """Count one more running job on every node of ``placement`` (in place)."""
    for node, _ in placement.alloc:
        jobs_per_node[node] += 1


def min_nodes_for(capacities_desc: Sequence[int], gpus: int) -> int:
    """Fewest nodes of these capacities (sorted descending) that hold ``gpus`` GPUs (>= 1)."""
    need = gpus
    k = 0
    for cap in capacities_desc:
        if need <= 0:
            break
        need -= cap
        k += 1
    return max(k, 1)
