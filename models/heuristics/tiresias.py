"""Tiresias' discretised two-dimensional LAS (Gu et al., NSDI'19), preemptive."""

from __future__ import annotations

import bisect
import heapq
from dataclasses import dataclass

from linkwise.cluster.domain import ClusterState, Decision, PendingJob, Start
from linkwise.cluster.placement import apply_placement, best_fit, release_placement
from linkwise.models.heuristics._common import can_ever_run

# Tiresias' reference simulator (SymbioticLab/Tiresias, ``dlas-gpu``) runs two queues
# with one threshold of 3600 GPU-seconds of attained service; its starvation guard
# (STARVE_LIMIT) promotes a job that has waited 10x its executed time.
DEFAULT_THRESHOLDS: tuple[float, ...] = (3600.0,)
DEFAULT_STARVE_FACTOR = 10.0


@dataclass(frozen=True, slots=True)
class TiresiasLas:
    """Discretised 2D-LAS: K priority queues by attained GPU-seconds, FIFO inside a queue.

    A job is in queue ``k`` = number of ``thresholds`` (ascending, GPU-seconds; one
    number or a ``"a;b"`` string is accepted too, for command-line specs) at or below
    its attained service (GPUs x time held), so new jobs start in queue 0 and are
    demoted as they run. At every decision all jobs, running and pending, are ordered by
    queue, then (with ``running_first``, the default) running before pending, then
    submit time and job id, and admitted greedily while the GPUs (free plus those held
    by running jobs) suffice, skipping ones that do not fit. Running jobs that are not
    admitted are preempted; admitted pending jobs start, in that order, on a best-fit
    placement over the GPUs free after the preemptions. Admitted running jobs keep their
    placement, and a preempted job is never restarted in the same decision.

    ``running_first`` follows the reference simulator, which moves the pending jobs of
    each queue behind its running ones after every round: a job is only preempted for a
    job of a higher-priority queue, never for an older one of its own queue, which
    avoids much of the preemption churn of a pure (queue, submit time) order
    (``running_first=False``).

    Starvation guard (a stateless form of Tiresias' STARVE_LIMIT, which promotes a job
    pending for ``starve_factor`` times its executed time): a pending job whose time in
    the system without GPUs is at least ``starve_factor`` times its executed time
    (attained GPU-seconds / GPUs) is treated as queue 0; a running job stays there while
    that ratio is at least half the factor (hysteresis, so a promoted job is not demoted
    and preempted again right away). Jobs that never ran are in queue 0 anyway.
    ``starve_factor = 0`` disables the guard (the reference simulator's ``dlas-gpu``).
    """

    name: str = "tiresias_las"
    thresholds: tuple[float, ...] = DEFAULT_THRESHOLDS
    starve_factor: float = DEFAULT_STARVE_FACTOR
    running_first: bool = True

    def __post_init__(self) -> None:
        raw: object = self.thresholds
        if isinstance(raw, int | float):  # one threshold, e.g. from a "key=value" spec
            thresholds: tuple[float, ...] = (float(raw),)
        elif isinstance(raw, str):  # "3600;36000" or "3600/36000"
            thresholds = tuple(float(x) for x in raw.replace("/", ";").split(";") if x.strip())
        elif isinstance(raw, tuple | list):
            thresholds = tuple(float(x) for x in raw)
        else:
            raise ValueError(f"thresholds must be numbers, got {raw!r}")
        object.__setattr__(self, "thresholds", thresholds)
        if any(b <= a for a, b in zip(self.thresholds, self.thresholds[1:], strict=False)):
            raise ValueError(f"thresholds must be strictly ascending, got {self.thresholds}")
        if any(t <= 0 for t in self.thresholds):
            raise ValueError(f"thresholds must be positive, got {self.thresholds}")
        if self.starve_factor < 0:
            raise ValueError(f"starve_factor must be non-negative, got {self.starve_factor}")

    def queue_of(
        self, attained_gpu_s: float, gpus: int, waited_s: float, running: bool = False
    ) -> int:
        """The queue index of a job with this service, size and time spent without GPUs."""
        if attained_gpu_s <= 0:
            return 0
        executed = attained_gpu_s / gpus
        factor = self.starve_factor / 2 if running else self.starve_factor
        if factor > 0 and waited_s >= factor * executed:
            return 0
        return bisect.bisect_right(self.thresholds, attained_gpu_s)

    def decide(self, state: ClusterState) -> Decision:
        """Admit by priority; preempt the running jobs left out, start the admitted pending ones."""
        now = state.time
        pending_rank = 1 if self.running_first else 0
        capacity = state.total_free_gpus
        # (queue, rank: running first or not, submit, job id, kind: 0 running / 1 pending, index)
        keys: list[tuple[int, int, float, int, int, int]] = []
        # queue_of, inlined: this loop runs over every running and preempted job per decision
        thresholds = self.thresholds
        factor_pending = self.starve_factor
        factor_running = self.starve_factor / 2
        bisect_right = bisect.bisect_right
        for idx, r in enumerate(state.running):
            job = r.job
            gpus = job.num_gpus
            capacity += gpus
            attained = r.attained_gpu_s + gpus * (now - r.since)
            executed = attained / gpus
            if attained <= 0 or (
                factor_running > 0 and now - job.submit_time - executed >= factor_running * executed
            ):
                q = 0
            else:
                q = bisect_right(thresholds, attained)
            keys.append((q, 0, job.submit_time, job.job_id, 0, idx))
        max_gpus = state.topology.total_gpus
        for idx, p in enumerate(state.pending):
            attained = p.attained_gpu_s
            if attained > 0:
                job = p.job
                gpus = job.num_gpus
                if gpus > max_gpus:
                    continue
                executed = attained / gpus
                if (
                    factor_pending > 0
                    and now - job.submit_time - executed >= factor_pending * executed
                ):
                    q = 0
                else:
                    q = bisect_right(thresholds, attained)
                keys.append((q, pending_rank, job.submit_time, job.job_id, 1, idx))
        keys.sort()
        # Jobs that never ran are all in queue 0 and already in canonical (submit, id) order,
        # so they are merged in lazily: admission stops as soon as the GPUs are used up.
        fresh = (
            (0, pending_rank, p.job.submit_time, p.job.job_id, 1, idx)
            for idx, p in enumerate(state.pending)
            if p.attained_gpu_s <= 0 and can_ever_run(state, p)
        )

        left = capacity
        admitted_pending: list[PendingJob] = []
        admitted_running: set[int] = set()
        for *_, kind, idx in heapq.merge(keys, fresh):
            if left <= 0:
                break
            if kind == 0:
                gpus = state.running[idx].job.num_gpus
                if gpus <= left:
                    left -= gpus
                    admitted_running.add(idx)
            else:
                p = state.pending[idx]
                if p.job.num_gpus <= left:
                    left -= p.job.num_gpus
                    admitted_pending.append(p)
        preempted = [r for i, r in enumerate(state.running) if i not in admitted_running]
        if not admitted_pending:
            # preempting to start nothing would only waste the preempted jobs' work
            return Decision()

        free = list(state.free_gpus)
        for r in preempted:
            release_placement(free, r.placement)
        starts: list[Start] = []
        for p in admitted_pending:
            placement = best_fit(state.topology, free, p.job.num_gpus)
            if placement is None:  # pragma: no cover - admission counted the GPUs
                continue
            apply_placement(free, placement)
            starts.append(Start(p.job.job_id, placement))
        return Decision(starts=tuple(starts), preempt=tuple(r.job.job_id for r in preempted))
