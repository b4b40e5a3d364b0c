"""The simulator's restart model: draining, reservations, restore cost, lost work."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import pytest

from linkwise.cluster.contention import AnalyticModel
from linkwise.cluster.domain import ClusterState, Decision, Job, Placement, Start
from linkwise.cluster.profiles import Calibration, CommProfile
from linkwise.cluster.restart import (
    PROFILE_MODEL,
    SIA_RESTORE_S,
    RestartModel,
    parse_restart,
)
from linkwise.cluster.simulator.config import SimConfig
from linkwise.cluster.simulator.engine import Simulator
from linkwise.cluster.simulator.errors import InvalidDecision
from linkwise.cluster.simulator.run import simulate
from linkwise.cluster.topology.spec import from_spec

CAL = Calibration(
    profiles={
        "light": CommProfile("light", compute_s=0.3, grad_gb=0.0),
        "bert": CommProfile("bert", compute_s=0.3, grad_gb=0.0),
    },
    alpha=0.2,
    overhead_s=0.001,
    mix={"light": 1.0},
)
MODEL = AnalyticModel(CAL)  # no gradients: every placement runs at rate 1
GRACE = 30.0
RESTORE = 120.0  # Sia's bert
HONEST = SimConfig(restart=RestartModel.sia(grace_s=GRACE))


@dataclass
class Scripted:
    fn: Callable[[ClusterState], Decision]
    name: str = "scripted"
    seen: list[ClusterState] = field(default_factory=list)

    def decide(self, state: ClusterState) -> Decision:
        self.seen.append(state)
        return self.fn(state)


def _on(node: int, gpus: int) -> Placement:
    return Placement.of([(node, gpus)])


def _preempt_at_30(s: ClusterState) -> Decision:
    """Job 0 starts on node 0; job 1 arrives at 30 and takes its GPUs by preempting it."""
    if s.time == 30.0 and any(r.job.job_id == 0 for r in s.running):
        return Decision(starts=(Start(1, _on(0, 4)),), preempt=(0,))
    if s.pending and s.free_gpus[0] >= 4:
        return Decision((Start(s.pending[0].job.job_id, _on(0, 4)),))
    return Decision()


def test_a_preempted_job_pays_exactly_grace_plus_restore_and_holds_its_gpus_meanwhile() -> None:
    jobs = [Job(0, 0.0, 4, 100.0, "bert"), Job(1, 30.0, 4, 10.0, "light")]
    policy = Scripted(_preempt_at_30)
    res = simulate(from_spec("1x4"), jobs, MODEL, policy, HONEST)
    rec = {r.job.job_id: r for r in res.records}
    # job 1 waits for the grace (job 0 still holds node 0), then runs 10 s
    assert rec[1].first_start == pytest.approx(30.0 + GRACE)
    assert rec[1].end == pytest.approx(30.0 + GRACE + 10.0)
    # job 0: 30 s done, 70 s left, restarts at 70 and pays its restore first
    assert rec[0].preemptions == 1
    assert rec[0].end == pytest.approx(70.0 + RESTORE + 70.0)
    assert rec[0].restart_s == pytest.approx(GRACE + RESTORE)
    assert rec[0].run_s == pytest.approx(30.0 + GRACE + RESTORE + 70.0)
    assert rec[1].restart_s == 0.0
    # the start waited, reserved, in transit: no decision point saw node 0 free before 60
    assert all(s.free_gpus == (0,) for s in policy.seen if 30.0 < s.time < 30.0 + GRACE)


def test_the_gpus_of_a_draining_job_are_not_free_and_it_cannot_be_preempted_twice() -> None:
    jobs = [Job(0, 0.0, 4, 100.0, "bert"), Job(1, 0.0, 1, 1000.0, "light")]
    sim = Simulator(from_spec("2x4"), jobs, MODEL, HONEST)
    sim.apply(Decision((Start(0, _on(0, 4)), Start(1, _on(1, 1)))))
    sim.apply(Decision(preempt=(0,)))
    state = sim.observe()
    assert state.free_gpus == (0, 3)
    assert [r.job.job_id for r in state.running] == [1]
    (tr,) = state.transit
    assert tr.job.job_id == 0 and tr.draining and tr.held == _on(0, 4) and tr.target is None
    assert tr.until == pytest.approx(GRACE)
    with pytest.raises(InvalidDecision, match="not running"):
        sim.apply(Decision(preempt=(0,)))
    with pytest.raises(InvalidDecision, match="not running"):
        sim.apply(Decision(migrate=(Start(0, _on(1, 4)),)))
    with pytest.raises(InvalidDecision, match="not pending"):
        sim.apply(Decision((Start(0, _on(1, 3)),)))
    assert sim.advance()
    assert sim.time == pytest.approx(GRACE)
    state = sim.observe()
    assert state.free_gpus == (4, 3) and not state.transit
    assert [p.job.job_id for p in state.pending] == [0]
    assert state.pending[0].remaining_s == pytest.approx(100.0)
    assert state.pending[0].preemptions == 1


def test_a_migrated_job_restarts_on_its_target_after_the_grace_with_the_target_reserved() -> None:
    jobs = [Job(0, 0.0, 2, 100.0, "bert"), Job(1, 10.0, 3, 5.0, "light")]
    sim = Simulator(from_spec("2x4"), jobs, MODEL, HONEST)
    sim.apply(Decision((Start(0, _on(0, 2)),)))
    assert sim.advance() and sim.time == 10.0  # job 1 arrives
    assert not Decision(migrate=(Start(0, _on(1, 2)),)).is_wait
    sim.apply(Decision(migrate=(Start(0, _on(1, 2)),)))
    state = sim.observe()
    (tr,) = state.transit
    assert tr.held == _on(0, 2) and tr.target == _on(1, 2)
    assert tr.until == pytest.approx(10.0 + GRACE)
    assert state.free_gpus == (2, 2)  # 2 held on node 0, 2 reserved on node 1
    with pytest.raises(InvalidDecision, match="free"):  # node 1's other 2 are reserved
        sim.apply(Decision((Start(1, _on(1, 3)),)))
    sim.apply(Decision((Start(1, _on(0, 3)),)))  # 2 free + 1 of those job 0 drains: waits
    assert sim.observe().free_gpus == (0, 2)
    assert {t.job.job_id: t.until for t in sim.observe().transit} == {0: 40.0, 1: 40.0}
    while sim.advance():
        state = sim.observe()
        if any(r.job.job_id == 0 for r in state.running):
            run = next(r for r in state.running if r.job.job_id == 0)
            assert run.placement == _on(1, 2)
            assert run.start_time == pytest.approx(10.0 + GRACE)
            assert run.remaining_s == pytest.approx(90.0 + RESTORE)
            break
    while sim.advance():
        pass
    rec = {r.job.job_id: r for r in sim.records}
    assert rec[0].migrations == 1 and rec[0].preemptions == 0
    assert rec[0].end == pytest.approx(10.0 + GRACE + RESTORE + 90.0)
    assert rec[0].restart_s == pytest.approx(GRACE + RESTORE)
    assert rec[0].nodes == 1
    assert rec[1].first_start == pytest.approx(10.0 + GRACE) and rec[1].restart_s == 0.0


def test_a_migration_may_consolidate_onto_gpus_it_holds_itself() -> None:
    jobs = [Job(0, 0.0, 4, 100.0, "bert")]
    sim = Simulator(from_spec("2x4"), jobs, MODEL, HONEST)
    sim.apply(Decision((Start(0, Placement.of([(0, 2), (1, 2)])),)))
    sim.apply(Decision(migrate=(Start(0, _on(0, 4)),)))
    assert sim.observe().free_gpus == (0, 2)  # node 0: 2 held + 2 reserved; node 1: 2 held
    assert sim.advance() and sim.time == pytest.approx(GRACE)
    state = sim.observe()
    assert state.free_gpus == (0, 4)
    assert [r.placement for r in state.running] == [_on(0, 4)]


def test_without_checkpoint_on_signal_the_work_since_the_last_checkpoint_is_redone() -> None:
    restart = RestartModel(grace_s=GRACE, checkpoint_on_signal=False, checkpoint_interval_s=20.0)
    jobs = [Job(0, 0.0, 4, 100.0, "bert"), Job(1, 30.0, 4, 10.0, "light")]
    res = simulate(
        from_spec("1x4"), jobs, MODEL, Scripted(_preempt_at_30), SimConfig(restart=restart)
    )
    rec = {r.job.job_id: r for r in res.records}
    lost = 30.0 % 20.0  # checkpoints at 0 and 20 s: the last 10 s are lost
    assert rec[0].end == pytest.approx(70.0 + RESTORE + 70.0 + lost)
    assert rec[0].restart_s == pytest.approx(GRACE + RESTORE + lost)


def test_free_preemption_is_the_old_arithmetic() -> None:
    jobs = [Job(0, 0.0, 4, 100.0, "bert"), Job(1, 30.0, 4, 10.0, "light")]
    free = SimConfig(restart=RestartModel.free())
    res = simulate(from_spec("1x4"), jobs, MODEL, Scripted(_preempt_at_30), free)
    rec = {r.job.job_id: r for r in res.records}
    assert rec[1].first_start == 30.0 and rec[1].end == pytest.approx(40.0)
    assert rec[0].end == pytest.approx(110.0) and rec[0].restart_s == 0.0


def test_the_default_is_sia_per_profile_with_a_grace() -> None:
    model = SimConfig().restart
    assert model == RestartModel.sia() and not model.is_free and model.grace_s == 30.0
    for profile, measured in PROFILE_MODEL.items():
        assert model.restore_s(profile) == SIA_RESTORE_S[measured]
    assert model.restore_s("") == 30.0 and model.restore_s("unknown") == 30.0
    assert RestartModel.free().is_free and RestartModel.free().to_dict()["free_preemption"]
    assert "free" in RestartModel.free().describe()


def test_every_shipped_profile_maps_to_a_measured_model() -> None:
    from linkwise.cluster.profiles import load_calibration

    assert set(load_calibration().profiles) <= set(PROFILE_MODEL)


def test_parse_restart() -> None:
    assert parse_restart("sia") == RestartModel.sia()
    assert parse_restart("0").is_free
    assert parse_restart("0", 10.0) == RestartModel.constant(0.0, 10.0)
    assert parse_restart("60").restore_s("bert") == 60.0
    assert parse_restart("60", 5.0).grace_s == 5.0
    for bad in ("x", "-1", "inf", "nan"):
        with pytest.raises(ValueError, match="restart cost"):
            parse_restart(bad)


@pytest.mark.parametrize("spec", ["tiresias_las", "tiresias_las:order=submit", "srtf_oracle"])
def test_preemptive_policies_run_to_completion_under_the_honest_default(spec: str) -> None:
    from linkwise.cluster.profiles import assign_profiles, load_calibration
    from linkwise.policies.spec import PolicySpec

    calibration = load_calibration()
    sizes = [1, 2, 4, 8, 16, 3, 1, 12, 2, 8]
    jobs = assign_profiles(
        [Job(i, 60.0 * i, sizes[i % 10], 400.0 + 3000.0 * (i % 4)) for i in range(60)],
        calibration,
        seed=1,
    )
    policy = PolicySpec.parse(spec).build()
    topo = from_spec("4x8,leaf=2")
    honest = simulate(topo, jobs, AnalyticModel(calibration), policy, SimConfig())
    free = simulate(
        topo,
        jobs,
        AnalyticModel(calibration),
        PolicySpec.parse(spec).build(),
        SimConfig(restart=RestartModel.free()),
    )
    assert len(honest.records) == len(free.records) == len(jobs)
    preempted = [r for r in honest.records if r.preemptions]
    assert preempted, "the workload should make this policy preempt"
    model = RestartModel.sia()
    for r in honest.records:  # each restart costs its grace and (unless cut short) its restore
        restarts = r.preemptions + r.migrations
        full = restarts * (model.grace_s + model.restore_s(r.job.profile))
        assert restarts * model.grace_s - 1e-6 <= r.restart_s <= full + 1e-6
    assert sum(r.restart_s for r in honest.records) > 0
    assert all(r.restart_s == 0.0 for r in free.records)


def test_run_metrics_report_preemptions_per_job_and_restart_seconds() -> None:
    from linkwise.cluster.metrics import summarize

    jobs = [Job(0, 0.0, 4, 100.0, "bert"), Job(1, 30.0, 4, 10.0, "light")]
    res = simulate(from_spec("1x4"), jobs, MODEL, Scripted(_preempt_at_30), HONEST)
    m = summarize(res.records, total_gpus=4, events=res.events, wall_s=res.wall_s)
    assert m.preemptions == 1 and m.preemptions_per_job == pytest.approx(0.5)
    assert m.restart_s_per_job == pytest.approx((GRACE + RESTORE) / 2)
    assert m.migrations == 0
    assert {"preemptions_per_job", "restart_s_per_job", "migrations"} <= set(m.to_dict())
