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
  restart) and admitted pending jobs start on a best-fit placement.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from linkwise.cluster.domain import ClusterState, Decision, PendingJob, RunningJob, Start
from linkwise.cluster.heuristics._common import can_ever_run, check_bco_params, start_bounded
from linkwise.cluster.placement import apply_placement, best_fit, release_placement


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
    """Preemptive shortest remaining (true, isolated) time first: an oracle ceiling."""

    name: str = "srtf_oracle"
    oracle: ClassVar[bool] = True

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
        kept: set[int] = set()
        for _, _, job_id, item in ranked:
            gpus = item.job.num_gpus
            if gpus > left:
                continue
            left -= gpus
            if isinstance(item, PendingJob):
                admitted.append(item)
            else:
                kept.add(job_id)
        if not admitted:
            return Decision()  # every running job was admitted: nothing changes
        preempted = [r for r in state.running if r.job.job_id not in kept]
        free = list(state.free_gpus)
        for r in preempted:
            release_placement(free, r.placement)
        starts: list[Start] = []
        for p in admitted:
            placement = best_fit(state.topology, free, p.job.num_gpus)
            if placement is None:  # pragma: no cover - admission counted the GPUs
                continue
            apply_placement(free, placement)
            starts.append(Start(p.job.job_id, placement))
        return Decision(starts=tuple(starts), preempt=tuple(r.job.job_id for r in preempted))
