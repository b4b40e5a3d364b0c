"""The contention model fitted on a cluster's own telemetry (datasets/contention_fit/)
against a hidden truth (datasets/hidden_truth/): a simulated cluster whose alpha, overhead
and job profiles the fit does not know, observed only through dcgm-exporter and
node_exporter text and the accounting, stored by the real ingest functions.

The issue's targets (issue 34): every identifiable parameter within 10%, the profile
volumes of job names seen at least 5 times within 20%; a parameter the data cannot pin is
reported as such (never ``determined`` while wrong); bad and missing samples are counted,
never guessed."""

from __future__ import annotations

import math
from pathlib import Path

import duckdb
import numpy as np
import polars as pl
import pytest

from linkwise.cluster.contention import AnalyticModel
from linkwise.cluster.domain import Job
from linkwise.cluster.profiles import load_calibration
from linkwise.datasets.contention_fit.data import load_fit_data
from linkwise.datasets.contention_fit.fit import fit_cluster_calibration
from linkwise.datasets.contention_fit.report import render_fit_text
from linkwise.datasets.contention_fit.result import ClusterFit
from linkwise.datasets.contention_fit.solve import standard_errors
from linkwise.datasets.contention_fit.terms import contention_terms
from linkwise.datasets.hidden_truth.recovery import recovery
from linkwise.datasets.hidden_truth.store import TruthReport, fill_truth_store
from linkwise.datasets.hidden_truth.truth import HiddenTruth
from linkwise.datasets.job_telemetry import build_job_telemetry, read_job_telemetry
from linkwise.datasets.store import open_store
from linkwise.datasets.telemetry.prometheus import NON_FINITE_REASON

# 4 nodes of 8 H100-class GPUs for 3 h: about 100 runs, through about 1,400 scrapes; a
# 15 ms per-node overhead (the default truth's 4 ms needs a longer window to be seen)
TRUTH = HiddenTruth.default(
    overhead_s=0.015,
    hours=3.0,
    load=1.0,
    min_s=240.0,
    max_s=900.0,
    wrap_nodes=("gpu3",),
    reset_nodes=("gpu4",),
)

SMALL = "2x8,leaf=1,nic=50,intra=450,oversub=2"  # for the checks that need few runs


def _fill(path: Path, truth: HiddenTruth) -> tuple[duckdb.DuckDBPyConnection, TruthReport]:
    con = open_store(path)
    report = fill_truth_store(con, truth)
    build_job_telemetry(con, interval_s=truth.interval_s)
    return con, report


@pytest.fixture(scope="module")
def truth_store(
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[duckdb.DuckDBPyConnection, TruthReport, ClusterFit]:
    con, report = _fill(tmp_path_factory.mktemp("truth") / "store.duckdb", TRUTH)
    return con, report, fit_cluster_calibration(con, TRUTH.topology())


def test_the_fits_model_terms_are_the_analytic_models_rates(
    truth_store: tuple[duckdb.DuckDBPyConnection, TruthReport, ClusterFit],
) -> None:
    """On every segment of the stored history, ``ContentionTerms.activity`` is rate x
    compute_s / best time with ``AnalyticModel.rates`` (the hidden calibration)."""
    con, _, _ = truth_store
    topo = TRUTH.topology()
    data = load_fit_data(con, topo)
    names = sorted(TRUTH.calibration.profiles)
    runs = data.runs
    terms = contention_terms(
        topo,
        runs["job_id"].to_list(),
        data.placements,
        runs["t0"].to_list(),
        runs["t1"].to_list(),
        [names.index(n) for n in runs["name"]],
        since=data.since,
        until=data.until,
    )
    cal = TRUTH.calibration
    c = np.array([cal.profiles[n].compute_s for n in names])
    g = np.array([cal.profiles[n].grad_gb for n in names])
    got = terms.activity(cal.alpha, cal.overhead_s, c, g)
    model = AnalyticModel(cal)
    jobs = [
        Job(job_id=int(j), submit_time=0.0, num_gpus=p.num_gpus, duration=1.0, profile=n)
        for j, p, n in zip(runs["job_id"], data.placements, runs["name"], strict=True)
    ]
    slowed = 0
    for s in range(len(terms.seg_len)):
        idx = np.nonzero(terms.pair_seg == s)[0]
        placed = [(jobs[j], data.placements[j]) for j in terms.pair_run[idx]]
        rates = model.rates(topo, placed)
        for k, (job, placement), rate in zip(idx, placed, rates, strict=True):
            want = rate * model.profile(job).compute_s / model.best_time(topo, job)
            assert got[k] == pytest.approx(want, rel=1e-12)
            slowed += rate < model.rates(topo, [(job, placement)])[0] - 1e-9
    assert slowed > 0  # rings did share links: alpha is in play


def test_the_fit_recovers_the_hidden_parameters(
    truth_store: tuple[duckdb.DuckDBPyConnection, TruthReport, ClusterFit],
) -> None:
    """Nothing reported determined is more than 10% off; alpha and the overhead are within
    10% (on this small instance the fit's own error bars call them weakly determined at
    most: benchmarks/calibration_recovery.md determines them on a larger one); the
    gradient per compute second of every name seen 5 times is within 20%; the fitted model
    predicts later runs better than the shipped alpha and overhead."""
    _, _, fit = truth_store
    rows = {r.parameter: r for r in recovery(TRUTH, fit.calibration, fit.reference)}
    shipped = load_calibration()
    assert abs(shipped.alpha / TRUTH.calibration.alpha - 1) > 0.3  # the truth is not shipped
    for r in rows.values():
        if r.status == "determined":
            assert abs(r.rel_error) <= 0.10, r
    for name in ("alpha", "overhead_s"):
        assert rows[name].status != "constrained"
        assert abs(rows[name].rel_error) <= 0.10, rows[name]
    frequent = [r for r in rows.values() if r.runs >= 5 and r.parameter.endswith("per_compute_s")]
    assert len(frequent) >= 4
    for r in frequent:
        assert r.status == "determined" and abs(r.rel_error) <= 0.20, r
    v = fit.calibration.fit["validation"]
    assert v["runs"] > 10
    assert v["activity"]["fit"]["mae"] < v["activity"]["shipped"]["mae"]
    assert v["drop"]["fit"]["mae"] < v["drop"]["shipped"]["mae"]
    assert fit.seconds < 30.0
    text = render_fit_text(fit)
    assert "shared.alpha" in text and "validation on" in text


def test_the_exporters_flaws_went_through_the_real_collectors(
    truth_store: tuple[duckdb.DuckDBPyConnection, TruthReport, ClusterFit],
) -> None:
    """The 64-bit counter that wraps is read as a wrap, the cleared one as a reset (its
    interval dropped), and the accounting's even split is corrected by the hpc_job labels
    where a run's GPUs were not split evenly."""
    _, report, fit = truth_store
    assert report.ib_rate_report["wraps"] >= 2  # tx and rx of gpu3
    assert report.ib_rate_report["resets"] >= 2  # tx and rx of gpu4
    uneven = [
        p
        for _, _, ps in report.timeline.segments()
        for p in ps
        if len({len(i) for i in p.gpus.values()}) > 1
    ]
    if uneven:
        assert fit.calibration.fit["data"]["runs_label_corrected"] > 0


def test_parameters_the_data_cannot_see_are_not_reported_as_accurate(tmp_path: Path) -> None:
    """Without any overhead a compute time changes no prediction: every fitted one is
    constrained (held by its prior), and the overhead at its bound 0 constrained too;
    whatever is reported determined is right."""
    truth = HiddenTruth.default(
        overhead_s=0.0, hours=1.5, load=1.0, min_s=240.0, max_s=900.0, seed=3, topology_spec=SMALL
    )
    con, _ = _fill(tmp_path / "store.duckdb", truth)
    fit = fit_cluster_calibration(con, truth.topology())
    params = fit.parameters
    assert params["shared"]["overhead_s"]["status"] == "constrained"
    for key, entries in params.items():
        if key != "shared":
            assert entries["compute_s"]["status"] == "constrained", key
    for r in recovery(truth, fit.calibration, fit.reference):
        if r.status == "determined" and r.truth:
            assert abs(r.rel_error) <= 0.10, r


def test_bad_and_missing_samples_are_counted_not_guessed(tmp_path: Path) -> None:
    """Out-of-range SM samples make their instant bad, NaN ones are rejected at ingest,
    scrapes that never happened are missing: each counted exactly, per run, and in the fit's
    report; none of them enters a mean."""
    truth = HiddenTruth.default(
        hours=1.5,
        load=0.8,
        min_s=900.0,
        max_s=1800.0,
        bad_rate=0.01,
        miss_rate=0.03,
        seed=5,
        topology_spec=SMALL,
    )
    con, report = _fill(tmp_path / "store.duckdb", truth)
    assert report.out_of_range and report.nan_samples and report.skipped
    rows = read_job_telemetry(con)
    nodes = {(int(j), n) for j, n in con.sql("SELECT job_id, node FROM job_nodes").fetchall()}
    skipped = set(report.skipped)
    tl = report.timeline
    for r in rows.iter_rows(named=True):
        job, t0, t1 = int(r["job_id"]), float(r["start_time"]), float(r["end_time"])
        bad = {(n, t) for n, t in report.out_of_range.get(job, ()) if t0 <= t < t1}
        assert r["activity_bad"] == len(bad), job
        mine = [n for j, n in nodes if j == job]
        grid = [
            truth.t0 + k * truth.interval_s
            for k in range(int(truth.window_s // truth.interval_s) + 1)
        ]
        # the accounting floors the truth's start to a second: an instant in between finds
        # the job's GPUs not yet labelled (missing too)
        start = truth.t0 + tl.started[job]
        missing = sum(
            1 for n in mine for t in grid if t0 <= t < t1 and ((n, t) in skipped or t < start)
        )
        assert r["activity_missing"] == missing, job
    fit = fit_cluster_calibration(con, truth.topology())
    counted = fit.calibration.fit["data"]["samples"]
    inside = rows.filter(
        (pl.col("start_time") >= fit.calibration.fit["data"]["since"])
        & (pl.col("end_time") <= fit.calibration.fit["data"]["until"])
    )
    assert counted["activity_bad"] == int(inside["activity_bad"].sum())
    assert counted["activity_missing"] == int(inside["activity_missing"].sum())
    rejected = con.execute(
        "SELECT coalesce(sum(seen), 0) FROM rejected_rows WHERE reason = ?", [NON_FINITE_REASON]
    ).fetchall()
    assert int(rejected[0][0]) == report.nan_samples


def test_a_direction_the_data_do_not_see_has_no_finite_error() -> None:
    """Two parameters that only move the residuals together: each has an infinite error
    (a pseudo-inverse would report them exact); a third, seen alone, a finite one."""
    rng = np.random.default_rng(0)
    seen = rng.standard_normal(20)
    both = rng.standard_normal(20)
    jac = np.column_stack([seen, both, both])
    se = standard_errors(jac, 0.01, np.ones(3))
    assert math.isfinite(se[0]) and se[0] > 0
    assert math.isinf(se[1]) and math.isinf(se[2])
