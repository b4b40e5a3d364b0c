"""The live drift of the contention model (deployer/drift.py) on a real DuckDB store filled
through the real ingest with exporter text whose truth is known (tests/_telemetry_truth.py),
its metrics, and the alert rule over them (promtool, when installed).

The scenario: tests/_drift.py.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import duckdb
import pytest

from linkwise.cluster.contention import AnalyticModel
from linkwise.cluster.domain import Job, Placement
from linkwise.datasets.store import open_store
from linkwise.deployer.drift import (
    REASONS,
    AloneTally,
    DriftMonitor,
    DriftSettings,
    LiveRun,
    observe_slowdowns,
    predict_slowdowns,
)
from linkwise.deployer.metrics import ServeMetrics
from linkwise.tests._drift import ALONE, NOW, SLOWED, TOPO, B, book, calibration, fill
from linkwise.tests._telemetry_truth import CLUSTER

RULES = Path(__file__).resolve().parents[2] / "ops" / "prometheus" / "rules.yml"
RULE_TESTS = Path(__file__).resolve().parents[1] / "data" / "drift_rules_test.yml"


@pytest.fixture(scope="module", params=[True, False], ids=["labelled", "unlabelled"])
def store(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> duckdb.DuckDBPyConnection:
    con = open_store(tmp_path_factory.mktemp("drift") / "store.duckdb")
    fill(con, labelled=request.param)
    yield con
    con.close()


def test_observed_slowdown_is_activity_alone_over_activity_now(
    store: duckdb.DuckDBPyConnection,
) -> None:
    """Job 1: 0.5 alone (before job 2 shared gpu2), 0.4 in the window: 1.25, with or
    without hpc_job labels (unlabelled, gpu1 has it alone; gpu2's shared instants are
    not used); job 2 never alone, job 99 not accounted: counted, no value."""
    observed, missing, tally = observe_slowdowns(
        store, [1, 2, 99], AloneTally(), now=NOW, cluster=CLUSTER, settings=DriftSettings()
    )
    assert observed == {1: pytest.approx(ALONE / SLOWED)}
    assert missing == {2: "too_few_alone", 99: "not_in_store"}
    # the baseline: 20 scrapes alone (B+30..B+600) of 8 GPUs, each half busy
    (sums,) = [v for k, v in tally.sums.items() if k[1] == 1]
    assert sums == pytest.approx((20 * 8 * ALONE, 20 * 8))
    assert tally.watermark == pytest.approx(NOW - 30.0 - 600.0)  # horizon less settle


def test_the_alone_tally_is_incremental(store: duckdb.DuckDBPyConnection) -> None:
    """Advancing the tally in steps adds each instant once: the same sums as one step."""
    settings = DriftSettings()
    tally = AloneTally()
    for now in (B + 700.0, B + 900.0, B + 1300.0, NOW):
        _, _, tally = observe_slowdowns(
            store, [1, 2], tally, now=now, cluster=CLUSTER, settings=settings
        )
    _, _, once = observe_slowdowns(
        store, [1, 2], AloneTally(), now=NOW, cluster=CLUSTER, settings=settings
    )
    assert dict(tally.sums) == dict(once.sums) and once.sums  # sums of halves: exact
    assert tally.watermark == once.watermark


def test_missing_recent_telemetry_is_counted_not_guessed(store: duckdb.DuckDBPyConnection) -> None:
    """Telemetry stopped: no instants in the window, no value."""
    observed, missing, _ = observe_slowdowns(
        store, [1], AloneTally(), now=NOW + 900.0, cluster=CLUSTER, settings=DriftSettings()
    )
    assert observed == {} and missing == {1: "too_few_recent"}


def test_predicted_slowdown_is_the_models_rate_alone_over_its_rate_beside() -> None:
    """Two rings sharing gpu2's NIC slow each other; alone, a ring is not slowed; a split
    job of an unknown name on a shared link leaves its neighbour unpredicted; a job gets the
    profile the live policy would give it (``comm_profiles.lookup``: learned, and held by
    the calibration), none without the book."""
    model = AnalyticModel(calibration())
    p1 = Placement.of([(0, 4), (1, 4)])
    p2 = Placement.of([(1, 4), (2, 4)])
    live = [LiveRun(1, "j1", p1), LiveRun(2, "j2", p2)]
    predicted, missing = predict_slowdowns(TOPO, model, live, book())
    j1 = Job(1, 0.0, 8, 1.0, profile="history:name=j1")
    j2 = Job(2, 0.0, 8, 1.0, profile="history:name=j2")
    alone = model.rates(TOPO, [(j1, p1)])[0]
    beside = model.rates(TOPO, [(j1, p1), (j2, p2)])[0]
    assert missing == {} and beside < alone
    assert predicted[1] == pytest.approx(alone / beside) and predicted[1] > 1.0
    assert predict_slowdowns(TOPO, model, live[:1], book())[0] == {1: pytest.approx(1.0)}
    stranger = [LiveRun(1, "j1", p1), LiveRun(3, "other", p2)]
    assert predict_slowdowns(TOPO, model, stranger, book()) == (
        {},
        {3: "no_profile", 1: "neighbour_unknown"},
    )
    # j2 not learned (a name the book has not seen): no profile, as the live policy's
    assert predict_slowdowns(TOPO, model, live, book(("j1",)))[1] == {
        2: "no_profile",
        1: "neighbour_unknown",
    }
    assert predict_slowdowns(TOPO, model, live, None) == ({}, {1: "no_profile", 2: "no_profile"})


def test_the_monitor_exports_series_only_with_a_calibration(
    store: duckdb.DuckDBPyConnection,
) -> None:
    live = [
        LiveRun(1, "j1", Placement.of([(0, 4), (1, 4)])),
        LiveRun(2, "j2", Placement.of([(1, 4), (2, 4)])),
        LiveRun(99, "j1", Placement.of([(2, 4)])),
    ]

    def read(fn):  # type: ignore[no-untyped-def]
        return fn(store)

    metrics = ServeMetrics()
    bare = DriftMonitor(TOPO, CLUSTER, lambda: None)
    metrics.observe_drift(bare.update(live, read, NOW))
    text = metrics.text()
    assert 'linkwise_serve_slowdown_unobserved_jobs{reason="no_calibration"} 3.0' in text
    assert "linkwise_serve_slowdown_ratio{" not in text
    monitor = DriftMonitor(TOPO, CLUSTER, calibration)
    report = monitor.update(live, read, NOW, lambda _cal: book())
    metrics.observe_drift(report)
    text = metrics.text()
    (job,) = report.jobs
    predicted = predict_slowdowns(TOPO, AnalyticModel(calibration()), live[:2], book())[0][1]
    assert job.job_id == 1 and job.ratio == pytest.approx(ALONE / SLOWED / predicted)
    assert f'linkwise_serve_slowdown_ratio{{job_id="1"}} {job.ratio}' in text
    assert 'linkwise_serve_slowdown_unobserved_jobs{reason="no_calibration"} 0.0' in text
    assert 'linkwise_serve_slowdown_unobserved_jobs{reason="too_few_alone"} 1.0' in text
    assert 'linkwise_serve_slowdown_unobserved_jobs{reason="not_in_store"} 1.0' in text
    assert set(report.missing) == set(REASONS)
    unreadable = monitor.update(live, lambda fn: None, NOW + 120.0, lambda _cal: book())
    metrics.observe_drift(unreadable)
    text = metrics.text()
    assert 'linkwise_serve_slowdown_unobserved_jobs{reason="no_store"} 3.0' in text
    assert "linkwise_serve_slowdown_ratio{" not in text  # the gone series removed


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool not installed")
def test_the_drift_alert_fires_on_a_drifted_median_with_enough_jobs() -> None:
    """``promtool test rules``: a median ratio of 1.5 over 5 jobs fires after 30 min; over 4
    jobs, or at 1.1, it does not (tests/data/drift_rules_test.yml)."""
    check = subprocess.run(
        ["promtool", "check", "rules", str(RULES)], capture_output=True, text=True
    )
    assert check.returncode == 0, check.stdout + check.stderr
    run = subprocess.run(
        ["promtool", "test", "rules", str(RULE_TESTS)], capture_output=True, text=True
    )
    assert run.returncode == 0, run.stdout + run.stderr
