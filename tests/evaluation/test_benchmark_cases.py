"""Benchmark cases and rollouts: warm starts (the simulator with jobs already running, the
backlog read from accounting, cases and rollouts that start from it) and policies that fail a
case (recorded, left out, the others still compared)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from linkwise.cluster.contention import AnalyticModel
from linkwise.cluster.domain import Decision, Job, Placement
from linkwise.cluster.profiles import load_calibration
from linkwise.cluster.simulator.run import simulate
from linkwise.cluster.topology.spec import from_spec
from linkwise.datasets.backlog import Backlog, backlog_from_store, warm_jobs
from linkwise.datasets.ingest import ingest_job_runs
from linkwise.datasets.rollouts import Window
from linkwise.datasets.store import open_store
from linkwise.evaluation.benchmark import (
    BenchTask,
    EvalCase,
    PolicyRef,
    case_jobs,
    case_running,
    run_task,
)
from linkwise.policies.heuristics import make_policy
from linkwise.policies.spec import PolicySpec
from linkwise.testkit.history import completed_run

MODEL = AnalyticModel(load_calibration())
TOPO = from_spec("2x8,leaf=2")  # nodes gpu1, gpu2
T = 1.7e9


def test_running_jobs_hold_their_gpus_until_their_remaining_work_is_done() -> None:
    held = (Job(100, 0.0, 8, 500.0, profile="bert"), Placement.of([(0, 8)]))
    arrivals = [Job(1, 10.0, 16, 100.0, profile="bert"), Job(2, 20.0, 8, 50.0, profile="bert")]
    res = simulate(TOPO, arrivals, MODEL, make_policy("fifo"), running=[held])
    recs = {r.job.job_id: r for r in res.records}
    assert recs[100].first_start == 0.0 and recs[100].end == pytest.approx(500.0)
    # the 16-GPU job needs node 0, held until 500 s; FIFO keeps job 2 behind it
    assert recs[1].first_start == pytest.approx(500.0)
    assert recs[2].first_start >= recs[1].end - 1e-9


def test_running_jobs_that_do_not_fit_are_refused_clearly() -> None:
    a = (Job(1, 0.0, 8, 10.0, profile="bert"), Placement.of([(0, 8)]))
    b = (Job(2, 0.0, 4, 10.0, profile="bert"), Placement.of([(0, 4)]))
    with pytest.raises(ValueError, match="initial running jobs do not fit"):
        simulate(TOPO, [], MODEL, make_policy("fifo"), running=[a, b])
    with pytest.raises(ValueError, match="unique"):
        simulate(
            TOPO, [Job(1, 0.0, 1, 1.0, profile="bert")], MODEL, make_policy("fifo"), running=[a]
        )


def test_backlog_from_store_splits_running_and_pending(tmp_path: Path) -> None:
    t = T + 1000.0
    runs = [
        completed_run(1, T, T + 100, T + 5000, {"gpu1": 8}),  # running at t: 4000 s left
        completed_run(2, T + 10, T + 200, T + 3000, {"gpu2": 4}),  # running at t: 2000 s left
        completed_run(3, T + 300, T + 3000, T + 4000, {"gpu2": 4}),  # pending at t, 1000 s of work
        completed_run(4, T + 50, T + 60, T + 900, {"gpu2": 4}),  # ended before t: not in it
        completed_run(5, T + 2000, T + 2000, T + 2500, {"gpu2": 4}),  # submitted after t
        completed_run(6, T + 20, T + 500, T + 2000, {"gpu1": 2}),  # over-commits gpu1 (bad log)
    ]
    with open_store(tmp_path / "s.duckdb") as con:
        ingest_job_runs(con, runs, source="test")
        b = backlog_from_store(con, TOPO, None, t)
    running = {j.job_id: (j, p) for j, p in b.running}
    assert set(running) == {1, 2}
    assert running[1][0].duration == pytest.approx(4000.0)
    assert running[1][1] == Placement.of([(0, 8)])
    assert running[2][0].duration == pytest.approx(2000.0)
    assert [(j.job_id, j.duration) for j in b.pending] == [(3, 1000.0)]
    assert b.skipped == {"over-committed GPUs": 1}
    assert b.to_json()["running_gpus"] == 12


def test_warm_case_measures_window_and_pending_jobs_but_not_running_ones() -> None:
    backlog = Backlog(
        time=T,
        running=((Job(7, T - 10, 8, 3600.0), Placement.of([(0, 8)])),),
        pending=(Job(8, T - 5, 8, 100.0),),
    )
    window = Window(0, T, T + 600, (Job(1, T + 60, 16, 100.0), Job(2, T + 120, 4, 100.0)))
    cold = EvalCase(window=window, seed=0, topology=TOPO, block_s=0.0)
    warm = EvalCase(window=window, seed=0, topology=TOPO, block_s=0.0, backlog=backlog)
    assert [j.job_id for j in case_jobs(cold)] == [0, 1]
    warm_ids = [j.job_id for j in case_jobs(warm)]
    assert warm_ids == [0, 1, 2]  # the pending backlog job follows the window's own
    assert [j.job_id for j, _ in case_running(warm)] == [3]
    running, pending = warm_jobs(backlog, first_id=2)
    assert pending[0].submit_time == 0.0 and running[0][0].submit_time == 0.0

    ref = PolicyRef.of(PolicySpec.parse("fifo"))
    cold_res = run_task(BenchTask(ref, cold))
    warm_res = run_task(BenchTask(ref, warm))
    assert cold_res.job_ids == (0, 1) and warm_res.job_ids == (0, 1, 2)
    # node 0 is held for an hour: the 16-GPU window job queues behind the backlog
    assert warm_res.metrics["avg_jct_s"] > cold_res.metrics["avg_jct_s"]
    assert max(warm_res.jct_s) > 3600.0 - 120.0


def test_evaluate_refuses_a_warm_start_without_accounting(tmp_path: Path) -> None:
    from linkwise.pipelines.evaluate import evaluate

    trace = tmp_path / "t.csv"
    trace.write_text("job_id,submit_time,num_gpus,duration\n1,0,1,10\n")
    with pytest.raises(ValueError, match="warm_start needs the accounting store"):
        evaluate(
            [PolicySpec.parse("fifo")],
            trace=trace,
            warm_start=True,
            out_dir=tmp_path / "e",
            log=False,
        )


class _Waiter:
    """A policy that never starts anything: it stalls the simulator."""

    name = "waiter"

    def decide(self, state: object) -> Decision:
        return Decision()


def test_a_stalling_policy_is_recorded_as_failed_and_the_others_still_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import linkwise.evaluation.benchmark as bm
    from linkwise.evaluation.report import write_report

    real = bm.make_bench_policy

    def make(scenario: object, spec: PolicySpec, tracking_uri: str | None = None) -> object:
        return _Waiter() if spec.heuristic == "waiter" else real(scenario, spec, tracking_uri)

    monkeypatch.setattr(bm, "make_bench_policy", make)
    window = Window(0, T, T + 600, (Job(1, T + 60, 8, 100.0), Job(2, T + 120, 4, 100.0)))
    cases = bm.make_cases([window], [0, 1], TOPO, block_s=0.0)
    bench = bm.run_benchmark(
        [PolicySpec.parse("fifo"), PolicySpec(heuristic="waiter"), PolicySpec.parse("best_fit")],
        cases,
    )
    assert bench.policies == ("fifo", "best_fit")
    assert {r.policy for r in bench.results} == {"fifo", "best_fit"}
    assert [(f.policy, f.case_id) for f in bench.failures] == [
        ("waiter", "w0/s0"),
        ("waiter", "w0/s1"),
    ]
    assert "SimulationStalled" in bench.failures[0].error
    report = write_report(bench, tmp_path / "r", baseline="fifo", n_boot=50)
    assert report.context["failed"]["waiter"]["cases"] == 2
    text = (tmp_path / "r" / "report.md").read_text()
    assert "Failed policies" in text and "| waiter | 2 |" in text
    assert bm.load_benchmark(tmp_path / "r").failures == bench.failures
    with pytest.raises(ValueError, match="baseline 'waiter' failed"):
        write_report(bench, tmp_path / "r2", baseline="waiter", n_boot=50)


def test_a_warm_started_rollout_sees_the_backlog_from_its_first_step() -> None:
    from linkwise.cluster.mdp import MdpConfig, make_spec
    from linkwise.datasets.rollouts import RolloutTask, rollout

    backlog = Backlog(
        time=T,
        running=((Job(7, T - 10, 8, 3600.0), Placement.of([(0, 8)])),),
        pending=(Job(8, T - 5, 4, 100.0),),
    )
    window = Window(0, T, T + 600, (Job(1, T + 60, 8, 100.0), Job(2, T + 120, 4, 100.0)))
    cold = rollout(RolloutTask(PolicySpec.parse("fifo"), 0.0, 0, window, TOPO, block_s=0.0))
    warm = rollout(
        RolloutTask(PolicySpec.parse("fifo"), 0.0, 0, window, TOPO, block_s=0.0, backlog=backlog)
    )
    spec = make_spec(MdpConfig())
    running = spec.feature_names.index("g.running_log")
    assert warm["obs"][0][running] > 0.0  # the backlog's job runs from the first step
    assert warm["time"][0] == 0.0 and cold["time"][0] == 60.0
    # the window's 8-GPU job waits for node 0's backlog job or takes node 1 after job 8 ends:
    # either way the warm episode accrues more jobs-in-system time than the cold one
    assert sum(warm["reward"]) < sum(cold["reward"])


def test_a_case_predictor_annotates_window_and_backlog_jobs_and_qssf_needs_it() -> None:
    from linkwise.datasets.predictor import RuntimePredictor
    from linkwise.evaluation.benchmark import make_cases, run_benchmark
    from linkwise.policies.heuristics import MissingPredictions

    history = [Job(100 + i, T - 5000 + i, 4, 300.0 + 10 * i) for i in range(20)]
    predictor = RuntimePredictor.fit(history, until=T)
    backlog = Backlog(
        time=T,
        running=((Job(7, T - 10, 8, 3600.0), Placement.of([(0, 8)])),),
        pending=(Job(8, T - 5, 8, 100.0),),
    )
    window = Window(0, T, T + 600, (Job(1, T + 60, 16, 100.0), Job(2, T + 120, 4, 100.0)))
    (case,) = make_cases([window], [0], TOPO, block_s=0.0, predictor=predictor)
    case = dataclasses.replace(case, backlog=backlog)
    assert all(j.predicted for j in case_jobs(case))
    assert all(j.predicted for j, _ in case_running(case))
    assert all(j.duration in (100.0, 3600.0) for j in case_jobs(case))  # truth untouched
    res = run_task(BenchTask(PolicyRef.of(PolicySpec.parse("qssf")), case))
    assert res.job_ids == (0, 1, 2)
    bare = EvalCase(window=window, seed=0, topology=TOPO, block_s=0.0)
    with pytest.raises(MissingPredictions, match="--history"):
        run_benchmark([PolicySpec.parse("fifo"), PolicySpec.parse("qssf")], [bare])
