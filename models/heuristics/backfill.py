"""EASY backfill, like Slurm's sched/backfill with select/cons_tres (first-fit placement)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from linkwise.cluster.domain import ClusterState, Decision, PendingJob, Start
from linkwise.cluster.placement import apply_placement, first_fit
from linkwise.models.heuristics._common import can_ever_run


def shadow(
    state: ClusterState, started: list[PendingJob], free_now: int, need: int
) -> tuple[float, int]:
    """When ``need`` GPUs will be free, and how many more than ``need`` are free then.

    Releases come from the running jobs (at ``expected_end``) and from the jobs
    ``started`` in this decision (at ``state.time + remaining_s``, their own estimate).
    First-fit placement fits any job once enough GPUs are free in total, so counting
    GPUs is exact. Returns ``(inf, 0)`` if the releases never free enough.
    """
    releases = [(r.expected_end, r.job.num_gpus) for r in state.running]
    releases.extend((state.time + p.remaining_s, p.job.num_gpus) for p in started)
    releases.sort()
    avail = free_now
    shadow_time = math.inf
    for end, gpus in releases:
        if end > shadow_time:
            break
        avail += gpus
        if shadow_time == math.inf and avail >= need:
            shadow_time = end  # keep adding the releases due at the same instant
    if shadow_time == math.inf:
        return math.inf, 0
    return shadow_time, avail - need


@dataclass(frozen=True, slots=True)
class Backfill:
    """EASY backfill: FIFO with first fit; behind a blocked head, start jobs that cannot delay it.

    The first job that does not fit gets a reservation at the shadow time, the earliest
    time enough GPUs are released under the running jobs' expected ends. A later job
    (at most ``max_job_test`` of them are examined, like Slurm's ``bf_max_job_test``) is
    started when it fits now and, under its own run-time estimate (``remaining_s``),
    either ends by the shadow time or fits in the GPUs left spare at the shadow time.
    Jobs larger than the whole cluster are ignored.
    """

    name: str = "backfill"
    max_job_test: int = 100

    def decide(self, state: ClusterState) -> Decision:
        """Start the fitting queue prefix, then backfill behind the first blocked job."""
        topo = state.topology
        free = list(state.free_gpus)
        total = sum(free)
        starts: list[Start] = []
        started: list[PendingJob] = []
        pending = state.pending
        head: PendingJob | None = None
        i = 0
        while i < len(pending):
            p = pending[i]
            i += 1
            if not can_ever_run(state, p):
                continue
            gpus = p.job.num_gpus
            placement = first_fit(topo, free, gpus) if gpus <= total else None
            if placement is None:
                head = p
                break
            apply_placement(free, placement)
            total -= gpus
            starts.append(Start(p.job.job_id, placement))
            started.append(p)
        if head is None or total == 0:
            return Decision(starts=tuple(starts))

        shadow_time, spare = shadow(state, started, total, head.job.num_gpus)
        tested = 0
        while i < len(pending) and tested < self.max_job_test and total > 0:
            p = pending[i]
            i += 1
            if not can_ever_run(state, p):
                continue
            tested += 1
            gpus = p.job.num_gpus
            if gpus > total:
                continue
            ends_in_time = state.time + p.remaining_s <= shadow_time
            if not ends_in_time and gpus > spare:
                continue
            placement = first_fit(topo, free, gpus)
            if placement is None:  # pragma: no cover - first fit fails only on the total
                continue
            apply_placement(free, placement)
            total -= gpus
            if not ends_in_time:
                spare -= gpus
            starts.append(Start(p.job.job_id, placement))
        return Decision(starts=tuple(starts))
