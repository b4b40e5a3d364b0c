"""The simulator's invariants and its fluid contention arithmetic."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from linkwise.cluster.contention import AnalyticModel
from linkwise.cluster.domain import ClusterState, Decision, Job, Placement, Start
from linkwise.cluster.loop import drive
from linkwise.cluster.profiles import Calibration, CommProfile
from linkwise.cluster.restart import RestartModel
from linkwise.cluster.simulator.config import SimConfig
from linkwise.cluster.simulator.engine import Simulator
from linkwise.cluster.simulator.errors import InvalidDecision, SimulationStalled
from linkwise.cluster.simulator.run import simulate
from linkwise.cluster.topology.spec import from_spec

CAL = Calibration(
    profiles={
        "light": CommProfile("light", compute_s=0.3, grad_gb=0.01),
        "heavy": CommProfile("heavy", compute_s=0.1, grad_gb=1.0),
    },
    alpha=0.2,
    overhead_s=0.001,
    mix={"light": 1.0, "heavy": 1.0},
)
MODEL = AnalyticModel(CAL)


@dataclass(frozen=True)
class GreedyFirstFit:
    """A minimal test policy: start pending jobs in order wherever they fit, spreading."""

    name: str = "greedy"
    spread: bool = False

    def decide(self, state: ClusterState) -> Decision:
        free = list(state.free_gpus)
        starts = []
        for p in state.pending:
            need = p.job.num_gpus
            if need > sum(free):
                continue
            alloc: list[tuple[int, int]] = []
            left = list(free)
            while need:  # one GPU per node per pass when spreading, else all that fit
                for node, f in enumerate(left):
                    take = min(f, need, 1 if self.spread else need)
                    if take:
                        alloc.append((node, take))
                        left[node] -= take
                        need -= take
                    if not need:
                        break
            if need:
                continue
            for node, g in alloc:
                free[node] -= g
            starts.append(Start(p.job.job_id, Placement.of(alloc)))
        return Decision(tuple(starts))


@dataclass
class Scripted:
    """Returns the decisions a function gives, for targeted tests."""

    fn: Callable[[ClusterState], Decision]
    name: str = "scripted"
    seen: list[ClusterState] = field(default_factory=list)

    def decide(self, state: ClusterState) -> Decision:
        self.seen.append(state)
        return self.fn(state)


def _check_state(state: ClusterState) -> None:
    used = [0] * len(state.topology.nodes)
    for r in state.running:
        for node, g in r.placement.alloc:
            used[node] += g
    for node, n in enumerate(state.topology.nodes):
        assert used[node] + state.free_gpus[node] == n.gpus, "GPU accounting broken"
        assert state.free_gpus[node] >= 0
    running_ids = {r.job.job_id for r in state.running}
    assert len(running_ids) == len(state.running)
    assert not running_ids & {p.job.job_id for p in state.pending}


jobs_strategy = st.lists(
    st.tuples(
        st.floats(0, 5000),
        st.sampled_from([1, 1, 2, 4, 8, 16]),
        st.floats(10, 20000),
        st.sampled_from(["light", "heavy"]),
    ),
    min_size=1,
    max_size=40,
)


def _jobs(raw: list[tuple[float, int, float, str]]) -> list[Job]:
    return [Job(i, t, g, d, profile=p) for i, (t, g, d, p) in enumerate(raw)]


@settings(max_examples=60, deadline=None)
@given(raw=jobs_strategy, spread=st.booleans())
def test_invariants_hold_for_random_workloads(
    raw: list[tuple[float, int, float, str]], spread: bool
) -> None:
    jobs = _jobs(raw)
    topo = from_spec("4x8,leaf=2")
    sim = Simulator(topo, jobs, MODEL)
    policy = GreedyFirstFit(spread=spread)

    def check(state: ClusterState, decision: Decision) -> None:
        _check_state(state)

    drive(sim, policy, on_decision=check)
    records = sim.records
    assert sorted(r.job.job_id for r in records) == [j.job_id for j in jobs]  # each exactly once
    for r in records:
        assert r.run_s >= r.job.duration * (1 - 1e-9), "ran faster than isolated"
        assert r.first_start >= r.job.submit_time
        assert r.end >= r.first_start
    assert sim.done


def test_same_input_same_result() -> None:
    jobs = _jobs(
        [(i * 37.0 % 900, [1, 2, 4, 8][i % 4], 500.0 + 97 * i, "heavy") for i in range(60)]
    )
    topo = from_spec("4x8")
    a = simulate(topo, jobs, MODEL, GreedyFirstFit(spread=True))
    b = simulate(topo, jobs, MODEL, GreedyFirstFit(spread=True))
    assert [(r.job.job_id, r.end, r.run_s) for r in a.records] == [
        (r.job.job_id, r.end, r.run_s) for r in b.records
    ]
    assert a.events == b.events


def test_a_simulator_resumed_from_what_it_shows_continues_the_same() -> None:
    # ``from_state`` with the running and pending jobs as observed (progress as of their
    # ``since``), the free GPUs and the jobs still to arrive: the same end for every job
    jobs = _jobs(
        [(i * 37.0 % 900, [1, 2, 4, 8][i % 4], 500.0 + 97 * i, "heavy") for i in range(60)]
    )
    topo = from_spec("4x8")
    policy = GreedyFirstFit(spread=True)
    sim = Simulator(topo, jobs, MODEL)
    for _ in range(25):
        sim.apply(policy.decide(sim.observe()))
        assert sim.advance()
    state = sim.observe()
    assert any(r.placement.num_nodes > 1 for r in state.running) and state.pending
    resumed = Simulator.from_state(
        topo,
        MODEL,
        time=state.time,
        free_gpus=state.free_gpus,
        pending=state.pending,
        running=state.running,
        arrivals=[j for j in jobs if j.submit_time > state.time],
    )
    assert resumed.observe().free_gpus == state.free_gpus
    assert [r.job.job_id for r in resumed.observe().running] == [
        r.job.job_id for r in state.running
    ]
    drive(sim, policy)
    drive(resumed, policy)
    before = {r.job.job_id for r in sim.records if r.end <= state.time}
    ends = {r.job.job_id: r.end for r in sim.records if r.job.job_id not in before}
    assert {r.job.job_id: r.end for r in resumed.records} == pytest.approx(ends, rel=1e-9)
    assert {j.job_id for j in resumed.arrived} == {
        j.job_id for j in jobs if j.submit_time > state.time
    }


def test_two_split_rings_sharing_nics_follow_the_fluid_model() -> None:
    topo = from_spec("4x8")
    a = Job(0, 0.0, 8, 1000.0, profile="heavy")
    b = Job(1, 0.0, 8, 3000.0, profile="heavy")
    split = Placement.of([(0, 4), (1, 4)])
    policy = Scripted(
        lambda s: (
            Decision(
                tuple(
                    Start(
                        p.job.job_id, split if p.job.job_id == 0 else Placement.of([(0, 4), (1, 4)])
                    )
                    for p in s.pending
                )
            )
            if s.pending
            else Decision()
        )
    )
    res = simulate(topo, [a, b], MODEL, policy)
    shared = MODEL.rates(topo, [(a, split), (b, split)])
    alone_b = MODEL.rates(topo, [(b, split)])[0]
    assert shared[0] < alone_b <= 1.0  # they slow each other down
    end = {r.job.job_id: r.end for r in res.records}
    t_a = a.duration / shared[0]
    assert end[0] == pytest.approx(t_a)
    done_b = shared[1] * t_a
    assert end[1] == pytest.approx(t_a + (b.duration - done_b) / alone_b)


def test_single_node_jobs_do_not_contend() -> None:
    topo = from_spec("2x8")
    jobs = [Job(0, 0.0, 4, 100.0, "heavy"), Job(1, 0.0, 4, 100.0, "heavy")]
    res = simulate(topo, jobs, MODEL, GreedyFirstFit())
    assert [r.end for r in res.records] == pytest.approx([100.0, 100.0])


def test_invalid_decisions_are_refused() -> None:
    topo = from_spec("2x4")
    sim = Simulator(topo, [Job(0, 0.0, 4, 10.0, "light"), Job(1, 0.0, 4, 10.0, "light")], MODEL)
    with pytest.raises(InvalidDecision, match="asks 4 GPUs"):
        sim.apply(Decision((Start(0, Placement.of([(0, 2)])),)))
    with pytest.raises(InvalidDecision, match="not pending"):
        sim.apply(Decision((Start(7, Placement.of([(0, 4)])),)))
    sim.apply(Decision((Start(0, Placement.of([(0, 4)])),)))
    with pytest.raises(InvalidDecision, match="free: 0"):  # the same GPUs twice
        sim.apply(Decision((Start(1, Placement.of([(0, 4)])),)))
    with pytest.raises(InvalidDecision, match="not running"):
        sim.apply(Decision(preempt=(1,)))


def test_jobs_bigger_than_the_cluster_are_refused_up_front() -> None:
    with pytest.raises(ValueError, match="more than the cluster"):
        Simulator(from_spec("2x4"), [Job(0, 0.0, 16, 10.0, "light")], MODEL)


def test_a_policy_that_never_starts_anything_is_reported() -> None:
    sim = Simulator(from_spec("2x4"), [Job(0, 0.0, 1, 10.0, "light")], MODEL)
    with pytest.raises(SimulationStalled, match="never starts"):
        drive(sim, Scripted(lambda s: Decision()))


def test_preemption_keeps_progress_and_charges_the_restart_cost() -> None:
    topo = from_spec("1x4")
    job = Job(0, 0.0, 4, 100.0, "light")
    other = Job(1, 30.0, 4, 10.0, "light")

    def decide(s: ClusterState) -> Decision:
        if s.time == 30.0 and s.running:  # the newcomer preempts the long job
            return Decision(starts=(Start(1, Placement.of([(0, 4)])),), preempt=(0,))
        if s.pending and s.total_free_gpus >= 4:
            return Decision((Start(s.pending[0].job.job_id, Placement.of([(0, 4)])),))
        return Decision()

    policy = Scripted(decide)
    res = simulate(
        topo,
        [job, other],
        MODEL,
        policy,
        SimConfig(restart=RestartModel.constant(5.0, grace_s=0.0)),
    )
    rec = {r.job.job_id: r for r in res.records}
    assert rec[1].end == pytest.approx(40.0)
    assert rec[0].preemptions == 1
    assert rec[0].end == pytest.approx(40.0 + 70.0 + 5.0)
    assert rec[0].run_s == pytest.approx(30.0 + 75.0)
    requeued = next(s for s in policy.seen if s.time == 40.0).pending[0]
    assert requeued.attained_gpu_s == pytest.approx(4 * 30.0)
    assert requeued.remaining_s == pytest.approx(70.0)


def test_ticks_add_decision_points_while_jobs_wait() -> None:
    topo = from_spec("1x4")
    jobs = [Job(0, 0.0, 4, 100.0, "light"), Job(1, 1.0, 4, 10.0, "light")]
    plain = simulate(topo, jobs, MODEL, GreedyFirstFit())
    ticked = simulate(topo, jobs, MODEL, GreedyFirstFit(), SimConfig(tick_s=10.0))
    assert ticked.events > plain.events
    assert [r.end for r in ticked.records] == [r.end for r in plain.records]
