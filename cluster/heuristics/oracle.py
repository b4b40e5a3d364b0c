"""Oracle ceilings: schedulers that read each job's true remaining run time.

No real scheduler knows it (Slurm knows time limits and history, ``datasets.predictor``), so
these are never baselines to beat and never a gate's reference: they show how far perfect
run-time knowledge would go on the same cluster. Every table marks them ``oracle``
(``cluster.heuristics.is_oracle``).

- ``sjf_bco_oracle``: SJF-BCO ordered by true GPU time (GPUs x remaining isolated run time)
  instead of GPU count; SJF-BCO's placement and node-span bound; no preemption.
- ``srtf_oracle``: shortest remaining time first on the true remaining isolated run time,
  preemptive: at every decision point all jobs, running and pending, are ranked by remaining
  time and admitted greedily while the cluster's GPUs suffice; running jobs left out are
  preempted (``Decision.preempt``; their work is kept, ``SimConfig.restart_cost_s`` added on
  restart) and admitted pending jobs start with SJF-BCO's placement rule and span bound.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import ClassVar

from linkwise.cluster.domain import ClusterState, Decision, PendingJob, RunningJob
from linkwise.cluster.heuristics._common import can_ever_run, check_bco_params, start_bounded
from linkwise.cluster.placement import apply_placement, release_placement


@dataclass(frozen=True, slots=True)
class SjfBcoOracle:
    """SJF-BCO by true GPU time (``num_gpus x remaining_s``): an oracle ceiling."""

    name: str = "sjf_bco_oracle"
    kappa: int | None = None
    lam: float = 1.0
    oracle: ClassVar[bool] = True

    def __post_init__(self) -> None:
        check_bco_params(self.kappa, self.lam)

    def decide(self, state: ClusterState) -> Decision:
        """Start every job that fits, smallest true GPU time first (SJF-BCO's placement)."""
        order = sorted(
            (p for p in state.pending if can_ever_run(state, p)),
            key=lambda p: (p.job.num_gpus * p.remaining_s, p.job.submit_time, p.job.job_id),
        )
        return start_bounded(state, order, self.kappa, self.lam)


@dataclass(frozen=True, slots=True)
class SrtfOracle:
    """Preemptive shortest remaining (true, isolated) time first: an oracle ceiling.

    Every job, running or pending, is ranked by remaining time (ties: submit time, job id)
    and admitted in that order while the cluster's GPUs suffice; running jobs left out are
    preempted. The admitted pending jobs are then placed in rank order with SJF-BCO's
    placement rule and node-span bound (``_common.start_bounded``; ``kappa``, ``lam`` as in
    ``sjf_bco``), so the ceiling is not lost to spread-out rings. A preempted job whose GPUs
    no new start took keeps running (its preemption would free nothing used), and the GPUs
    still free go to the other pending jobs, in rank order. Nothing starts: nothing changes.
    """

    name: str = "srtf_oracle"
    kappa: int | None = None
    lam: float = 1.0
    oracle: ClassVar[bool] = True

    def __post_init__(self) -> None:
        check_bco_params(self.kappa, self.lam)

    def decide(self, state: ClusterState) -> Decision:
        """Admit by remaining time; preempt the running jobs left out, start the admitted."""
        now = state.time
        ranked: list[tuple[float, float, int, RunningJob | PendingJob]] = [
            (r.remaining_at(now), r.job.submit_time, r.job.job_id, r) for r in state.running
        ]
        ranked += [
            (p.remaining_s, p.job.submit_time, p.job.job_id, p)
            for p in state.pending
            if can_ever_run(state, p)
        ]
        ranked.sort(key=lambda x: x[:3])
        left = state.total_free_gpus + sum(r.job.num_gpus for r in state.running)
        admitted: list[PendingJob] = []
        rest: list[PendingJob] = []
        kept: set[int] = set()
        for _, _, job_id, item in ranked:
            fits = item.job.num_gpus <= left
            if fits:
                left -= item.job.num_gpus
            if isinstance(item, PendingJob):
                (admitted if fits else rest).append(item)
            elif fits:
                kept.add(job_id)
        preempted = [r for r in state.running if r.job.job_id not in kept]
        free = list(state.free_gpus)
        for r in preempted:
            release_placement(free, r.placement)
        staying = [r for r in state.running if r.job.job_id in kept]
        first = start_bounded(
            replace(state, free_gpus=tuple(free), running=tuple(staying)),
            admitted,
            self.kappa,
            self.lam,
        )
        for start in first.starts:
            apply_placement(free, start.placement)
        # a preempted job whose GPUs no new start took keeps running
        for r in preempted:
            if all(free[node] >= g for node, g in r.placement.alloc):
                apply_placement(free, r.placement)
                staying.append(r)
        started = {s.job_id for s in first.starts}
        rest = [p for p in admitted if p.job.job_id not in started] + rest
        rest.sort(key=lambda p: (p.remaining_s, p.job.submit_time, p.job.job_id))
        second = start_bounded(
            replace(state, free_gpus=tuple(free), running=tuple(staying)),
            rest,
            self.kappa,
            self.lam,
        )
        starts = first.starts + second.starts
        if not starts:
            return Decision()
        kept_ids = {r.job.job_id for r in staying}
        return Decision(
            starts=starts,
            preempt=tuple(r.job.job_id for r in state.running if r.job.job_id not in kept_ids),
        )
