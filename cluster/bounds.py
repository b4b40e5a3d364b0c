"""Proven lower bounds on the total (and so the average) JCT of a workload on a cluster.

- ``isolated_total``: every job runs alone at its best placement as soon as it arrives
  (no queueing, no contention): ``sum_j p_j``.
- ``pooled_srpt_total``: the cluster's GPUs pooled into one machine of speed ``C`` GPUs,
  each job a piece of work of ``g_j * p_j`` GPU-seconds released at its submit time,
  scheduled by preemptive shortest-remaining-processing-time, which is optimal for the sum
  of completion times on one machine with release dates. Any schedule the cluster can run
  maps to a schedule of that machine whose completion times are no later, so its total JCT
  is at least SRPT's. It counts queueing: under load the GPUs, not the jobs, are scarce.

``queue_bound`` is the larger of the two, per workload. The argument is written out in
``docs/LOWER_BOUNDS.md``; ``tests/cluster/test_bounds.py`` checks it against brute force.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence

from linkwise.cluster.domain import Job

__all__ = ["isolated_total", "pooled_srpt_total", "queue_bound"]


def isolated_total(jobs: Sequence[Job]) -> float:
    """``sum_j p_j``, the total JCT with neither queueing nor contention (seconds)."""
    return float(sum(j.duration for j in jobs))


def pooled_srpt_total(jobs: Sequence[Job], capacity_gpus: int) -> float:
    """The total JCT of preemptive SRPT on the pooled machine (seconds): a lower bound of
    every schedule's total JCT on a cluster with ``capacity_gpus`` GPUs."""
    if capacity_gpus <= 0:
        raise ValueError("capacity_gpus must be positive")
    if any(j.num_gpus > capacity_gpus for j in jobs):
        raise ValueError("a job asks for more GPUs than the cluster has")
    order = sorted(jobs, key=lambda j: (j.submit_time, j.job_id))
    # (remaining machine time, submit time, job id); machine time = GPU-seconds / capacity
    ready: list[tuple[float, float, int]] = []
    total, now, i = 0.0, 0.0, 0
    while i < len(order) or ready:
        if not ready:
            now = max(now, order[i].submit_time)
        while i < len(order) and order[i].submit_time <= now:
            j = order[i]
            heapq.heappush(
                ready, (j.num_gpus * j.duration / capacity_gpus, j.submit_time, j.job_id)
            )
            i += 1
        rem, submit, job_id = heapq.heappop(ready)
        next_release = order[i].submit_time if i < len(order) else float("inf")
        if now + rem <= next_release:
            now += rem
            total += now - submit
        else:  # run until the next release, then choose again
            heapq.heappush(ready, (rem - (next_release - now), submit, job_id))
            now = next_release
    return total


def queue_bound(jobs: Sequence[Job], capacity_gpus: int) -> float:
    """The larger of the two lower bounds of the total JCT (seconds)."""
    return max(isolated_total(jobs), pooled_srpt_total(jobs, capacity_gpus))
