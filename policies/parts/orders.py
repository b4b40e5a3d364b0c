"""Orders: which job a composed policy considers first.

Every order ranks jobs by a key, lowest first, ties by submit time and job id. The keyed
orders (``KeyedOrder``) give pending and running jobs one numeric score, so a preemption
rule can compare them (``preemption.Priority``'s margin divides a running job's score);
``Las`` is Tiresias' discretised 2D-LAS, whose queue order is the scheduler's own memory.

Same information: ``submit``, ``gpus``, ``pred_gpu_time`` and ``pred_remaining`` read only
what Slurm knows and the run-time predictor's annotations (``Job.pred_s``, ``pred_hi_s``);
``las`` reads attained service. ``true_gpu_time`` and ``true_remaining`` read the true
remaining run time: oracle orders (the SJF-BCO and SRTF ceilings).
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import ClassVar, Protocol

from linkwise.cluster.domain import ClusterState, Job, PendingJob, RunningJob

Item = PendingJob | RunningJob


class MissingPredictions(ValueError):
    """A policy that orders jobs by predicted run time met a job without a prediction."""


class Order(Protocol):
    """A ranking of jobs (see the module docstring)."""

    name: ClassVar[str]
    needs_predictions: ClassVar[bool]
    oracle: ClassVar[bool]
    remembers: ClassVar[bool]  # keeps memory between decisions: must see every job

    def pending(self, state: ClusterState, jobs: Sequence[PendingJob]) -> list[PendingJob]:
        """These pending jobs, first first."""
        ...

    def rank(
        self,
        state: ClusterState,
        running: Sequence[RunningJob],
        pending: Sequence[PendingJob],
        margin: float,
    ) -> list[Item]:
        """Running and pending jobs together, first first; a running job's score is
        divided by ``margin`` (a pending job must beat it by that factor)."""
        ...

    def settle(self, state: ClusterState, kept: set[int]) -> float:
        """After a round that keeps or starts the jobs ``kept``: when to decide next."""
        ...

    def rank_contested(
        self,
        state: ClusterState,
        running: Sequence[RunningJob],
        pending: Sequence[PendingJob],
        margin: float,
    ) -> tuple[list[RunningJob], list[Item]]:
        """``rank``, with the running jobs that come before every pending job apart (a
        greedy admission keeps them all: they fit, as they run now): (those, the rest
        ranked)."""
        ...


def check_predictions(state: ClusterState, who: str) -> None:
    """MissingPredictions unless every pending and running job carries a prediction."""
    for p in state.pending:
        if not p.job.pred_s > 0:  # ``Job.predicted`` inlined: the hot path
            raise MissingPredictions(
                f"{who} orders jobs by predicted GPU time, but job {p.job.job_id} has no "
                "run-time prediction: pass --history PATH (a trace or store of jobs "
                "submitted before these) to fit the predictor"
            )


def predicted_remaining_s(job: Job, attained_gpu_s: float) -> float:
    """Seconds a job is predicted to still run: the predictor's median less what it has run;
    past the median, its upper quantile (p90) less that; past that too, as long again as it
    has run (a job that outlived every prediction is expected to run as long again)."""
    executed = attained_gpu_s / job.num_gpus
    if job.pred_s > executed:
        return job.pred_s - executed
    if job.pred_hi_s > executed:
        return job.pred_hi_s - executed
    return executed


@dataclass(frozen=True, slots=True)
class KeyedOrder:
    """An order by one score per job (``score``), ties by submit time and job id."""

    name: ClassVar[str] = ""
    needs_predictions: ClassVar[bool] = False
    oracle: ClassVar[bool] = False
    remembers: ClassVar[bool] = False
    who: str = ""  # the policy named in a missing-prediction error (default: the order)

    def score_pending(self, p: PendingJob, now: float) -> float:
        raise NotImplementedError

    def score_running(self, r: RunningJob, now: float) -> float:
        raise NotImplementedError

    def scores_running(self, running: Sequence[RunningJob], now: float) -> list[float]:
        """``score_running`` of each (an order may compute them faster together)."""
        score = self.score_running
        return [score(r, now) for r in running]

    def scores_pending(self, pending: Sequence[PendingJob], now: float) -> list[float]:
        """``score_pending`` of each (an order may compute them faster together)."""
        score = self.score_pending
        return [score(p, now) for p in pending]

    def _check(self, state: ClusterState) -> None:
        if self.needs_predictions:
            check_predictions(state, self.who or self.name)

    def pending(self, state: ClusterState, jobs: Sequence[PendingJob]) -> list[PendingJob]:
        self._check(state)
        now = state.time
        score = self.score_pending
        return sorted(jobs, key=lambda p: (score(p, now), p.job.submit_time, p.job.job_id))

    def rank(
        self,
        state: ClusterState,
        running: Sequence[RunningJob],
        pending: Sequence[PendingJob],
        margin: float,
    ) -> list[Item]:
        self._check(state)
        now = state.time
        keyed: list[tuple[float, float, int, Item]] = [
            (self.score_running(r, now) / margin, r.job.submit_time, r.job.job_id, r)
            for r in running
        ]
        keyed += [(self.score_pending(p, now), p.job.submit_time, p.job.job_id, p) for p in pending]
        keyed.sort(key=lambda x: x[:3])
        return [x[3] for x in keyed]

    def settle(self, state: ClusterState, kept: set[int]) -> float:
        return math.inf

    def rank_contested(
        self,
        state: ClusterState,
        running: Sequence[RunningJob],
        pending: Sequence[PendingJob],
        margin: float,
    ) -> tuple[list[RunningJob], list[Item]]:
        self._check(state)
        if not pending:
            return list(running), []
        now = state.time
        # (score, submit, job id, job): job ids differ, so the tuples compare by their first
        # three and sort as ``rank`` sorts them
        keyed: list[tuple[float, float, int, Item]] = [
            (score, p.job.submit_time, p.job.job_id, p)
            for score, p in zip(self.scores_pending(pending, now), pending, strict=True)
        ]
        head = min(keyed)
        first, lowest = head[:3], head[0]
        safe: list[RunningJob] = []
        for r, score in zip(running, self.scores_running(running, now), strict=True):
            s = score / margin
            if s < lowest:  # the key compare, decided by its first member
                safe.append(r)
            elif s > lowest:
                keyed.append((s, r.job.submit_time, r.job.job_id, r))
            elif (s, r.job.submit_time, r.job.job_id) < first:
                safe.append(r)
            else:
                keyed.append((s, r.job.submit_time, r.job.job_id, r))
        keyed.sort()
        return safe, [x[3] for x in keyed]


@dataclass(frozen=True, slots=True)
class Submit(KeyedOrder):
    """First come, first served (FIFO): submit time, then job id."""

    name: ClassVar[str] = "submit"

    def pending(self, state: ClusterState, jobs: Sequence[PendingJob]) -> list[PendingJob]:
        return list(jobs)  # ``ClusterState.pending`` is in submit order already

    def score_pending(self, p: PendingJob, now: float) -> float:
        return 0.0

    def score_running(self, r: RunningJob, now: float) -> float:
        return 0.0


@dataclass(frozen=True, slots=True)
class Gpus(KeyedOrder):
    """Fewest GPUs first (SJF-BCO's smallest job first)."""

    name: ClassVar[str] = "gpus"

    def score_pending(self, p: PendingJob, now: float) -> float:
        return float(p.job.num_gpus)

    def score_running(self, r: RunningJob, now: float) -> float:
        return float(r.job.num_gpus)


@dataclass(frozen=True, slots=True)
class PredGpuTime(KeyedOrder):
    """Smallest predicted GPU time first: GPUs x the predictor's median (QSSF, Helios)."""

    name: ClassVar[str] = "pred_gpu_time"
    needs_predictions: ClassVar[bool] = True

    def score_pending(self, p: PendingJob, now: float) -> float:
        return p.job.num_gpus * p.job.pred_s

    def score_running(self, r: RunningJob, now: float) -> float:
        return r.job.num_gpus * r.job.pred_s


@dataclass(frozen=True, slots=True)
class PredRemaining(KeyedOrder):
    """Smallest predicted remaining GPU time first: GPUs x ``predicted_remaining_s``."""

    name: ClassVar[str] = "pred_remaining"
    needs_predictions: ClassVar[bool] = True

    def score_pending(self, p: PendingJob, now: float) -> float:
        return p.job.num_gpus * predicted_remaining_s(p.job, p.attained_gpu_s)

    def score_running(self, r: RunningJob, now: float) -> float:
        return r.job.num_gpus * predicted_remaining_s(r.job, r.attained_at(now))

    def scores_running(self, running: Sequence[RunningJob], now: float) -> list[float]:
        out = []
        for r in running:  # ``predicted_remaining_s`` and ``attained_at`` inlined: the hot path
            job = r.job
            gpus = job.num_gpus
            executed = (r.attained_gpu_s + gpus * (now - r.since)) / gpus
            if job.pred_s > executed:
                out.append(gpus * (job.pred_s - executed))
            elif job.pred_hi_s > executed:
                out.append(gpus * (job.pred_hi_s - executed))
            else:
                out.append(gpus * executed)
        return out

    def scores_pending(self, pending: Sequence[PendingJob], now: float) -> list[float]:
        out = []
        for p in pending:  # ``predicted_remaining_s`` inlined
            job = p.job
            gpus = job.num_gpus
            executed = p.attained_gpu_s / gpus
            if job.pred_s > executed:
                out.append(gpus * (job.pred_s - executed))
            elif job.pred_hi_s > executed:
                out.append(gpus * (job.pred_hi_s - executed))
            else:
                out.append(gpus * executed)
        return out


@dataclass(frozen=True, slots=True)
class TrueGpuTime(KeyedOrder):
    """Oracle: smallest true remaining GPU time first (GPUs x remaining isolated run time,
    a preempted job's restore included, as ``true_remaining`` counts it)."""

    name: ClassVar[str] = "true_gpu_time"
    oracle: ClassVar[bool] = True

    def score_pending(self, p: PendingJob, now: float) -> float:
        return p.job.num_gpus * (p.remaining_s + p.restore_s)

    def score_running(self, r: RunningJob, now: float) -> float:
        return r.job.num_gpus * r.remaining_at(now)


@dataclass(frozen=True, slots=True)
class TrueRemaining(KeyedOrder):
    """Oracle: shortest true remaining (isolated) run time first (SRTF).

    A pending job is scored by what it would have left to run once started: its work plus
    the restore a preempted job pays on restart (``PendingJob.restore_s``), as a running
    job's remaining time counts the restore it still works off. Scored without it, a job
    just restarted (its restore ahead of it) lost to the job it displaced, which lost to it
    again once back in the queue: a livelock of preemptions where no work is done (issue 32
    item 3). Scored with it, a preempted job never ranks below what it had left when it was
    preempted, so the one that displaced it is never displaced back by it."""

    name: ClassVar[str] = "true_remaining"
    oracle: ClassVar[bool] = True

    def score_pending(self, p: PendingJob, now: float) -> float:
        return p.remaining_s + p.restore_s

    def score_running(self, r: RunningJob, now: float) -> float:
        return r.remaining_at(now)


# ------------------------------------------------------------------ Tiresias' queues

# The reference simulator (SymbioticLab/Tiresias, ``dlas-gpu``): thresholds of 3250 and 7200
# GPU-seconds of attained service (three queues), no starvation guard. (3600 appears only in
# its ``multi-dlas-gpu``.)
DEFAULT_THRESHOLDS: tuple[float, ...] = (3250.0, 7200.0)
LAS_MODES = ("entry", "submit")
_EPS = 1e-6  # GPU-seconds: a job this close to a threshold has crossed it


@dataclass(slots=True)
class _Queues:
    """The reference scheduler's queues between decisions: job ids per queue in list order,
    each job's queue, as left after the round at ``time``; ``before`` is what they were
    before that round (a second decision at the same instant starts again from it)."""

    time: float = -math.inf
    lists: list[list[int]] = field(default_factory=list)
    qid: dict[int, int] = field(default_factory=dict)
    before: tuple[list[list[int]], dict[int, int]] | None = None
    # the round in progress (``rank`` to ``settle``): its queues, ``before``, and the state
    # it ranked whole (None if only some of its jobs) with that state's running and pending
    # jobs by id
    draft: (
        tuple[
            list[list[int]],
            dict[int, int],
            tuple[list[list[int]], dict[int, int]],
            tuple[ClusterState | None, dict[int, RunningJob], dict[int, PendingJob]],
        ]
        | None
    ) = None


def parse_thresholds(raw: object) -> tuple[float, ...]:
    """Thresholds from numbers, a sequence or an ``"a;b"`` string, checked ascending > 0."""
    if isinstance(raw, int | float):
        thresholds: tuple[float, ...] = (float(raw),)
    elif isinstance(raw, str):
        thresholds = tuple(float(x) for x in raw.replace("/", ";").split(";") if x.strip())
    elif isinstance(raw, tuple | list):
        thresholds = tuple(float(x) for x in raw)
    else:
        raise ValueError(f"thresholds must be numbers, got {raw!r}")
    if any(b <= a for a, b in itertools.pairwise(thresholds)):
        raise ValueError(f"thresholds must be strictly ascending, got {thresholds}")
    if any(t <= 0 for t in thresholds):
        raise ValueError(f"thresholds must be positive, got {thresholds}")
    return thresholds


@dataclass(frozen=True, slots=True)
class Las:
    """Tiresias' discretised 2D-LAS (Gu et al., NSDI'19): queues by attained GPU-seconds.

    A job's queue follows its attained service (GPUs x time held) against ``thresholds``;
    new jobs enter queue 0; queues are taken in priority order. ``mode="entry"`` (default)
    is the reference ``dlas-gpu``: each queue keeps the order jobs entered it (arrivals to
    queue 0, demoted jobs to the tail of the next queue), after every round its pending
    jobs move behind its running ones, and a running job crossing its queue's threshold is
    noticed as an event (``settle``'s wake-up time) and demoted one level. That order is
    the scheduler's memory, kept here between decisions (reset when the clock goes back or
    none of the jobs it knows is left); jobs it has not seen join the queue their service
    says, in submit order. ``mode="submit"`` is this project's earlier stateless form:
    every job's queue from its service now, inside a queue running jobs first (with
    ``running_first``) then submit order, and a starvation guard (``starve_factor``: a
    pending job whose time without GPUs is at least that many times its executed time is
    treated as queue 0; a running one while the ratio is at least half the factor).
    """

    name: ClassVar[str] = "las"
    needs_predictions: ClassVar[bool] = False
    oracle: ClassVar[bool] = False
    remembers: ClassVar[bool] = True
    thresholds: tuple[float, ...] = DEFAULT_THRESHOLDS
    mode: str = "entry"
    starve_factor: float = 0.0
    running_first: bool = True
    _queues: _Queues = field(default_factory=_Queues, init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "thresholds", parse_thresholds(self.thresholds))
        if self.starve_factor < 0:
            raise ValueError(f"starve_factor must be non-negative, got {self.starve_factor}")
        if self.mode not in LAS_MODES:
            raise ValueError(f"order must be one of {LAS_MODES}, got {self.mode!r}")
        if self.mode == "entry" and self.starve_factor > 0:
            raise ValueError("the starvation guard needs order=submit (dlas-gpu has none)")

    def queue_of(
        self, attained_gpu_s: float, gpus: int, waited_s: float, running: bool = False
    ) -> int:
        """The queue of a job with this service, size and time without GPUs (submit mode)."""
        if attained_gpu_s <= 0:
            return 0
        executed = attained_gpu_s / gpus
        factor = self.starve_factor / 2 if running else self.starve_factor
        if factor > 0 and waited_s >= factor * executed:
            return 0
        return bisect.bisect_right(self.thresholds, attained_gpu_s)

    def pending(self, state: ClusterState, jobs: Sequence[PendingJob]) -> list[PendingJob]:
        ranked = self.rank(state, (), jobs, 1.0)
        self._queues.draft = None  # a pending-only ranking is no round
        return [p for p in ranked if isinstance(p, PendingJob)]

    def rank(
        self,
        state: ClusterState,
        running: Sequence[RunningJob],
        pending: Sequence[PendingJob],
        margin: float,
    ) -> list[Item]:
        if margin != 1.0:
            raise ValueError("order=las ranks by queue, not by a score: it takes no margin")
        if self.mode == "entry":
            return self._rank_entry(state, running, pending)
        return self._rank_submit(state, running, pending)

    def _rank_entry(
        self,
        state: ClusterState,
        running_jobs: Sequence[RunningJob],
        pending_jobs: Sequence[PendingJob],
    ) -> list[Item]:
        now = state.time
        mem = self._queues
        thresholds = self.thresholds
        last = len(thresholds)
        running = {r.job.job_id: r for r in running_jobs}
        pending = {p.job.job_id: p for p in pending_jobs}
        # jobs draining or about to start on reserved GPUs keep their place (restart model)
        transit = {t.job.job_id for t in state.transit}
        # the queues this round starts from; never changed in place (every round builds its
        # own lists), so the round's ``before`` is that object itself
        if mem.time == now and mem.before is not None:
            before = mem.before
        elif now < mem.time or not any(
            j in running or j in pending or j in transit for j in mem.qid
        ):
            before = ([[] for _ in range(last + 1)], {})
        else:
            before = (mem.lists, mem.qid)
        # jobs that ended leave their queue; jobs not seen yet join theirs, in submit order
        alive = running.keys() | pending.keys() | transit
        lists = [[j for j in members if j in alive] for members in before[0]]
        qid = {j: q for q, members in enumerate(lists) for j in members}
        unseen = [r.job for r in running_jobs if r.job.job_id not in qid]
        unseen += [p.job for p in pending_jobs if p.job.job_id not in qid]
        if unseen:
            unseen.sort(key=lambda j: (j.submit_time, j.job_id))
            for job in unseen:
                r = running.get(job.job_id)
                attained = (
                    r.attained_at(now) if r is not None else pending[job.job_id].attained_gpu_s
                )
                q = bisect.bisect_right(thresholds, attained + _EPS)
                lists[q].append(job.job_id)
                qid[job.job_id] = q
        # a running job at or past its queue's threshold moves one queue down, to the tail
        # (in submit order; each moves once, so only the movers need sorting)
        down = [  # ``attained_at(now)`` inlined
            r
            for r in running_jobs
            if (q := qid[r.job.job_id]) < last
            and r.attained_gpu_s + r.job.num_gpus * (now - r.since) + _EPS >= thresholds[q]
        ]
        if down:
            down.sort(key=lambda r: (r.job.submit_time, r.job.job_id))
            for r in down:
                j = r.job.job_id
                q = qid[j]
                lists[q].remove(j)
                lists[q + 1].append(j)
                qid[j] = q + 1
        # the maps of this state's jobs, for ``settle`` (when it ranked all of them)
        whole = running_jobs is state.running and pending_jobs is state.pending
        mem.draft = (lists, qid, before, (state if whole else None, running, pending))
        out: list[Item] = []
        get_running, get_pending = running.get, pending.get
        for members in lists:
            for j in members:
                item: Item | None = get_running(j)
                if item is None:
                    item = get_pending(j)
                    if item is None:
                        continue
                out.append(item)
        return out

    def _rank_submit(
        self, state: ClusterState, running: Sequence[RunningJob], pending: Sequence[PendingJob]
    ) -> list[Item]:
        now = state.time
        keyed: list[tuple[int, int, float, int, Item]] = []
        first = 0 if self.running_first else 1
        for r in running:
            job = r.job
            attained = r.attained_at(now)
            q = 0
            if attained >= self.thresholds[0]:
                executed = attained / job.num_gpus
                factor = self.starve_factor / 2
                if not (factor > 0 and now - job.submit_time - executed >= factor * executed):
                    q = bisect.bisect_right(self.thresholds, attained)
            keyed.append((q, first, job.submit_time, job.job_id, r))
        for p in pending:
            job = p.job
            attained = p.attained_gpu_s
            q = 0
            if attained >= self.thresholds[0]:
                executed = attained / job.num_gpus
                factor = self.starve_factor
                if not (factor > 0 and now - job.submit_time - executed >= factor * executed):
                    q = bisect.bisect_right(self.thresholds, attained)
            keyed.append((q, 1, job.submit_time, job.job_id, p))
        keyed.sort(key=lambda x: x[:4])
        return [x[4] for x in keyed]

    def rank_contested(
        self,
        state: ClusterState,
        running: Sequence[RunningJob],
        pending: Sequence[PendingJob],
        margin: float,
    ) -> tuple[list[RunningJob], list[Item]]:
        return [], self.rank(state, running, pending, margin)

    def settle(self, state: ClusterState, kept: set[int]) -> float:
        mem = self._queues
        if self.mode != "entry" or mem.draft is None:
            return math.inf
        lists, qid, before, seen = mem.draft
        mem.draft = None
        # a job about to start on reserved GPUs (restart model) counts as running
        kept = kept | {
            t.job.job_id for t in state.transit if t.target is not None and t.job.job_id in qid
        }
        # pending jobs move behind the running ones, in their order
        for q, members in enumerate(lists):
            lists[q] = [j for j in members if j in kept] + [j for j in members if j not in kept]
        mem.time, mem.lists, mem.qid, mem.before = state.time, lists, qid, before
        now = state.time
        thresholds = self.thresholds
        last = len(thresholds)
        if seen[0] is state:  # the round ranked this state's jobs: their maps are at hand
            running, pending = seen[1], seen[2]
        else:
            running = {r.job.job_id: r for r in state.running}
            pending = {p.job.job_id: p for p in state.pending}
        wake = math.inf
        get_running, get_pending = running.get, pending.get
        for j in kept:
            q = qid[j]
            if q >= last:
                continue
            r = get_running(j)
            if r is not None:  # ``attained_at(now)`` inlined
                attained = r.attained_gpu_s + r.job.num_gpus * (now - r.since)
                w = now + (thresholds[q] - attained) / r.job.num_gpus
            else:
                p = get_pending(j)
                if p is None:
                    continue
                w = now + (thresholds[q] - p.attained_gpu_s) / p.job.num_gpus
            if w < wake:
                wake = w
        return wake


ORDERS: dict[str, type] = {
    o.name: o for o in (Submit, Gpus, PredGpuTime, PredRemaining, Las, TrueGpuTime, TrueRemaining)
}
