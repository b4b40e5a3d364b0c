"""Tiresias' discretised two-dimensional LAS (Gu et al., NSDI'19), preemptive."""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import compress

from linkwise.cluster.domain import ClusterState, Decision, PendingJob, RunningJob, Start
from linkwise.cluster.placement import apply_placement, best_fit, release_placement

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
        # Hot path: every decision ranks every running and preempted job. So ``queue_of`` is
        # inlined and nothing is sorted by (queue, ...) keys: jobs are admitted queue by queue,
        # pending ones in ``state.pending``'s canonical (submit, id) order, running ones sorted
        # by (submit, id) only when the order matters (not all of them fit).
        now = state.time
        running = state.running
        thresholds = self.thresholds
        first_threshold, last_threshold = thresholds[0], thresholds[-1]
        n_queues = len(thresholds) + 1
        last_queue = n_queues - 1
        factor_pending = self.starve_factor
        factor_running = factor_pending / 2
        bisect_right = bisect.bisect_right
        # each queue's running jobs (indices into state.running) and the GPUs they hold
        run_queues: list[list[int]] = [[] for _ in range(n_queues)]
        queue_gpus = [0] * n_queues
        for idx, r in enumerate(running):
            job = r.job
            gpus = job.num_gpus
            attained = r.attained_gpu_s + gpus * (now - r.since)
            if attained < first_threshold:  # queue 0 whatever the starvation guard says
                q = 0
            else:
                executed = attained / gpus
                if (
                    factor_running > 0
                    and now - job.submit_time - executed >= factor_running * executed
                ):
                    q = 0
                elif attained >= last_threshold:
                    q = last_queue
                else:
                    q = bisect_right(thresholds, attained)
            run_queues[q].append(idx)
            queue_gpus[q] += gpus

        # A job too large for the cluster is never admitted: it needs more than ``left``.
        left = state.total_free_gpus + sum(queue_gpus)
        dropped = bytearray(len(running))  # 1: a running job left out, to preempt
        admitted_pending: list[PendingJob] = []
        # preempted pending jobs of queues >= 1, filled by the scan of queue 0
        later: list[list[PendingJob]] = [[] for _ in range(n_queues)]
        running_first = self.running_first
        for q in range(n_queues):
            run_q = run_queues[q]
            if left <= 0:
                for idx in run_q:
                    dropped[idx] = 1
                continue
            # running jobs still to merge with this queue's pending ones (not running_first)
            run_keys: list[tuple[float, int, int, int]] = []
            if not running_first:
                run_keys = _by_submit(running, run_q)
            elif queue_gpus[q] <= left:  # they all fit, whatever their order
                left -= queue_gpus[q]
            else:
                for _, _, gpus, idx in _by_submit(running, run_q):
                    if gpus <= left:
                        left -= gpus
                    else:
                        dropped[idx] = 1
            k = 0
            for p in state.pending if q == 0 else later[q]:
                if left <= 0:
                    break
                job = p.job
                if q == 0:
                    attained = p.attained_gpu_s
                    if attained >= first_threshold:
                        executed = attained / job.num_gpus
                        if not (
                            factor_pending > 0
                            and now - job.submit_time - executed >= factor_pending * executed
                        ):
                            later[
                                last_queue
                                if attained >= last_threshold
                                else bisect_right(thresholds, attained)
                            ].append(p)
                            continue
                if k < len(run_keys):  # running jobs submitted earlier go first
                    key = (job.submit_time, job.job_id)
                    while k < len(run_keys) and run_keys[k][:2] < key:
                        _, _, gpus, idx = run_keys[k]
                        k += 1
                        if gpus <= left:
                            left -= gpus
                        else:
                            dropped[idx] = 1
                    if left <= 0:
                        break
                gpus = job.num_gpus
                if gpus <= left:
                    left -= gpus
                    admitted_pending.append(p)
            for _, _, gpus, idx in run_keys[k:]:
                if gpus <= left:
                    left -= gpus
                else:
                    dropped[idx] = 1
        if not admitted_pending:
            # preempting to start nothing would only waste the preempted jobs' work
            return Decision()
        preempted = list(compress(running, dropped))

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


def _by_submit(
    running: Sequence[RunningJob], members: Sequence[int]
) -> list[tuple[float, int, int, int]]:
    """These running jobs as sorted ``(submit time, job id, GPUs, index)`` tuples."""
    keys = []
    for idx in members:
        job = running[idx].job
        keys.append((job.submit_time, job.job_id, job.num_gpus, idx))
    keys.sort()
    return keys
