"""Heuristic schedulers: valid, deterministic decisions on random states, and each rule."""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable
from dataclasses import replace
from typing import ClassVar

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from linkwise.cluster.contention import NoContention
from linkwise.cluster.domain import (
    ClusterState,
    Decision,
    Job,
    PendingJob,
    Placement,
    Policy,
    RunningJob,
    Shape,
    Start,
    Topology,
    requested_shape,
)
from linkwise.cluster.loop import drive
from linkwise.cluster.placement.generators import apply_placement, best_fit, first_fit, least_busy
from linkwise.cluster.placement.slurm_select import slurm_select
from linkwise.cluster.restart import RestartModel
from linkwise.cluster.simulator.config import SimConfig
from linkwise.cluster.simulator.engine import Simulator
from linkwise.cluster.topology.spec import from_spec
from linkwise.policies import heuristics as heur
from linkwise.policies.composed import Composed
from linkwise.policies.heuristics import (
    POLICIES,
    make_policy,
    policy_names,
)
from linkwise.policies.parts import backfill as backfill_module
from linkwise.policies.parts.backfill import OVERDUE_S, runtime_estimate
from linkwise.policies.parts.orders import Las

# every registered policy with its defaults, plus variants that exercise other branches
VARIANTS: list[Policy] = [make_policy(name) for name in policy_names()] + [
    heur.backfill(max_job_test=1),
    heur.sjf_bco(kappa=1, lam=math.inf),
    heur.sjf_bco(kappa=2, lam=1.5),
    heur.tiresias_las(thresholds=(50.0, 500.0, 5000.0), starve_factor=0.0),
    heur.tiresias_las(thresholds=(10.0,), starve_factor=2.0, running_first=False, order="submit"),
    heur.tiresias_las(order="submit", thresholds=(3600.0,), starve_factor=10.0),
    heur.seeded_random(seed=1, start_prob=1.0),
    heur.seeded_random(seed=2, start_prob=0.0),
]

GENERATORS = (first_fit, best_fit)
LIMITS = st.sampled_from([0.0, 50.0, 5_000.0, 100_000.0])  # time limits (0: none)


@st.composite
def states(draw: st.DrawFn) -> ClusterState:
    """A consistent cluster state: running jobs hold exactly the GPUs not free."""
    nodes = draw(st.integers(1, 10))
    gpus = draw(st.integers(1, 8))
    leaf = draw(st.integers(1, 4))
    topo = from_spec(f"{nodes}x{gpus},leaf={leaf}")
    now = draw(st.floats(0.0, 50_000.0))
    free = [n.gpus for n in topo.nodes]
    running: list[RunningJob] = []
    job_id = 0
    for _ in range(draw(st.integers(0, 8))):
        if sum(free) == 0:
            break
        size = draw(st.integers(1, sum(free)))
        if draw(st.booleans()):
            placement = least_busy(topo, free, size, [0] * nodes)
        else:
            placement = draw(st.sampled_from(GENERATORS))(topo, free, size)
        assert placement is not None
        apply_placement(free, placement)
        submit = draw(st.floats(0.0, now))
        since = draw(st.floats(submit, now))
        running.append(
            RunningJob(
                job=Job(job_id, submit, size, draw(st.floats(1.0, 1e5)), time_limit=draw(LIMITS)),
                placement=placement,
                start_time=since,
                remaining_s=draw(st.floats(0.0, 1e5)),
                rate=draw(st.sampled_from([0.0, 0.3, 0.7, 1.0])),
                attained_gpu_s=draw(st.floats(0.0, 1e5)),
                since=since,
            )
        )
        job_id += 1
    pending: list[PendingJob] = []
    for _ in range(draw(st.integers(0, 12))):
        size = draw(st.integers(1, topo.total_gpus + 2))  # some never fit
        duration = draw(st.floats(1.0, 1e5))
        pending.append(
            PendingJob(
                job=Job(job_id, draw(st.floats(0.0, now)), size, duration, time_limit=draw(LIMITS)),
                remaining_s=draw(st.floats(1.0, duration)),
                attained_gpu_s=draw(st.sampled_from([0.0, 30.0, 3000.0, 60_000.0])),
            )
        )
        job_id += 1
    pending.sort(key=lambda p: (p.job.submit_time, p.job.job_id))
    return ClusterState(
        time=now,
        topology=topo,
        free_gpus=tuple(free),
        running=tuple(running),
        pending=tuple(pending),
    )


def check_valid(state: ClusterState, decision: Decision) -> None:
    """Starts are distinct pending jobs of the right size on GPUs free after the preemptions."""
    pending = {p.job.job_id: p for p in state.pending}
    running = {r.job.job_id: r for r in state.running}
    assert len(set(decision.preempt)) == len(decision.preempt)
    assert set(decision.preempt) <= set(running)
    ids = [s.job_id for s in decision.starts]
    assert len(set(ids)) == len(ids)
    assert set(ids) <= set(pending)
    free = list(state.free_gpus)
    for job_id in decision.preempt:
        for node, g in running[job_id].placement.alloc:
            free[node] += g
    for s in decision.starts:
        assert s.placement.num_gpus == pending[s.job_id].job.num_gpus
        apply_placement(free, s.placement)  # raises if the GPUs are not free
    assert all(0 <= f <= n.gpus for f, n in zip(free, state.topology.nodes, strict=True))


def fresh_copy(state: ClusterState) -> ClusterState:
    return replace(state)


@settings(max_examples=120, deadline=None)
@given(states())
def test_every_policy_makes_valid_deterministic_decisions(state: ClusterState) -> None:
    for policy in VARIANTS:
        decision = policy.decide(state)
        check_valid(state, decision)
        assert policy.decide(fresh_copy(state)) == decision, policy.name
        if not getattr(policy, "preemptive", False):
            assert not decision.preempt and not decision.migrate


def _earliest_start(state: ClusterState, job: Job, started: list[tuple[float, Placement]]) -> float:
    """When ``job`` fits in its shape, by the time-limit estimates, once ``started`` run too."""
    free = list(state.free_gpus)
    for _, placement in started:
        apply_placement(free, placement)
    releases = [
        (max(state.time + OVERDUE_S, r.start_time + runtime_estimate(r.job)), r.placement)
        for r in state.running
    ] + started
    shape = requested_shape(job, state.topology.max_gpus_per_node)
    t = state.time
    for end, placement in [(state.time, Placement(())), *sorted(releases, key=lambda r: r[0])]:
        t = end
        for node, g in placement.alloc:
            free[node] += g
        if slurm_select(state.topology, free, shape) is not None:
            return t
    return math.inf


@settings(max_examples=200, deadline=None)
@given(states())
def test_backfill_never_delays_the_head_job(state: ClusterState) -> None:
    decision = heur.backfill().decide(state)
    started = {s.job_id: s.placement for s in decision.starts}
    total = state.topology.total_gpus
    queue = [p for p in state.pending if p.job.num_gpus <= total]
    heads = [i for i, p in enumerate(queue) if p.job.job_id not in started]
    if not heads:
        return
    h = heads[0]
    head = queue[h]
    # the prefix before the head was started in order (the main scheduler)
    assert all(p.job.job_id in started for p in queue[:h])
    prefix = [(state.time + runtime_estimate(p.job), started[p.job.job_id]) for p in queue[:h]]
    backfilled = [
        (state.time + runtime_estimate(p.job), started[p.job.job_id])
        for p in queue[h + 1 :]
        if p.job.job_id in started
    ]
    without = _earliest_start(state, head.job, prefix)
    assert without > state.time  # the head did not fit now
    assert _earliest_start(state, head.job, prefix + backfilled) <= without


@settings(max_examples=100, deadline=None)
@given(states())
def test_backfill_starts_jobs_only_in_their_shape(state: ClusterState) -> None:
    pending = {p.job.job_id: p.job for p in state.pending}
    for s in heur.backfill().decide(state).starts:
        shape = requested_shape(pending[s.job_id], state.topology.max_gpus_per_node)
        assert s.placement.num_nodes == shape.nodes
        assert {g for _, g in s.placement.alloc} == {shape.gpus_per_node}


@settings(max_examples=100, deadline=None)
@given(states())
def test_fifo_starts_a_prefix_of_the_queue(state: ClusterState) -> None:
    decision = heur.fifo().decide(state)
    queue = [p.job.job_id for p in state.pending if p.job.num_gpus <= state.topology.total_gpus]
    ids = [s.job_id for s in decision.starts]
    assert ids == queue[: len(ids)]
    if len(ids) < len(queue):
        blocked = state.pending[[p.job.job_id for p in state.pending].index(queue[len(ids)])]
        used = sum(s.placement.num_gpus for s in decision.starts)
        assert blocked.job.num_gpus > state.total_free_gpus - used


# -- targeted scenarios ---------------------------------------------------------------------


def _running(
    job_id: int, alloc: tuple[tuple[int, int], ...], remaining: float, **kw: float
) -> RunningJob:
    placement = Placement(alloc)
    limit = kw.get("limit", remaining)  # the time limit: by default it ends when the work does
    return RunningJob(
        job=Job(
            job_id, kw.get("submit", 0.0), placement.num_gpus, max(remaining, 1.0), time_limit=limit
        ),
        placement=placement,
        start_time=kw.get("since", 0.0),
        remaining_s=remaining,
        rate=1.0,
        attained_gpu_s=kw.get("attained", 0.0),
        since=kw.get("since", 0.0),
    )


def _pending(
    job_id: int,
    gpus: int,
    remaining: float,
    submit: float = 0.0,
    attained: float = 0.0,
    limit: float | None = None,
) -> PendingJob:
    """A queued job; its time limit is its run time unless given (0: no limit)."""
    job = Job(job_id, submit, gpus, remaining, time_limit=remaining if limit is None else limit)
    return PendingJob(job, remaining, attained_gpu_s=attained)


def _state(
    spec: str, running: list[RunningJob], pending: list[PendingJob], now: float = 0.0
) -> ClusterState:
    topo = from_spec(spec)
    free = [n.gpus for n in topo.nodes]
    for r in running:
        apply_placement(free, r.placement)
    return ClusterState(now, topo, tuple(free), tuple(running), tuple(pending))


def test_fifo_blocks_behind_the_head_while_backfill_fills_around_it() -> None:
    # 12 of 16 GPUs busy until t=100 by its limit; the head wants both nodes whole
    running = [_running(0, ((0, 8), (1, 4)), remaining=100.0)]
    pending = [
        _pending(1, 16, 1000.0, submit=1.0),
        _pending(2, 2, 500.0, submit=2.0),  # its limit runs past t=100: delays the head
        _pending(3, 2, 50.0, submit=3.0),  # limit ends at t=50: harmless
    ]
    state = _state("2x8", running, pending)
    assert heur.fifo().decide(state).starts == ()
    decision = heur.backfill().decide(state)
    assert decision.starts == (Start(3, Placement(((1, 2),))),)
    check_valid(state, decision)


def test_backfill_estimates_from_time_limits_not_run_times() -> None:
    # the running job's limit ends at t=100, its true remaining work at t=10; job 2's
    # limit (50) fits before the reservation, its true run time (500) would not
    running = [_running(0, ((0, 8), (1, 4)), remaining=10.0, limit=100.0)]
    pending = [_pending(1, 16, 1000.0, submit=1.0), _pending(2, 2, 500.0, 2.0, limit=50.0)]
    assert [s.job_id for s in heur.backfill().decide(_state("2x8", running, pending)).starts] == [2]
    # a job without a limit is believed to run for the default limit
    running = [_running(0, ((0, 8), (1, 4)), remaining=10.0, limit=100.0)]
    unlimited = [_pending(1, 16, 1000.0, 1.0), _pending(2, 2, 20.0, 2.0, limit=0.0)]
    state = _state("2x8", running, unlimited)
    assert heur.backfill().decide(state).starts == ()  # 2 is believed to end in 7 days
    short = heur.backfill(default_limit_s=50.0).decide(state)
    assert [s.job_id for s in short.starts] == [2]


def test_backfill_reserves_whole_nodes_for_the_head() -> None:
    # the head (14 GPUs = 2 nodes x 7) gets both nodes at t=100: a job running past that
    # may not use the 2 GPUs it leaves spare there (Slurm reserves nodes, not GPUs) ...
    running = [_running(0, ((0, 8), (1, 4)), remaining=100.0)]
    pending = [_pending(1, 14, 1000.0, submit=1.0), _pending(2, 2, 500.0, submit=2.0)]
    assert heur.backfill().decide(_state("2x8", running, pending)).starts == ()
    # ... but may run on a node outside the reservation
    decision = heur.backfill().decide(_state("3x8", running, pending))
    assert decision.starts == (Start(2, Placement(((2, 2),))),)


def test_backfill_reserves_for_every_job_it_plans() -> None:
    # the head (2 nodes x 8) waits for t=100; job 2 (one whole node) is planned after
    # the head's reservation, at t=1100 on node 0; job 3 may not run into that
    running = [_running(0, ((0, 8), (1, 4)), remaining=100.0)]
    pending = [
        _pending(1, 16, 1000.0, submit=1.0),
        _pending(2, 8, 100.0, submit=2.0),
        _pending(3, 4, 2000.0, submit=3.0),
        _pending(4, 4, 50.0, submit=4.0),
    ]
    decision = heur.backfill().decide(_state("3x8", running, pending))
    assert [s.job_id for s in decision.starts] == [2, 4]  # 2 fits now on node 2


def test_backfill_starts_a_job_only_in_its_shape() -> None:
    # 4 GPUs free on each of two nodes: a 4-GPU job starts on one, an 8-GPU job
    # (one node x 8) does not spread over two
    running = [_running(0, ((0, 4), (1, 4)), remaining=100.0)]
    pending = [_pending(1, 8, 10.0, submit=1.0), _pending(2, 4, 50.0, submit=2.0)]
    state = _state("2x8", running, pending)
    assert heur.backfill().decide(state).starts == (Start(2, Placement(((0, 4),))),)
    assert heur.fifo().decide(state).starts == (Start(1, Placement(((0, 4), (1, 4)))),)


def test_backfill_counts_the_head_prefix_started_in_the_same_decision() -> None:
    # job 1 starts now on 4 GPUs for 300 s; the head (16) can only start when it ends
    pending = [
        _pending(1, 4, 300.0, submit=1.0),
        _pending(2, 16, 100.0, submit=2.0),
        _pending(3, 4, 200.0, submit=3.0),  # ends before t=300: fine
        _pending(4, 8, 400.0, submit=4.0),  # would hold GPUs past t=300
    ]
    decision = heur.backfill().decide(_state("2x8", [], pending))
    assert [s.job_id for s in decision.starts] == [1, 3]


def test_backfill_scans_at_most_max_job_test_jobs() -> None:
    running = [_running(0, ((0, 8), (1, 4)), remaining=100.0)]
    pending = [_pending(1, 16, 1000.0, submit=1.0), _pending(2, 8, 10.0, submit=2.0)]
    pending += [_pending(3, 1, 10.0, submit=3.0)]
    state = _state("2x8", running, pending)
    assert [s.job_id for s in heur.backfill().decide(state).starts] == [3]
    assert heur.backfill(max_job_test=1).decide(state).starts == ()


def test_sjf_bco_starts_the_smallest_jobs_first() -> None:
    pending = [_pending(1, 6, 100.0, 0.0), _pending(2, 2, 100.0, 1.0), _pending(3, 3, 100.0, 2.0)]
    state = _state("1x8", [], pending)
    assert [s.job_id for s in heur.sjf_bco().decide(state).starts] == [2, 3]
    assert [s.job_id for s in heur.fifo().decide(state).starts] == [1, 2]


def test_sjf_bco_packs_small_jobs_and_spreads_large_ones() -> None:
    # node 0 runs one job (4 GPUs free); nodes 1-3 are idle
    running = [_running(0, ((0, 4),), remaining=100.0)]
    pending = [_pending(1, 2, 100.0, 0.0), _pending(2, 16, 100.0, 1.0)]
    decision = heur.sjf_bco().decide(_state("4x8", running, pending))
    placements = {s.job_id: s.placement for s in decision.starts}
    assert placements[1] == Placement(((0, 2),))  # onto the busy server
    assert placements[2] == Placement(((1, 8), (2, 8)))  # two idle servers


def test_sjf_bco_lambda_bounds_how_spread_a_large_job_is() -> None:
    # every node has 4 GPUs free: a 16-GPU job would need 4 nodes where 2 could hold it
    running = [_running(i, ((i, 4),), remaining=100.0) for i in range(4)]
    state = _state("4x8", running, [_pending(9, 16, 100.0)])
    assert heur.sjf_bco().decide(state).starts == ()
    assert heur.sjf_bco(lam=1.5).decide(state).starts == ()
    (start,) = heur.sjf_bco(lam=2.0).decide(state).starts
    assert start.placement.num_nodes == 4
    with pytest.raises(ValueError):
        heur.sjf_bco(lam=0.5)


def test_tiresias_preempts_a_long_running_job_for_a_new_one() -> None:
    # job 0 has had 8 GPUs x 3600 s > threshold: queue 1; job 1 is new: queue 0
    running = [_running(0, ((0, 8),), remaining=1e4, attained=8 * 3600.0, since=3700.0)]
    state = _state("1x8", running, [_pending(1, 4, 100.0, submit=3650.0)], now=3700.0)
    decision = heur.tiresias_las().decide(state)
    assert decision.preempt == (0,)
    assert decision.starts == (Start(1, Placement(((0, 4),))),)
    check_valid(state, decision)


def test_tiresias_keeps_fifo_inside_a_queue_and_never_preempts_for_nothing() -> None:
    # both in queue 0: the running job keeps its GPUs, the later one waits
    running = [_running(0, ((0, 8),), remaining=1e4, attained=80.0, since=100.0)]
    state = _state("1x8", running, [_pending(1, 4, 100.0, submit=50.0)], now=110.0)
    assert heur.tiresias_las().decide(state).is_wait
    # a queue-0 job that cannot be admitted gets nobody preempted, even a queue-1 job
    running = [
        _running(0, ((0, 8),), remaining=1e4, attained=80.0, since=100.0),
        _running(2, ((1, 4),), remaining=1e4, attained=1e5, since=100.0),
    ]
    state = _state("2x8", running, [_pending(1, 12, 100.0, submit=50.0)], now=110.0)
    assert heur.tiresias_las().decide(state).is_wait


# the earlier stateless Tiresias-LAS with its earlier defaults (``order="submit"``)
LEGACY = heur.tiresias_las(order="submit", thresholds=(3600.0,), starve_factor=10.0)


def _tiresias_rounds(jobs: list[Job], thresholds: tuple[float, ...], order: str) -> list[tuple]:
    """(time, started, preempted) of every decision that did something, in the simulator."""
    rounds: list[tuple] = []

    def record(state: ClusterState, d: Decision) -> None:
        if not d.is_wait:
            rounds.append((state.time, [s.job_id for s in d.starts], list(d.preempt)))

    # free restarts: the test is about the queue order, not what a preemption costs
    sim = Simulator(from_spec("1x4"), jobs, NoContention(), SimConfig(restart=RestartModel.free()))
    drive(sim, heur.tiresias_las(thresholds=thresholds, order=order), on_decision=record)
    return rounds


def test_tiresias_reference_order_round_robins_demoted_jobs() -> None:
    # three 4-GPU jobs on 4 GPUs, thresholds 100 and 10000 GPU-s: each job is demoted 25 s
    # after it starts (a threshold crossing is an event) and goes to the tail of queue 1,
    # behind the jobs already waiting there, so A runs again before C continues
    jobs = [Job(0, 0.0, 4, 1000.0), Job(1, 10.0, 4, 1000.0), Job(2, 30.0, 4, 1000.0)]
    rounds = _tiresias_rounds(jobs, (100.0, 10_000.0), "entry")
    assert rounds[:4] == [
        (0.0, [0], []),
        (25.0, [1], [0]),
        (50.0, [2], [1]),
        (75.0, [0], [2]),  # the tail of queue 1 was [A, B, C]: A first
    ]
    # the earlier order keeps the running job first inside a queue: C keeps its GPUs
    assert _tiresias_rounds(jobs, (100.0, 10_000.0), "submit")[3][0] > 75.0


def test_tiresias_asks_to_decide_when_a_job_crosses_its_threshold() -> None:
    running = [_running(0, ((0, 4),), remaining=1e4, attained=20.0, since=10.0)]
    state = _state("1x4", running, [], now=10.0)
    assert heur.tiresias_las(thresholds=(100.0, 1000.0)).decide(state).wake_at == 30.0  # 80 / 4
    with pytest.raises(ValueError, match="order=submit"):
        heur.tiresias_las(starve_factor=10.0)


def test_tiresias_defaults_are_the_reference_dlas_gpu() -> None:
    las = heur.tiresias_las().order
    assert isinstance(las, Las) and las.thresholds == (3250.0, 7200.0)
    assert las.starve_factor == 0.0 and las.mode == "entry"


def test_tiresias_starvation_guard_promotes_a_long_waiting_job() -> None:
    # job 1 ran 1000 s on 8 GPUs (queue 1) and has waited 20000 s since: promoted to queue 0,
    # it takes the GPUs from job 2 (queue 1: 8 x 1000 GPU-s in its 1000 s in the system)
    running = [
        _running(2, ((0, 8),), remaining=1e4, attained=8 * 1000.0, submit=20_000.0, since=21_000.0)
    ]
    pending = [_pending(1, 8, 100.0, submit=0.0, attained=8 * 1000.0)]
    state = _state("1x8", running, pending, now=21_000.0)
    decision = LEGACY.decide(state)
    assert decision.preempt == (2,)
    assert [s.job_id for s in decision.starts] == [1]
    # without the guard both are in queue 1, where the running job keeps its GPUs
    assert heur.tiresias_las(order="submit", thresholds=(3600.0,)).decide(state).is_wait


def test_tiresias_guard_keeps_a_promoted_job_running_a_while() -> None:
    # ran 1000 s, waited 6000 s: a pending job would not be promoted (< 10x), a running one
    # stays in queue 0 (>= 5x) and keeps its GPUs against a queue-1 job waiting behind it
    tiresias = LEGACY.order
    assert isinstance(tiresias, Las)
    assert tiresias.queue_of(8000.0, 8, 6000.0) == 1
    assert tiresias.queue_of(8000.0, 8, 6000.0, running=True) == 0
    assert tiresias.queue_of(8000.0, 8, 4000.0, running=True) == 1


def test_tiresias_running_first_avoids_preempting_within_a_queue() -> None:
    # both in queue 0; the pending job is older: only a pure (queue, submit) order preempts
    running = [_running(2, ((0, 8),), remaining=1e4, attained=80.0, submit=90.0, since=100.0)]
    state = _state("1x8", running, [_pending(1, 8, 100.0, submit=10.0)], now=110.0)
    assert LEGACY.decide(state).is_wait
    decision = heur.tiresias_las(
        order="submit", thresholds=(3600.0,), starve_factor=10.0, running_first=False
    ).decide(state)
    assert decision.preempt == (2,)
    assert [s.job_id for s in decision.starts] == [1]


def _tiresias_by_the_rule(tiresias: Composed, state: ClusterState) -> Decision:
    """Tiresias' decision the plain way: rank every job by (queue, running first, submit, id)."""
    policy = tiresias.order
    assert isinstance(policy, Las)
    now = state.time
    ranked: list[tuple[tuple[int, int, float, int], RunningJob | PendingJob]] = []
    for r in state.running:
        job, attained = r.job, r.attained_at(now)
        waited = now - job.submit_time - attained / job.num_gpus
        q = policy.queue_of(attained, job.num_gpus, waited, running=True)
        ranked.append(((q, 0, job.submit_time, job.job_id), r))
    for p in state.pending:
        job, attained = p.job, p.attained_gpu_s
        waited = now - job.submit_time - attained / job.num_gpus
        q = policy.queue_of(attained, job.num_gpus, waited)
        ranked.append(((q, int(policy.running_first), job.submit_time, job.job_id), p))
    ranked.sort(key=lambda item: item[0])
    left = state.total_free_gpus + sum(r.job.num_gpus for r in state.running)
    kept: set[int] = set()
    admitted: list[PendingJob] = []
    for _, job_state in ranked:
        if job_state.job.num_gpus <= left:
            left -= job_state.job.num_gpus
            if isinstance(job_state, RunningJob):
                kept.add(job_state.job.job_id)
            else:
                admitted.append(job_state)
    if not admitted:
        return Decision()
    preempted = [r for r in state.running if r.job.job_id not in kept]
    free = list(state.free_gpus)
    for r in preempted:
        for node, g in r.placement.alloc:
            free[node] += g
    starts = []
    for p in admitted:
        placement = best_fit(state.topology, free, p.job.num_gpus)
        assert placement is not None
        apply_placement(free, placement)
        starts.append(Start(p.job.job_id, placement))
    return Decision(tuple(starts), tuple(r.job.job_id for r in preempted))


@settings(max_examples=150, deadline=None)
@given(states())
def test_tiresias_fast_ranking_matches_the_plain_rule(state: ClusterState) -> None:
    # decide() admits queue by queue without sorting every job; it must decide exactly as
    # the full (queue, running first, submit, id) sort does
    for policy in (
        LEGACY,
        heur.tiresias_las(thresholds=(50.0, 500.0, 5000.0), order="submit"),
        heur.tiresias_las(
            thresholds=(10.0, 3000.0), starve_factor=2.0, running_first=False, order="submit"
        ),
        heur.tiresias_las(thresholds=(100.0,), running_first=False, order="submit"),
    ):
        assert policy.decide(state) == _tiresias_by_the_rule(policy, state)


def test_tiresias_accepts_command_line_thresholds() -> None:
    assert heur.tiresias_las(thresholds=100).order.thresholds == (100.0,)  # type: ignore[arg-type,attr-defined]
    assert heur.tiresias_las(thresholds="100;1000").order.thresholds == (100.0, 1000.0)  # type: ignore[arg-type,attr-defined]
    with pytest.raises(ValueError):
        heur.tiresias_las(thresholds=(100.0, 50.0))


def test_best_fit_consolidates_and_keeps_scanning() -> None:
    running = [_running(0, ((1, 5),), remaining=100.0)]
    pending = [_pending(1, 12, 100.0, 0.0), _pending(2, 3, 100.0, 1.0)]
    state = _state("2x8", running, pending)
    assert heur.best_fit().decide(state).starts == (Start(2, Placement(((1, 3),))),)
    assert heur.fifo().decide(state).starts == ()
    fifo_state = _state("2x8", running, pending[1:])
    assert heur.fifo().decide(fifo_state).starts == (Start(2, Placement(((0, 3),))),)


def test_random_policy_is_seeded_and_never_stalls_an_idle_cluster() -> None:
    pending = [_pending(i, 1 + i % 4, 100.0, float(i)) for i in range(12)]
    state = _state("4x8", [], pending, now=5.0)
    a, b = heur.seeded_random(seed=0).decide(state), heur.seeded_random(seed=0).decide(state)
    assert a == b
    decisions = {heur.seeded_random(seed=s).decide(state) for s in range(8)}
    assert len(decisions) > 1
    # even when it draws nothing, an idle cluster gets one job started
    assert len(heur.seeded_random(start_prob=0.0).decide(state).starts) == 1


def test_registry() -> None:
    assert policy_names(oracles=False) == [
        "fifo", "backfill", "backfill_switches", "best_fit", "sjf_bco", "tiresias_las",
        "random", "tiresias_consolidated", "deepshare",
    ]  # fmt: skip
    assert "qssf_preemptive" in policy_names(predictions=True, oracles=False)
    for name in policy_names(predictions=True):
        policy = make_policy(name)
        assert isinstance(policy, Policy)
        assert policy.name == name
    assert make_policy("sjf_bco", kappa=4, lam=2.0) == heur.sjf_bco(kappa=4, lam=2.0)
    with pytest.raises(ValueError, match="known: fifo, backfill"):
        make_policy("nope")
    with pytest.raises(TypeError):
        make_policy("fifo", bogus=1)
    with pytest.raises(TypeError):
        POLICIES["x"] = heur.fifo  # type: ignore[index]


def test_policies_run_a_small_trace_to_completion_in_the_simulator() -> None:
    from linkwise.cluster.contention import AnalyticModel
    from linkwise.cluster.profiles import assign_profiles, load_calibration
    from linkwise.cluster.simulator.config import SimConfig
    from linkwise.cluster.simulator.run import simulate

    calibration = load_calibration()
    topo = from_spec("4x8,leaf=2")
    sizes = [1, 2, 4, 8, 16, 3, 1, 12, 2, 32, 6, 1]
    jobs = assign_profiles(
        [Job(i, 40.0 * i, sizes[i % len(sizes)], 300.0 + 97.0 * (i % 7)) for i in range(40)],
        calibration,
        seed=3,
    )
    for policy in VARIANTS:
        result = simulate(
            topo,
            jobs,
            AnalyticModel(calibration),
            policy,
            SimConfig(restart=RestartModel.constant(5.0)),
        )
        assert len(result.records) == len(jobs), policy.name


# ----------------------------------------------------------------------------- fast backfill


def _reference_earliest(
    plan: backfill_module._Plan,
    shape: Shape,
    est: float,
    after: float,
    horizon: float,
    accept: Callable[[Placement], bool] | None = None,
) -> tuple[float, Placement] | None:
    """Backfill's ``_Plan.earliest`` written plainly (every candidate time recomputed from the
    releases and reservations): the specification the fast search is tested against."""
    times = plan.times
    avail = list(plan.free)
    releases = plan.releases
    k = 0
    per, need = shape.gpus_per_node, shape.nodes
    for t in times[bisect.bisect_left(times, after) :]:
        if t > horizon:
            return None
        while k < len(releases) and releases[k][0] <= t:
            for node, g in releases[k][1].alloc:
                avail[node] += g
            k += 1
        end = t + est
        blocked = {n for s, e, nodes in plan.reserved if s <= end and e > t for n in nodes}
        usable = sum(1 for i, f in enumerate(avail) if f >= per and i not in blocked)
        if usable < need:
            continue
        masked = [0 if i in blocked else f for i, f in enumerate(avail)] if blocked else avail
        placement = slurm_select(plan.topo, masked, shape)
        if placement is not None and (accept is None or accept(placement)):
            return t, placement
    return None


class _CheckedPlan(backfill_module._Plan):
    """The fast plan, each answer checked against the plain search (``reference_earliest``)
    and a plain set-based ``all_free_nodes_reserved``."""

    __slots__ = ()
    calls: ClassVar[list[int]] = [0, 0]  # earliest, answers that found a start

    def earliest(
        self,
        shape: Shape,
        est: float,
        after: float,
        horizon: float,
        accept: Callable[[Placement], bool] | None = None,
    ) -> tuple[float, Placement] | None:
        got = super().earliest(shape, est, after, horizon, accept)
        assert got == _reference_earliest(self, shape, est, after, horizon, accept)
        _CheckedPlan.calls[0] += 1
        _CheckedPlan.calls[1] += got is not None
        return got

    def all_free_nodes_reserved(self, by: float) -> bool:
        soon: set[int] = set()
        for start, _, nodes in self.reserved:
            if start <= by:
                soon |= nodes
        plain = all(f == 0 or n in soon for n, f in enumerate(self.free))
        assert super().all_free_nodes_reserved(by) == plain
        return plain


def _busy_workload(seed: int, n: int, topo: Topology) -> list[Job]:
    """Jobs arriving faster than they finish: some with time limits, some with only run-time
    predictions, some with neither, some asking for a node count."""
    rng = np.random.default_rng(seed)
    per_node = topo.max_gpus_per_node
    jobs = []
    t = 0.0
    for i in range(n):
        t += float(rng.exponential(60.0))
        gpus = int(rng.choice([1, 1, 2, 4, 8, 16, 32]))
        gpus = min(gpus, per_node * len(topo.nodes) // 2)
        duration = float(rng.lognormal(7.0, 1.5)) + 1.0
        kind = i % 4
        limit = float(np.ceil(duration * rng.uniform(1.0, 3.0))) if kind == 0 else 0.0
        hi = duration * float(rng.uniform(0.3, 3.0)) if kind in (1, 2) else 0.0
        nodes = 2 if kind == 2 and gpus % 2 == 0 and 2 <= gpus <= 2 * per_node else 0
        jobs.append(
            Job(i, t, gpus, duration, time_limit=limit, pred_s=hi / 2, pred_hi_s=hi, nodes=nodes)
        )
    return jobs


@pytest.mark.parametrize(
    ("spec", "policy"),
    [
        ("4x4", heur.backfill()),  # one leaf switch: best fit by free GPUs
        ("8x8,leaf=2", heur.backfill(resolution_s=0.0)),  # tree: fewest leaf switches
        ("12x8,leaf=4,agg=2", heur.backfill(max_job_test=7, window_s=3 * 3600.0)),
        ("6x4,leaf=3", heur.backfill(default_limit_s=3600.0, window_s=86400.0)),
        # --switches=1@10min: a waiting job's search accepts only starts within one leaf
        ("8x4,leaf=4", heur.backfill_switches(1, 600.0, resolution_s=0.0)),
    ],
)
def test_fast_backfill_plans_exactly_as_the_plain_search(
    spec: str, policy: Composed, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every backfill search of whole seeded runs: the fast plan (bitmasks, cached
    availability steps and blocked windows) answers as the plain search does."""
    monkeypatch.setattr(backfill_module, "_Plan", _CheckedPlan)
    _CheckedPlan.calls = [0, 0]
    topo = from_spec(spec)
    jobs = _busy_workload(seed=len(spec), n=300, topo=topo)
    sim = Simulator(topo, jobs, NoContention())
    drive(sim, policy)
    assert len(sim.records) == len(jobs)
    searches, found = _CheckedPlan.calls
    assert searches > 500 and 0 < found < searches  # both outcomes, many times
