"""QSSF (Helios) on predicted GPU time, and the oracle ceilings on the true run time."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from linkwise.cluster.contention import AnalyticModel, NoContention
from linkwise.cluster.domain import ClusterState, Job, PendingJob, Placement, RunningJob
from linkwise.cluster.placement.generators import apply_placement
from linkwise.cluster.profiles import assign_profiles, load_calibration
from linkwise.cluster.restart import RestartModel
from linkwise.cluster.simulator.config import SimConfig
from linkwise.cluster.simulator.run import simulate
from linkwise.cluster.topology.spec import from_spec
from linkwise.policies import heuristics as heur
from linkwise.policies.heuristics import (
    ORACLE_POLICIES,
    MissingPredictions,
    make_policy,
    policy_names,
)
from linkwise.policies.spec import PolicySpec


def _pending(
    job_id: int, gpus: int, dur: float, pred: float = 0.0, submit: float = 0.0
) -> PendingJob:
    job = Job(job_id, submit, gpus, dur, pred_s=pred, pred_hi_s=pred)
    return PendingJob(job, dur)


def _state(spec: str, pending: list[PendingJob], running: Any = ()) -> ClusterState:
    topo = from_spec(spec)
    free = [n.gpus for n in topo.nodes]
    for r in running:
        apply_placement(free, r.placement)
    return ClusterState(0.0, topo, tuple(free), tuple(running), tuple(pending))


def test_registry_marks_oracles_and_prediction_policies() -> None:
    assert {"sjf_bco_oracle", "srtf_oracle"} == ORACLE_POLICIES

    def spec(text: str) -> PolicySpec:
        return PolicySpec.parse(text)

    assert spec("sjf_bco_oracle").is_oracle and spec("srtf_oracle").is_oracle
    assert spec(" srtf_oracle").is_oracle and spec("sjf_bco_oracle:lam=2").is_oracle
    assert not spec("sjf_bco").is_oracle and not spec("qssf").is_oracle
    assert not spec("model:./x").is_oracle
    assert spec("qssf:lam=1.5").needs_predictions and not spec("sjf_bco").needs_predictions
    assert "qssf" not in policy_names() and "qssf" in policy_names(predictions=True)
    assert not ORACLE_POLICIES & set(policy_names(oracles=False))
    for name in ("qssf", "sjf_bco_oracle", "srtf_oracle"):
        assert make_policy(name).name == name
    with pytest.raises(ValueError, match="lam"):
        heur.qssf(lam=0.5)


def test_qssf_orders_by_predicted_gpu_time_not_size_nor_truth() -> None:
    # one node of 4 GPUs: 4 GPUs x 10 s predicted (40) beats 1 GPU x 100 s predicted (100),
    # whatever the true run times say
    pending = [_pending(1, 1, 5.0, pred=100.0), _pending(2, 4, 900.0, pred=10.0, submit=1.0)]
    state = _state("1x4", pending)
    assert [s.job_id for s in heur.qssf().decide(state).starts] == [2]
    assert [s.job_id for s in heur.sjf_bco().decide(state).starts] == [1]
    # the oracle reads the truth: 1 x 5 s first
    assert heur.sjf_bco_oracle().decide(state).starts[0].job_id == 1


def test_qssf_refuses_jobs_without_predictions_and_names_history() -> None:
    state = _state("1x4", [_pending(1, 1, 5.0)])
    with pytest.raises(MissingPredictions, match="--history"):
        heur.qssf().decide(state)
    assert isinstance(MissingPredictions("x"), ValueError)  # the CLI's exit 2


def _workload() -> list[Job]:
    sizes = [1, 2, 4, 8, 16, 3, 1, 12, 2, 6, 1]
    jobs = [Job(i, 40.0 * i, sizes[i % len(sizes)], 300.0 + 97.0 * (i % 7)) for i in range(40)]
    return list(assign_profiles(jobs, load_calibration(), seed=3))


def test_qssf_with_equal_predictions_is_sjf_bco() -> None:
    # equal predictions: GPU time orders by size, then submit time, as SJF-BCO does; the
    # placement step is the same code, so every job starts at the same time, same place
    topo = from_spec("4x8,leaf=2")
    jobs = [replace(j, pred_s=600.0, pred_hi_s=900.0) for j in _workload()]
    model = AnalyticModel(load_calibration())
    a = simulate(topo, jobs, model, heur.qssf()).records
    b = simulate(topo, jobs, model, heur.sjf_bco()).records
    key = sorted((r.job.job_id, r.first_start, r.end) for r in a)
    assert key == sorted((r.job.job_id, r.first_start, r.end) for r in b)


def test_srtf_oracle_preempts_a_long_job_for_a_short_arrival() -> None:
    topo = from_spec("1x1")
    jobs = [Job(0, 0.0, 1, 100.0), Job(1, 10.0, 1, 5.0)]
    free = SimConfig(restart=RestartModel.free())
    run = simulate(topo, jobs, NoContention(), heur.srtf_oracle(), free)
    recs = {r.job.job_id: r for r in run.records}
    assert recs[1].end == pytest.approx(15.0)
    assert recs[0].end == pytest.approx(105.0) and recs[0].preemptions == 1
    # the honest default: job 0 drains 30 s first, then restarts with 30 s of restore
    srtf = heur.srtf_oracle()
    recs = {r.job.job_id: r for r in simulate(topo, jobs, NoContention(), srtf).records}
    assert recs[1].end == pytest.approx(10.0 + 30.0 + 5.0)
    assert recs[0].end == pytest.approx(45.0 + 30.0 + 90.0) and recs[0].preemptions == 1


def test_srtf_oracle_keeps_a_job_shorter_than_the_arrival() -> None:
    run = RunningJob(
        Job(0, 0.0, 2, 50.0), Placement(((0, 2),)), 0.0, remaining_s=20.0, rate=1.0, since=0.0
    )
    state = _state("1x2", [_pending(1, 2, 30.0)], [run])
    decision = heur.srtf_oracle().decide(state)
    assert decision.starts == () and decision.preempt == ()


def test_oracles_beat_their_same_information_versions_on_average() -> None:
    topo = from_spec("2x4,leaf=2")
    jobs = _workload()
    jobs = [replace(j, num_gpus=min(j.num_gpus, 4)) for j in jobs]
    model = AnalyticModel(load_calibration())

    def avg(policy: object) -> float:
        recs = simulate(topo, jobs, model, policy).records  # type: ignore[arg-type]
        return sum(r.jct for r in recs) / len(recs)

    assert avg(heur.srtf_oracle()) <= avg(heur.sjf_bco())
    assert avg(heur.sjf_bco_oracle()) <= avg(heur.sjf_bco())


def test_srtf_oracle_never_preempts_for_a_start_its_span_bound_refuses() -> None:
    # 3x4, two GPUs busy on every node; an 8-GPU job of 1 s ranks first and is admitted by
    # count (R3 would be preempted), but after freeing node 2 it still spans 3 nodes > 2
    def run(job_id: int, node: int) -> RunningJob:
        job = Job(job_id, 0.0, 2, 100.0)
        return RunningJob(job, Placement(((node, 2),)), 0.0, remaining_s=100.0, rate=1.0)

    state = _state("3x4", [_pending(9, 8, 1.0)], [run(1, 0), run(2, 1), run(3, 2)])
    assert heur.srtf_oracle().decide(state) == heur.srtf_oracle().decide(state)
    assert heur.srtf_oracle().decide(state).is_wait  # nothing placeable: nobody preempted
    spread = heur.srtf_oracle(lam=float("inf")).decide(state)  # no bound: it starts, R3 makes room
    assert [s.job_id for s in spread.starts] == [9] and spread.preempt == (3,)
