"""Tiresias' discretised two-dimensional LAS (Gu et al., NSDI'19), preemptive."""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import compress

from linkwise.cluster.domain import ClusterState, Decision, PendingJob, RunningJob, Start
from linkwise.cluster.placement import apply_placement, best_fit, release_placement

# The reference simulator (SymbioticLab/Tiresias, ``dlas-gpu``): thresholds of 3250 and 7200
# GPU-seconds of attained service (three queues), no starvation guard. (3600 appears only in
# its ``multi-dlas-gpu``.)
DEFAULT_THRESHOLDS: tuple[float, ...] = (3250.0, 7200.0)
DEFAULT_STARVE_FACTOR = 0.0
ORDERS = ("entry", "submit")
_EPS = 1e-6  # GPU-seconds: a job this close to a threshold has crossed it


@dataclass(slots=True)
class _Queues:
    """The reference scheduler's queues between decisions: job ids per queue in list order,
    each job's queue, as left after the round at ``time``; ``before`` is what they were before
    that round (a second decision at the same instant starts again from it)."""

    time: float = -math.inf
    lists: list[list[int]] = field(default_factory=list)
    qid: dict[int, int] = field(default_factory=dict)
    before: tuple[list[list[int]], dict[int, int]] | None = None


@dataclass(frozen=True, slots=True)
class TiresiasLas:
    """Discretised 2D-LAS: priority queues by attained GPU-seconds, fit-first inside a queue.

    A job's queue follows its attained service (GPUs x time held) against ``thresholds``
    (ascending GPU-seconds; one number or an ``"a;b"`` string is accepted too, for
    command-line specs): new jobs enter queue 0. At every decision the queues are scanned
    in priority order, each in its own order, and jobs are admitted greedily while the GPUs
    (free plus those held by running jobs) suffice, skipping ones that do not fit. Running
    jobs that are not admitted are preempted; admitted pending jobs start, in that order, on
    a best-fit placement over the GPUs free after the preemptions; admitted running jobs
    keep their placement.

    ``order="entry"`` (default) is the reference ``dlas-gpu``: each queue keeps the order
    jobs entered it (arrivals to queue 0, demoted jobs appended to the tail of the next
    queue, behind the jobs already waiting there), and after every round its pending jobs
    move behind its running ones; a running job crossing its queue's threshold is noticed
    as an event (``Decision.wake_at``) and demoted one level. That order is the scheduler's
    own memory, so this policy keeps it between decisions (reset when the clock goes back or
    none of the jobs it knows is left); jobs it has not seen (a warm start) join the queue
    their service says, in submit order. No starvation guard (``starve_factor`` must be 0).

    ``order="submit"`` is this project's earlier stateless form: every job's queue from its
    attained service now, and inside a queue (with ``running_first``) running before
    pending, then submit time and job id. Its starvation guard (a stateless form of
    Tiresias' STARVE_LIMIT): a pending job whose time in the system without GPUs is at
    least ``starve_factor`` times its executed time (attained GPU-seconds / GPUs) is treated
    as queue 0; a running job stays there while that ratio is at least half the factor.
    The earlier defaults were ``thresholds=3600,starve_factor=10``.
    """

    name: str = "tiresias_las"
    thresholds: tuple[float, ...] = DEFAULT_THRESHOLDS
    starve_factor: float = DEFAULT_STARVE_FACTOR
    running_first: bool = True
    order: str = "entry"
    _queues: _Queues = field(default_factory=_Queues, init=False, compare=False, repr=False)

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
        if self.order not in ORDERS:
            raise ValueError(f"order must be one of {ORDERS}, got {self.order!r}")
        if self.order == "entry" and self.starve_factor > 0:
            raise ValueError("the starvation guard needs order=submit (dlas-gpu has none)")

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
        if self.order == "entry":
            return self._decide_entry(state)
        return self._decide_submit(state)

    def _decide_entry(self, state: ClusterState) -> Decision:
        """The reference ``dlas-gpu`` round (see the class docstring)."""
        now = state.time
        mem = self._queues
        thresholds = self.thresholds
        last = len(thresholds)
        running = {r.job.job_id: r for r in state.running}
        pending = {p.job.job_id: p for p in state.pending}
        if mem.time == now and mem.before is not None:
            lists, qid = [list(q) for q in mem.before[0]], dict(mem.before[1])
        elif now < mem.time or not any(j in running or j in pending for j in mem.qid):
            lists, qid = [[] for _ in range(last + 1)], {}
        else:
            lists, qid = [list(q) for q in mem.lists], dict(mem.qid)
        before = ([list(q) for q in lists], dict(qid))
        # jobs that ended leave their queue; jobs not seen yet join theirs, in submit order
        for q, members in enumerate(lists):
            lists[q] = [j for j in members if j in running or j in pending]
        qid = {j: q for q, members in enumerate(lists) for j in members}
        unseen = [r.job for r in state.running if r.job.job_id not in qid]
        unseen += [p.job for p in state.pending if p.job.job_id not in qid]
        for job in sorted(unseen, key=lambda j: (j.submit_time, j.job_id)):
            r = running.get(job.job_id)
            attained = r.attained_at(now) if r is not None else pending[job.job_id].attained_gpu_s
            q = bisect.bisect_right(thresholds, attained + _EPS)
            lists[q].append(job.job_id)
            qid[job.job_id] = q
        # a running job at or past its queue's threshold moves one queue down, to the tail
        for r in sorted(state.running, key=lambda r: (r.job.submit_time, r.job.job_id)):
            j = r.job.job_id
            q = qid[j]
            if q < last and r.attained_at(now) + _EPS >= thresholds[q]:
                lists[q].remove(j)
                lists[q + 1].append(j)
                qid[j] = q + 1
        # the round: every queue in its order, fit-first
        left = state.total_free_gpus + sum(r.job.num_gpus for r in state.running)
        admitted: list[PendingJob] = []
        preempted: list[RunningJob] = []
        still: set[int] = set()  # running after the round
        for members in lists:
            for j in members:
                r = running.get(j)
                gpus = r.job.num_gpus if r is not None else pending[j].job.num_gpus
                if gpus <= left:
                    left -= gpus
                    still.add(j)
                    if r is None:
                        admitted.append(pending[j])
                elif r is not None:
                    preempted.append(r)
        # pending jobs move behind the running ones, in their order
        for q, members in enumerate(lists):
            lists[q] = [j for j in members if j in still] + [j for j in members if j not in still]
        mem.time, mem.lists, mem.qid, mem.before = now, lists, qid, before

        starts = _place(state, preempted, admitted)
        wake = math.inf
        for j in still:
            q = qid[j]
            if q < last:
                r = running.get(j)
                job = r.job if r is not None else pending[j].job
                attained = r.attained_at(now) if r is not None else pending[j].attained_gpu_s
                wake = min(wake, now + (thresholds[q] - attained) / job.num_gpus)
        return Decision(
            starts=tuple(starts),
            preempt=tuple(r.job.job_id for r in preempted),
            wake_at=wake,
        )

    def _decide_submit(self, state: ClusterState) -> Decision:
        """The earlier stateless order (see the class docstring)."""
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

        starts = _place(state, preempted, admitted_pending)
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


def _place(
    state: ClusterState, preempted: Sequence[RunningJob], admitted: Sequence[PendingJob]
) -> list[Start]:
    """Best-fit placements for the admitted jobs, on the GPUs free once ``preempted`` stop."""
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
    return starts
