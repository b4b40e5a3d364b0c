"""Preemptions per job and restart seconds in every row; free preemption said so."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from linkwise.cli import main
from linkwise.cluster.restart import RestartModel
from linkwise.evaluation.columns import TABLES
from linkwise.policies.spec import PolicySpec


def _simulate_json(capsys: pytest.CaptureFixture[str], *extra: str) -> dict[str, object]:
    argv = ["simulate", "--policy", "tiresias_las", "--jobs", "120", "--cluster", "4x8"]
    assert main([*argv, "--json", *extra]) == 0
    row: dict[str, object] = json.loads(capsys.readouterr().out)
    return row


def test_simulate_json_rows_carry_the_restart_cost_and_say_when_preemption_is_free(
    capsys: pytest.CaptureFixture[str],
) -> None:
    honest = _simulate_json(capsys)
    assert honest["restart"] == "sia" and honest["free_preemption"] is False
    free = _simulate_json(capsys, "--restart-cost", "0")
    assert free["restart"] == "free" and free["free_preemption"] is True
    assert free["restart_s_per_job"] == 0.0
    for row in (honest, free):
        assert row["preemptions_per_job"] == pytest.approx(row["preemptions"] / row["jobs"])
    assert honest["preemptions"] > 0 and honest["restart_s_per_job"] > 0  # type: ignore[operator]


def test_the_text_output_says_preemption_is_free(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["simulate", "--policy", "fifo", "--jobs", "30", "--cluster", "4x8"]
    assert main([*argv, "--restart-cost", "0"]) == 0
    assert "preemption is free" in capsys.readouterr().out
    assert main(argv) == 0
    assert "Sia's measured cost per profile, grace 30 s" in capsys.readouterr().out


def test_a_bad_restart_cost_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", "--policy", "fifo", "--restart-cost", "soon"]) == 2
    assert "restart cost" in capsys.readouterr().err


def test_the_tables_have_preemptions_per_job_and_restart_seconds() -> None:
    for table in ("compare", "evaluation"):
        assert {"preempt_per_job", "restart_s"} <= set(TABLES[table])


def test_benchmark_cases_default_to_the_honest_model() -> None:
    from dataclasses import fields

    from linkwise.evaluation.benchmark import EvalCase

    (restart,) = [f for f in fields(EvalCase) if f.name == "restart"]
    assert restart.default_factory() == RestartModel.sia()  # type: ignore[misc]


def test_benchmark_runs_and_summary_carry_the_restart_cost(tmp_path: Path) -> None:
    from linkwise.cluster.domain import Job
    from linkwise.cluster.topology.spec import from_spec
    from linkwise.datasets.rollouts import Window
    from linkwise.evaluation.benchmark import load_benchmark, make_cases, run_benchmark
    from linkwise.evaluation.report import write_report

    t = 1.7e9  # a long job, then small ones that make Tiresias preempt it
    jobs = (Job(1, t, 16, 20000.0), *(Job(2 + i, t + 4000 + 60 * i, 8, 300.0) for i in range(4)))
    window = Window(0, t, t + 6000, jobs)
    topo = from_spec("2x8,leaf=2")
    for restart, free in ((None, False), (RestartModel.free(), True)):
        cases = make_cases([window], [0], topo, block_s=0.0, restart=restart)
        bench = run_benchmark([PolicySpec.parse("tiresias_las")], cases)
        (run,) = bench.results
        assert run.metrics["free_preemption"] is free
        assert run.metrics["preemptions_per_job"] > 0
        assert (run.metrics["restart_s_per_job"] > 0) is not free
        (summary,) = bench.summary()
        assert summary["free_preemption"] is free
        assert summary["restart_s_per_job"] == run.metrics["restart_s_per_job"]
        out = tmp_path / ("free" if free else "sia")
        write_report(bench, out, baseline="tiresias_las", n_boot=20)
        assert load_benchmark(out).results[0].metrics["restart"] == run.metrics["restart"]
