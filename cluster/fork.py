"""Forking the simulator from what a policy knows, and scoring moves by continuing them.

A fork is a fresh ``Simulator`` built from a ``ClusterState``: the running jobs on their
placements with their attained service, start times and preemption counts, the pending
jobs, the jobs in transit (draining, or waiting on reserved GPUs), the topology, the
contention model and the restart model. What a policy does not know, the true run time, is
never read (``Job.duration``, ``PendingJob.remaining_s``, ``RunningJob.remaining_s`` and
``rate`` are ignored): every job's run time is drawn from the run-time predictor's
distribution (``datasets.predictor``: the job's quantiles ``pred_s`` and ``pred_hi_s``, a
log-normal through them, capped at the time limit Slurm enforces), a job that has run
``a`` seconds (attained GPU-seconds over its GPUs) conditioned on running longer than
``a``. Optionally, future arrivals are drawn from history statistics (``Arrivals``).

Common random numbers: sample ``s`` of a decision point draws each job's quantile from a
hash of (seed, s, job id), and its arrivals from (seed, s), so every alternative scored at
one decision point sees the same run times and the same arrivals, and their differences
are low-variance (scoring an alternative twice gives the same value).

``oracle=True`` reads the true remaining work instead: a privileged ceiling, to be
measured, never trained on for a shipped package.

Scoring (``rollout_cost``): apply a first decision at the fork's time, then let the base
policy decide at every later decision point, for ``horizon_s`` of simulated time; the cost
is the jobs-in-system time over the horizon (the sum over jobs of their time in the system
inside it: Little's law, the total JCT's share of the horizon). Two options, off by default
(the cost labels were first made with):

- ``terminal``: add the terminal cost, an estimate of what the jobs still in the system when
  the horizon ends will spend in it from then on (``terminal_cost_s``: per job, the larger
  of its remaining drawn work and its rank's completion on the cluster's pooled GPUs, the
  machine of ``cluster.bounds``). Without it every job still in the system at the end costs the
  same whatever its work left, so a long job started late, a preemption's lost work or GPUs
  left idle cost nothing once they reach past the horizon: a 6-hour horizon never pays for
  starting a long job, and waiting looks free.
- ``hold_s``: a wait is a commitment to do nothing for ``hold_s`` (the base is not asked
  before then, completions or not), instead of a wait until the next event after which the
  base takes over. A policy that scores waits so must keep them as long (the lookahead
  does): a wait priced as "the base acts at the next event" and chosen again at that event
  is a chain of deferrals none of which was priced.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from statistics import NormalDist

from linkwise.cluster.contention import ContentionModel
from linkwise.cluster.domain import (
    ClusterState,
    Decision,
    Job,
    PendingJob,
    Policy,
    RunningJob,
)
from linkwise.cluster.simulator.bookkeeping import ResumedTransit
from linkwise.cluster.simulator.config import SimConfig
from linkwise.cluster.simulator.engine import Simulator
from linkwise.cluster.simulator.errors import SimulationStalled

__all__ = [
    "Arrivals",
    "ForkCache",
    "RunTimeBelief",
    "fork",
    "fresh",
    "jobs_in_system_s",
    "rollout_cost",
    "score_decisions",
    "terminal_cost_s",
]

_NORMAL = NormalDist()
_MASK64 = (1 << 64) - 1


def _mix(*values: int) -> int:
    """A 64-bit hash of integers (splitmix64 steps): the common random numbers' key."""
    h = 0x9E3779B97F4A7C15
    for v in values:
        h = (h ^ (v & _MASK64)) & _MASK64
        h = (h + 0x9E3779B97F4A7C15) & _MASK64
        z = h
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
        h = z ^ (z >> 31)
    return h


def uniform(*key: int) -> float:
    """A uniform number in (0, 1) determined by ``key`` (the same key, the same number)."""
    return ((_mix(*key) >> 11) + 0.5) / float(1 << 53)


@dataclass(frozen=True, slots=True)
class RunTimeBelief:
    """The run-time distribution a policy may hold of a job: log-normal through the
    predictor's quantiles (``pred_s`` at ``q_lo``, ``pred_hi_s`` at ``q_hi``; the
    predictor's defaults are the median and p90), at least ``min_sigma`` wide in log space,
    capped at the job's time limit."""

    q_lo: float = 0.5
    q_hi: float = 0.9
    min_sigma: float = 0.1

    def params(self, job: Job) -> tuple[float, float]:
        """(mu, sigma) of the job's log run time; ValueError without predictions."""
        if not job.predicted:
            raise ValueError(
                f"job {job.job_id} has no run-time prediction (pred_s): a fork draws run times "
                "from the predictor and never reads the true one (--history fits a predictor)"
            )
        z_lo, z_hi = _NORMAL.inv_cdf(self.q_lo), _NORMAL.inv_cdf(self.q_hi)
        lo, hi = math.log(job.pred_s), math.log(max(job.pred_hi_s, job.pred_s))
        sigma = max(self.min_sigma, (hi - lo) / (z_hi - z_lo))
        return lo - z_lo * sigma, sigma

    def total(self, job: Job, ran_s: float, u: float) -> float:
        """The job's total run time for the uniform draw ``u``, given it has run ``ran_s``
        seconds: the inverse CDF above ``ran_s`` (capped at the time limit). A job past its
        distribution's support is given as long again as it has run."""
        mu, sigma = self.params(job)
        cap = job.time_limit if job.time_limit > 0 else math.inf
        floor = _NORMAL.cdf((math.log(ran_s) - mu) / sigma) if ran_s > 0 else 0.0
        p = floor + u * (1.0 - floor)
        tail = p >= 1.0 - 1e-12
        value = 2.0 * ran_s if tail else math.exp(mu + sigma * _NORMAL.inv_cdf(p))
        value = max(value, ran_s + 1.0)
        return min(value, max(cap, ran_s + 1.0))

    def remaining(self, job: Job, attained_gpu_s: float, u: float) -> float:
        """Seconds of work left for the draw ``u`` (total less what it has run)."""
        ran = attained_gpu_s / job.num_gpus
        return max(1.0, self.total(job, ran, u) - ran)


@dataclass(frozen=True)
class Arrivals:
    """Future arrivals drawn from history statistics: a Poisson process of ``rate_per_s``
    whose jobs are drawn from ``templates`` (past jobs: their shape, user, name, profile,
    time limit and predictions; their run times are drawn from the belief like any other).
    Ids start at ``first_id`` so they never clash with the state's."""

    rate_per_s: float
    templates: tuple[Job, ...]
    first_id: int = 1 << 40

    def __post_init__(self) -> None:
        if self.rate_per_s < 0 or (self.rate_per_s > 0 and not self.templates):
            raise ValueError("arrivals need a non-negative rate and templates to draw from")

    @classmethod
    def from_history(cls, jobs: Sequence[Job]) -> Arrivals:
        """The arrival rate and job mix of past jobs (submit span, the jobs themselves)."""
        if len(jobs) < 2:
            raise ValueError("arrivals from history need at least two past jobs")
        span = max(j.submit_time for j in jobs) - min(j.submit_time for j in jobs)
        return cls(rate_per_s=(len(jobs) - 1) / max(span, 1.0), templates=tuple(jobs))

    def draw(self, t0: float, horizon_s: float, seed: int, sample: int) -> tuple[Job, ...]:
        """The arrivals of ``(t0, t0 + horizon_s]`` for one sample (common random numbers:
        the same seed and sample, the same arrivals)."""
        out: list[Job] = []
        t, i = t0, 0
        while self.rate_per_s > 0:
            t += -math.log(uniform(seed, sample, 1, i)) / self.rate_per_s
            if t > t0 + horizon_s:
                break
            tpl = self.templates[int(uniform(seed, sample, 2, i) * len(self.templates))]
            out.append(replace(tpl, job_id=self.first_id + i, submit_time=t))
            i += 1
        return tuple(out)


def _with_work(job: Job, work: float) -> Job:
    """The job as the fork sees it: its duration is the drawn work (never the true one)."""
    return replace(job, duration=max(work, 1e-3))


@dataclass
class ForkCache:
    """What forks of one state share (``score_decisions`` keeps one per state): the belief
    model's rate of each single-node running job (it depends on the job and its placement
    only) and, per sample, each job as the fork sees it (its drawn work) and each running
    job as the fork resumes it."""

    rates: dict[int, float] = field(default_factory=dict)
    jobs: dict[tuple[int, int], Job] = field(default_factory=dict)
    runs: dict[tuple[int, int], RunningJob] = field(default_factory=dict)


def fork(
    state: ClusterState,
    model: ContentionModel,
    config: SimConfig | None = None,
    *,
    seed: int = 0,
    sample: int = 0,
    belief: RunTimeBelief | None = None,
    arrivals: Arrivals | None = None,
    horizon_s: float = 6 * 3600.0,
    oracle: bool = False,
    memo: dict[int, float] | None = None,
    cache: ForkCache | None = None,
) -> Simulator:
    """A fresh simulator at ``state.time`` holding what ``state`` shows, every unknown run
    time drawn from the belief for (``seed``, ``sample``) (see the module docstring);
    ``oracle`` reads the true remaining work instead (a measured ceiling only). ``memo``
    keeps the draws of one sample for the next fork of the same state and sample; ``cache``
    (``ForkCache``) what every fork of the same state shares."""
    belief = belief or RunTimeBelief()
    cfg = config or SimConfig()
    t0 = state.time

    draws = memo if memo is not None else {}

    def work(job: Job, attained: float, true_left: float) -> float:  # true_left: oracle only
        if oracle:
            return true_left
        left = draws.get(job.job_id)
        if left is None:
            left = draws[job.job_id] = belief.remaining(
                job, attained, uniform(seed, sample, 0, job.job_id)
            )
        return left

    shared = cache if cache is not None else ForkCache()

    def seen(job: Job, left: float) -> Job:
        key = (sample, job.job_id)
        out = shared.jobs.get(key)
        if out is None or out.duration != max(left, 1e-3):
            out = shared.jobs[key] = _with_work(job, left)
        return out

    future = arrivals.draw(t0, horizon_s, seed, sample) if arrivals is not None else ()
    future = tuple(
        _with_work(
            j, j.duration if oracle else belief.total(j, 0.0, uniform(seed, sample, 0, j.job_id))
        )
        for j in future
    )
    pending = []
    for pj in state.pending:
        left = work(pj.job, pj.attained_gpu_s, pj.remaining_s)
        pending.append(
            PendingJob(
                job=seen(pj.job, left),
                remaining_s=left,
                attained_gpu_s=pj.attained_gpu_s,
                preemptions=pj.preemptions,
                restore_s=pj.restore_s,
            )
        )
    running = []
    for run in state.running:
        left = work(run.job, run.attained_at(t0), run.remaining_at(t0))
        job = seen(run.job, left)
        resumed = shared.runs.get((sample, job.job_id))
        if resumed is None or resumed.job is not job or resumed.remaining_s != left:
            resumed = _resumed_running(state, model, run, left, job, shared.rates)
            shared.runs[(sample, job.job_id)] = resumed
        running.append(resumed)
    return Simulator.from_state(
        state.topology,
        model,
        cfg,
        time=t0,
        free_gpus=state.free_gpus,
        pending=pending,
        running=running,
        transit=_resumed_transit(state, work),
        arrivals=future,
    )


def _resumed_running(
    state: ClusterState,
    model: ContentionModel,
    run: RunningJob,
    left: float,
    job: Job,
    rates: dict[int, float],
) -> RunningJob:
    """A running job on its placement with ``left`` seconds of work from now (``job``: as
    the fork sees it); ``rates`` memoises single-node rates per job (a split job's rate is
    the simulator's to set)."""
    t0 = state.time
    rate = 0.0
    if run.placement.num_nodes == 1:
        known = rates.get(job.job_id)
        if known is None:
            known = rates[job.job_id] = model.rates(state.topology, [(job, run.placement)])[0]
        rate = known
    return RunningJob(
        job=job,
        placement=run.placement,
        start_time=run.start_time,
        remaining_s=left,
        rate=rate,
        attained_gpu_s=run.attained_at(t0),
        preemptions=run.preemptions,
        since=t0,
    )


_Work = Callable[[Job, float, float], float]


def _resumed_transit(state: ClusterState, work: _Work) -> list[ResumedTransit]:
    """Jobs draining or waiting on reserved GPUs, as the state shows them, in the order of
    ``until``: GPUs held until ``until`` (those a waiting start has reserved are claimed),
    targets started at ``until``."""
    if not state.transit:
        return []
    free = state.free_gpus
    # GPUs held or reserved per node = capacity - free - running; what targets reserve of the
    # held GPUs is not shown, so held GPUs are claimed greedily in the order of ``until``
    target_on: dict[int, int] = {}
    for tj in state.transit:
        for node, g in tj.target.alloc if tj.target is not None else ():
            target_on[node] = target_on.get(node, 0) + g
    held_on: dict[int, int] = {}
    for tj in state.transit:
        for node, g in tj.held.alloc if tj.held is not None else ():
            held_on[node] = held_on.get(node, 0) + g
    running_on = [0] * len(free)
    for run in state.running:
        for node, g in run.placement.alloc:
            running_on[node] += g
    footprint = {
        n: state.topology.nodes[n].gpus - free[n] - running_on[n]
        for n in set(target_on) | set(held_on)
    }
    claimed = {n: max(0, held_on.get(n, 0) + target_on.get(n, 0) - footprint[n]) for n in footprint}
    out: list[ResumedTransit] = []
    for tj in sorted(state.transit, key=lambda t: (t.until, t.job.job_id)):
        unclaimed: list[tuple[int, int]] = []
        if tj.held is not None:
            for node, g in tj.held.alloc:
                take = min(g, claimed.get(node, 0))
                claimed[node] = claimed.get(node, 0) - take
                if g - take:
                    unclaimed.append((node, g - take))
        left = float(work(tj.job, tj.attained_gpu_s, tj.job.duration))  # oracle: not exact here
        out.append(
            ResumedTransit(
                job=_with_work(tj.job, left),
                remaining_s=left,
                held=tj.held,
                target=tj.target,
                until=tj.until,
                attained_gpu_s=tj.attained_gpu_s,
                preemptions=tj.preemptions,
                migrations=1 if tj.held is not None and tj.target is not None else 0,
                unclaimed=tuple(unclaimed),
            )
        )
    return out


def fresh(policy: Policy, model: ContentionModel) -> Policy:
    """A copy of ``policy`` with its memory as of now (Tiresias' queues), sharing the
    contention model (immutable) instead of copying it."""
    return copy.deepcopy(policy, {id(model): model})


def jobs_in_system_s(sim: Simulator, t0: float, end: float, known: int) -> float:
    """Jobs-in-system seconds over ``[t0, end]``: ``known`` jobs in the system at ``t0``
    plus the arrivals, each until it ended (or ``end``)."""
    total = 0.0
    ended: set[int] = set()
    for rec in sim.records:
        ended.add(rec.job.job_id)
        total += min(rec.end, end) - max(rec.job.submit_time, t0)
    arrived = sim.arrived
    open_known = known - sum(1 for r in sim.records if r.job.submit_time <= t0)
    total += open_known * (end - t0)
    for job in arrived:
        if job.job_id not in ended:
            total += end - max(job.submit_time, t0)
    return total


def terminal_cost_s(sim: Simulator) -> float:
    """What the jobs in the fork at its time will still spend in the system, estimated from
    their remaining (drawn) work ``r`` and GPUs ``g``: in order of remaining GPU-seconds
    ``w = g r``, the ``k``-th job counts the larger of its own work left and the GPU-seconds
    of the ``k`` smallest over the cluster's GPUs (the pooled machine of
    ``cluster.bounds``). Each is a lower bound of something (the job's own time; the
    ``k``-th completion on the pooled cluster); per job, a draw far in a predictor's tail
    only weighs on its own term."""
    # (remaining GPU-seconds, remaining seconds)
    left = sorted((job.num_gpus * rem, rem) for job, rem in sim.work_left())
    capacity = float(sim.topology.total_gpus)
    total = cum = 0.0
    for w, rem in left:
        cum += w
        total += max(rem, cum / capacity)
    return total


def rollout_cost(
    sim: Simulator,
    first: Decision,
    base: Policy,
    horizon_s: float,
    *,
    complete: bool = False,
    terminal: bool = False,
    hold_s: float = 0.0,
) -> float:
    """Apply ``first`` at the fork's time, then follow ``base`` for ``horizon_s``; the
    jobs-in-system seconds over the horizon. ``complete``: ``first`` is one step of a
    decision point and the base finishes that decision point (decides again at the same
    time) before time moves on; a wait (``first.is_wait``) ends it at once. ``terminal``:
    the fork stops exactly at the horizon and ``terminal_cost_s`` is added. ``hold_s``: a
    wait holds that long before the base is asked again (see the module docstring)."""
    t0 = sim.time
    end = t0 + horizon_s
    state = sim.observe()
    known = len(state.pending) + len(state.running) + len(state.transit)
    hold_end = t0 + hold_s if first.is_wait and hold_s > 0 else t0
    stop = end if terminal else math.inf

    def apply(d: Decision) -> None:
        sim.apply(d)
        sim.wake_by(stop)  # a decision point at the horizon's end: the fork stops there

    apply(Decision(wake_at=hold_end) if hold_end > t0 else first)
    if complete and not first.is_wait:
        apply(base.decide(sim.observe()))
    try:
        while sim.advance():
            if sim.time >= end:
                break
            if sim.time < hold_end - 1e-9:
                apply(Decision(wake_at=hold_end))
            else:
                apply(base.decide(sim.observe()))
    except SimulationStalled:  # waiting on an idle cluster with nothing to arrive: all stay
        pass
    cost = jobs_in_system_s(sim, t0, end, known)
    return cost + terminal_cost_s(sim) if terminal else cost


def score_decisions(
    state: ClusterState,
    decisions: Sequence[Decision],
    base: Policy,
    model: ContentionModel,
    config: SimConfig | None = None,
    *,
    horizon_s: float = 6 * 3600.0,
    n: int = 6,
    seed: int = 0,
    belief: RunTimeBelief | None = None,
    arrivals: Arrivals | None = None,
    oracle: bool = False,
    complete: bool = False,
    terminal: bool = False,
    hold_s: float = 0.0,
) -> list[float]:
    """The mean jobs-in-system seconds of each decision continued by ``base`` (a fresh copy
    of it per rollout, its memory as of now) over ``n`` forked samples, the same samples
    (common random numbers) for every decision; ``terminal`` and ``hold_s`` as in
    ``rollout_cost``."""
    if n < 1:
        raise ValueError("n must be at least 1")
    if hold_s < 0:
        raise ValueError("hold_s must be non-negative")
    totals = [0.0] * len(decisions)
    config = config or SimConfig()
    cache = ForkCache()
    for s in range(n if not oracle else 1):
        memo: dict[int, float] = {}
        for i, d in enumerate(decisions):
            sim = fork(
                state,
                model,
                config,
                seed=seed,
                sample=s,
                belief=belief,
                arrivals=arrivals,
                horizon_s=horizon_s,
                oracle=oracle,
                memo=memo,
                cache=cache,
            )
            totals[i] += rollout_cost(
                sim,
                d,
                fresh(base, model),
                horizon_s,
                complete=complete,
                terminal=terminal,
                hold_s=hold_s,
            )
    runs = n if not oracle else 1
    return [t / runs for t in totals]
