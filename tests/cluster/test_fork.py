"""Forking the simulator from what a policy knows (``cluster.fork``): no true run time is
read, the same draws give the same scores (common random numbers), and the privileged
(oracle) fork reproduces the simulator it was forked from."""

from __future__ import annotations

from dataclasses import replace

import pytest

from linkwise.cluster.contention import AnalyticModel
from linkwise.cluster.domain import (
    ClusterState,
    Decision,
    Job,
    PendingJob,
    Placement,
    RunningJob,
    Start,
)
from linkwise.cluster.fork import (
    Arrivals,
    RunTimeBelief,
    fork,
    rollout_cost,
    score_decisions,
    terminal_cost_s,
)
from linkwise.cluster.mdp import MdpConfig, StepPolicyAdapter, candidates, decode
from linkwise.cluster.profiles import load_calibration
from linkwise.cluster.simulator.engine import Simulator
from linkwise.cluster.topology.spec import from_spec
from linkwise.datasets import synthetic
from linkwise.datasets.predictor import RuntimePredictor
from linkwise.policies.heuristics import make_policy

MODEL = AnalyticModel(load_calibration(None))
TOPO = from_spec("4x8,leaf=2,oversub=2")


def _job(i: int, gpus: int, dur: float, pred: float, submit: float = 0.0) -> Job:
    return Job(
        job_id=i,
        submit_time=submit,
        num_gpus=gpus,
        duration=dur,
        profile="bert",
        pred_s=pred,
        pred_hi_s=2 * pred,
    )


def _workload(n: int = 40, seed: int = 0) -> tuple[Job, ...]:
    history = synthetic.generate(200, seed=seed + 1, max_gpus=TOPO.total_gpus)
    jobs = synthetic.generate(n, seed=seed, max_gpus=TOPO.total_gpus, load_scale=4.0)
    return tuple(replace(j, profile="bert") for j in RuntimePredictor.fit(history).annotate(jobs))


def _midway(jobs: tuple[Job, ...], policy: str, steps: int) -> Simulator:
    """The simulator after ``steps`` decision points of ``policy``."""
    sim = Simulator(TOPO, jobs, MODEL)
    pol = make_policy(policy)
    for _ in range(steps):
        sim.apply(pol.decide(sim.observe()))
        assert sim.advance()
    return sim


def _twin(state: ClusterState, factor: float) -> ClusterState:
    """The same state with every true run time, remaining work and rate changed (what the
    simulator alone knows)."""
    return replace(
        state,
        pending=tuple(
            replace(p, job=replace(p.job, duration=p.job.duration * factor), remaining_s=1.0)
            for p in state.pending
        ),
        running=tuple(
            replace(
                r,
                job=replace(r.job, duration=r.job.duration * factor),
                remaining_s=r.remaining_s * factor + 7.0,
                rate=max(0.05, r.rate * 0.5),
            )
            for r in state.running
        ),
    )


def _fork_view(state: ClusterState, sample: int) -> tuple[object, ...]:
    sim = fork(state, MODEL, seed=3, sample=sample)
    s = sim.observe()
    return (
        s.free_gpus,
        tuple((r.job, r.placement, r.remaining_s, r.rate) for r in s.running),
        tuple((p.job, p.remaining_s) for p in s.pending),
    )


def test_fork_never_reads_true_run_times() -> None:
    state = _midway(_workload(), "sjf_bco", 25).observe()
    assert state.running and state.pending
    twin = _twin(state, 3.0)
    for sample in range(3):
        assert _fork_view(state, sample) == _fork_view(twin, sample)
    base = make_policy("sjf_bco")
    alts = [make_policy("qssf").decide(state), Decision()]
    a = score_decisions(state, alts, base, MODEL, horizon_s=4 * 3600, n=3, seed=1)
    b = score_decisions(twin, alts, base, MODEL, horizon_s=4 * 3600, n=3, seed=1)
    assert a == b


def test_common_random_numbers_and_samples_differ() -> None:
    state = _midway(_workload(), "sjf_bco", 25).observe()
    base = make_policy("sjf_bco")
    d = make_policy("qssf").decide(state)
    once = score_decisions(state, [d], base, MODEL, horizon_s=4 * 3600, n=2, seed=5)
    again = score_decisions(state, [d], base, MODEL, horizon_s=4 * 3600, n=2, seed=5)
    assert once == again
    views = {_fork_view(state, s)[2] for s in range(4)}
    assert len(views) > 1  # different samples draw different run times


def test_oracle_fork_reproduces_the_simulator() -> None:
    jobs = _workload(30)
    sim = _midway(jobs, "sjf_bco", 15)
    state = sim.observe()
    assert state.running and state.pending
    copy = fork(state, MODEL, oracle=True)
    pol = make_policy("sjf_bco")
    for s in (sim, copy):
        while True:
            s.apply(pol.decide(s.observe()))
            if not s.advance():
                break
    ends = {r.job.job_id: r.end for r in sim.records if r.end > state.time}
    forked = {r.job.job_id: r.end for r in copy.records}
    known = {p.job.job_id for p in state.pending} | {r.job.job_id for r in state.running}
    assert set(forked) == known
    for job_id in known:
        assert forked[job_id] == pytest.approx(ends[job_id], abs=1e-6)


def test_belief_conditions_on_time_run() -> None:
    job = _job(1, 8, 10.0, pred=3600.0)
    belief = RunTimeBelief()
    draws = [belief.total(job, 0.0, u) for u in (0.1, 0.5, 0.9)]
    assert draws[0] < draws[1] < draws[2]
    assert draws[1] == pytest.approx(3600.0, rel=1e-6)  # the median draw is pred_s
    assert draws[2] == pytest.approx(7200.0, rel=1e-6)  # the p90 draw is pred_hi_s
    assert all(belief.total(job, 20000.0, u) > 20000.0 for u in (0.01, 0.5, 0.99))
    limited = replace(job, time_limit=5000.0)
    assert belief.total(limited, 0.0, 0.99) == 5000.0
    with pytest.raises(ValueError, match="prediction"):
        belief.total(replace(job, pred_s=0.0, pred_hi_s=0.0), 0.0, 0.5)


def test_rollout_cost_counts_jobs_in_system() -> None:
    # one 8-GPU node, two jobs predicted (and believed, sigma ~ 0) at 1 h and 2 h
    topo = from_spec("1x8")
    a, b = (replace(_job(i, 8, 99.0, p), pred_hi_s=p) for i, p in ((1, 3600.0), (2, 7200.0)))
    state = ClusterState(
        time=0.0,
        topology=topo,
        free_gpus=(8,),
        running=(),
        pending=(PendingJob(a, remaining_s=99.0), PendingJob(b, remaining_s=99.0)),
    )
    narrow = RunTimeBelief(min_sigma=1e-9)
    fifo = make_policy("fifo")
    short_first = Decision(starts=(Start(1, Placement.of([(0, 8)])),))
    long_first = Decision(starts=(Start(2, Placement.of([(0, 8)])),))
    short = rollout_cost(fork(state, MODEL, belief=narrow), short_first, fifo, 10 * 3600.0)
    long = rollout_cost(fork(state, MODEL, belief=narrow), long_first, fifo, 10 * 3600.0)
    # short first: job 1 in the system 1 h, job 2 1 h waiting and 2 h running
    assert short == pytest.approx(4 * 3600.0, rel=1e-3)
    assert long == pytest.approx(5 * 3600.0, rel=1e-3)
    # a horizon shorter than the work clips it: both jobs in the system all along
    clipped = rollout_cost(fork(state, MODEL, belief=narrow), short_first, fifo, 1800.0)
    assert clipped == pytest.approx(2 * 1800.0, rel=1e-6)


def test_arrivals_are_common_and_counted() -> None:
    history = _workload(20)
    arrivals = Arrivals.from_history(history)
    a = arrivals.draw(100.0, 3600.0 * 6, seed=1, sample=0)
    assert a == arrivals.draw(100.0, 3600.0 * 6, seed=1, sample=0)
    assert a != arrivals.draw(100.0, 3600.0 * 6, seed=1, sample=1)
    assert all(100.0 < j.submit_time <= 100.0 + 6 * 3600 for j in a)
    state = _midway(_workload(), "sjf_bco", 10).observe()
    sim = fork(state, MODEL, arrivals=arrivals, horizon_s=6 * 3600)
    with_arrivals = rollout_cost(sim, Decision(), make_policy("sjf_bco"), 6 * 3600.0)
    sim = fork(state, MODEL, horizon_s=6 * 3600)
    without = rollout_cost(sim, Decision(), make_policy("sjf_bco"), 6 * 3600.0)
    assert with_arrivals > without


def test_transit_jobs_are_forked() -> None:
    jobs = _workload(30)
    sim = _midway(jobs, "sjf_bco", 15)
    state = sim.observe()
    victim: RunningJob = state.running[0]
    sim.apply(Decision(preempt=(victim.job.job_id,)))
    draining = sim.observe()
    assert draining.transit
    copy = fork(draining, MODEL)
    seen = copy.observe()
    assert seen.free_gpus == draining.free_gpus
    assert [t.job.job_id for t in seen.transit] == [victim.job.job_id]
    pol = make_policy("sjf_bco")
    while True:
        copy.apply(pol.decide(copy.observe()))
        if not copy.advance():
            break
    assert victim.job.job_id in {r.job.job_id for r in copy.records}


def test_one_step_completed_by_the_base_is_following_the_base() -> None:
    # an idle cluster and several jobs that fit: the base starts them all in one decision;
    # its first step, the rest of the decision point left to the base, is the same move
    jobs = tuple(replace(j, submit_time=0.0) for j in _workload(12) if j.num_gpus <= 8)[:5]
    sim = Simulator(TOPO, jobs, MODEL)
    state = sim.observe()
    for name in ("sjf_bco", "tiresias_las"):
        full = make_policy(name).decide(state)
        assert len(full.starts) > 1
        cands = candidates(state, MdpConfig(), MODEL)
        first = decode(cands, StepPolicyAdapter(make_policy(name)).act(cands))
        assert len(first.starts) == 1
        whole = rollout_cost(fork(state, MODEL), full, make_policy(name), 4 * 3600.0)
        stepped = rollout_cost(
            fork(state, MODEL), first, make_policy(name), 4 * 3600.0, complete=True
        )
        assert stepped == pytest.approx(whole, rel=1e-12)


def _split_contention_state() -> ClusterState:
    """4x8 in two leaves, oversubscribed: a split 8-GPU job (10 min of work left, believed
    exactly) crosses the spine; a 16-GPU job of 40 h is pending and fits now on 24 idle GPUs,
    its placement crossing the spine too (so it slows the short job a little)."""
    short = replace(_job(1, 8, 99.0, 4200.0), pred_hi_s=4200.0)
    long = replace(_job(2, 16, 99.0, 40 * 3600.0), pred_hi_s=40 * 3600.0)
    run = RunningJob(
        job=short,
        placement=Placement.of([(0, 4), (2, 4)]),
        start_time=-3600.0,
        remaining_s=600.0,
        rate=1.0,
        attained_gpu_s=8 * 3600.0,
        preemptions=0,
        since=0.0,
    )
    return ClusterState(
        time=0.0,
        topology=TOPO,
        free_gpus=(4, 8, 4, 8),
        running=(run,),
        pending=(PendingJob(long, remaining_s=99.0),),
    )


def test_terminal_cost_prices_what_the_horizon_leaves_out() -> None:
    # the old pricing's blind spot: the long job's start shows only as the short job's
    # contention inside the horizon, so leaving 24 GPUs idle looks (slightly) better
    state = _split_contention_state()
    fifo = make_policy("fifo")
    start = fifo.decide(state)
    assert [s.job_id for s in start.starts] == [2]
    narrow = RunTimeBelief(min_sigma=1e-9)
    kw = {"horizon_s": 3 * 3600.0, "n": 1, "belief": narrow}
    old = score_decisions(state, [start, Decision()], fifo, MODEL, **kw)
    assert old[1] < old[0]
    # with the work left at the horizon counted, idling costs about the 10 min it delays
    # the long job (its placement has the same rate once the short job is gone)
    new = score_decisions(state, [start, Decision()], fifo, MODEL, terminal=True, **kw)
    assert new[1] - new[0] > 5 * 60.0
    assert new[0] > old[0] + 30 * 3600.0  # the long job's ~37 h left are counted


def test_terminal_cost_counts_work_and_queueing() -> None:
    # one 8-GPU node, two 8-GPU jobs of 1 h pending: the first needs 1 h, the second waits
    # for it (2 h): 3 h. A 1-GPU job of 3 h (3 GPU-h, first) and an 8-GPU job of 1 h: the
    # first its own 3 h, the second the pooled 11 GPU-h over 8 GPUs, 1.375 h
    narrow = RunTimeBelief(min_sigma=1e-9)

    def pending(*shapes: tuple[int, float]) -> ClusterState:
        jobs = [replace(_job(i, g, 1.0, p), pred_hi_s=p) for i, (g, p) in enumerate(shapes, 1)]
        return ClusterState(
            time=0.0,
            topology=from_spec("1x8"),
            free_gpus=(8,),
            running=(),
            pending=tuple(PendingJob(j, remaining_s=1.0) for j in jobs),
        )

    two = fork(pending((8, 3600.0), (8, 3600.0)), MODEL, belief=narrow)
    assert terminal_cost_s(two) == pytest.approx(3 * 3600.0, rel=1e-6)
    mixed = fork(pending((8, 3600.0), (1, 3 * 3600.0)), MODEL, belief=narrow)
    assert terminal_cost_s(mixed) == pytest.approx(4.375 * 3600.0, rel=1e-6)


def test_a_held_wait_keeps_the_gpus_idle_through_completions() -> None:
    # one 8-GPU node busy for 10 more minutes; an 8-GPU job of 1 h waits. A wait until the
    # next event lets the base start it at 10 min; a wait held 30 min starts it at 30 min
    topo = from_spec("1x8")
    busy = replace(_job(1, 8, 99.0, 4200.0), pred_hi_s=4200.0)
    nxt = replace(_job(2, 8, 99.0, 3600.0), pred_hi_s=3600.0)
    run = RunningJob(
        job=busy,
        placement=Placement.of([(0, 8)]),
        start_time=-3600.0,
        remaining_s=600.0,
        rate=1.0,
        attained_gpu_s=8 * 3600.0,
        preemptions=0,
        since=0.0,
    )
    state = ClusterState(
        time=0.0,
        topology=topo,
        free_gpus=(0,),
        running=(run,),
        pending=(PendingJob(nxt, remaining_s=99.0),),
    )
    narrow = RunTimeBelief(min_sigma=1e-9)
    fifo = make_policy("fifo")
    at_next = rollout_cost(fork(state, MODEL, belief=narrow), Decision(), fifo, 3 * 3600.0)
    held = rollout_cost(
        fork(state, MODEL, belief=narrow), Decision(), fifo, 3 * 3600.0, hold_s=1800.0
    )
    assert at_next == pytest.approx((10 + 70) * 60.0, rel=1e-6)
    assert held == pytest.approx((10 + 90) * 60.0, rel=1e-6)
    with pytest.raises(ValueError, match="hold"):
        score_decisions(state, [Decision()], fifo, MODEL, n=1, hold_s=-1.0)
