"""Evaluation end to end on a small slice of the Philly trace: held-out windows picked from
a dataset manifest (overlap refused), the benchmark, paired bootstrap statistics, the report
(Markdown, plots, JSON) and its MLflow run; and the bootstrap's coverage on a constructed case."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from linkwise.cli import main
from linkwise.cluster.profiles import load_calibration
from linkwise.cluster.topology.spec import from_spec
from linkwise.datasets.export import file_sha256
from linkwise.datasets.rollouts import cut_windows, jobs_from_trace
from linkwise.evaluation.benchmark import (
    UNFAIR_SLOWDOWN,
    bounded_slowdown,
    load_benchmark,
    make_cases,
    run_benchmark,
)
from linkwise.evaluation.holdout import HoldoutError
from linkwise.evaluation.stats import bootstrap_ratio, paired_ratio
from linkwise.models.calibrations import log_cluster_calibration
from linkwise.pipelines.evaluate import evaluate
from linkwise.policies.spec import PolicySpec

DATA = Path(__file__).resolve().parents[3] / "shared" / "data"
PHILLY = DATA / "traces" / "philly_2017-09-04_2017-10-15.csv"
CLUSTER = "4x8"  # 32 GPUs: queues form on busy hours
WINDOW_S = 3600.0


@pytest.fixture(scope="module")
def windows() -> list[Any]:
    return [w for w in cut_windows(jobs_from_trace(PHILLY), WINDOW_S, max_gpus=32)
            if 25 <= len(w.jobs) <= 60]  # fmt: skip


@pytest.fixture(scope="module")
def manifest(windows: list[Any], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A dataset manifest as build_dataset writes it, built from the last three busy windows."""
    used = [w.window_id for w in windows[-3:]]
    m = {
        "hash": "f" * 64,
        "sources": {
            "topology": {"spec": CLUSTER, "gpus": 32},
            "rollouts": {"trace": str(PHILLY), "sha256": file_sha256(PHILLY), "windows": used,
                         "window_s": WINDOW_S, "block_s": 600.0},
        },
    }  # fmt: skip
    path = tmp_path_factory.mktemp("ds") / "transitions-ffff.json"
    path.write_text(json.dumps(m))
    return path


@pytest.fixture(scope="module")
def evaluated(manifest: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("eval")
    uri = f"sqlite:///{root / 'mlflow.db'}"
    report, run_id = evaluate(
        [
            PolicySpec.parse("backfill"),
            PolicySpec.parse("sjf_bco"),
            PolicySpec.parse("best_fit"),
            PolicySpec.parse("qssf"),
            PolicySpec.parse("srtf_oracle"),
        ],
        trace=PHILLY,
        history=PHILLY,  # the predictor is fit on its jobs before the first evaluated window
        holdout_from=[manifest],
        n_windows=2,
        seeds=[0, 1],
        cluster=CLUSTER,
        window_s=WINDOW_S,
        block_s=600.0,
        min_jobs=25,
        executor="serial",
        out_dir=root / "report",
        tracking_uri=uri,
        n_boot=300,
    )
    return {"report": report, "run_id": run_id, "uri": uri, "root": root}


def test_heldout_windows_never_overlap_the_dataset(
    evaluated: dict[str, Any], manifest: Path
) -> None:
    ctx = evaluated["report"].context
    used = json.loads(manifest.read_text())["sources"]["rollouts"]["windows"]
    ev = ctx["evaluation_windows"]
    assert len(ev) == 2 and len(ctx["dataset_windows"]) == 3
    for e in ev:
        for d in ctx["dataset_windows"]:
            assert e["end"] <= d["start"] or d["end"] <= e["start"]
    assert not any(f"window {u}" in e["label"] for u in used for e in ev)
    md = Path(evaluated["report"].files["report"]).read_text()
    # the report names both the evaluation windows and the dataset windows held out from
    assert "Evaluation windows (held out)" in md and "Training data it is held out from" in md
    assert md.count("rollout window") == 3 and "dataset ffffffffffffffff" in md


def test_overlapping_windows_are_refused(
    windows: list[Any], manifest: Path, tmp_path: Path
) -> None:
    clash = windows[-2].window_id
    with pytest.raises(HoldoutError, match=f"window {clash}.*overlaps.*rollout window {clash}"):
        evaluate([PolicySpec.parse("backfill")], trace=PHILLY, holdout_from=[manifest],
                 windows=[clash],
                 cluster=CLUSTER, window_s=WINDOW_S, out_dir=tmp_path, log=False)  # fmt: skip
    from linkwise.cli import main

    code = main(["evaluate", "--trace", str(PHILLY), "--holdout-from", str(manifest),
                 "--windows", str(clash), "--window", str(WINDOW_S), "--cluster", CLUSTER,
                 "--policies", "backfill", "--no-log", "--out", str(tmp_path)])  # fmt: skip
    assert code == 2


def test_report_files_metrics_and_mlflow_run(evaluated: dict[str, Any]) -> None:
    rep = evaluated["report"]
    out = Path(rep.out_dir)
    for name in ("report.md", "results.json", "runs.json", "jobs.parquet", "jct_cdf.png",
                 "jct_ratios.png", "contention_slowdown.png"):  # fmt: skip
        assert (out / name).is_file(), name
    for png in out.glob("*.png"):
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000
    rows = {r["policy"]: r for r in rep.summary}
    assert set(rows) == {"backfill", "sjf_bco", "best_fit", "qssf", "srtf_oracle"}
    assert {p for p, r in rows.items() if r["oracle"]} == {"srtf_oracle"}
    for r in rows.values():
        assert r["cases"] == 4
        # JCT can never beat the isolated best-placement run time
        assert r["avg_jct_over_lb"] >= 1.0 and r["p99_jct_over_lb"] >= 1.0
        assert r["avg_jct_s"] == pytest.approx(r["avg_jct_over_lb"] * r["lower_bound_s"], rel=0.3)
        assert 0.0 <= r["unfair_share"] <= 1.0 and r["masked_actions"] is None
        assert r["guard_overrides"] is None  # heuristics have no guard
        assert r["avg_jct_over_queue_lb"] >= 1.0 - 1e-9 and r["avg_runtime_inflation"] >= -1e-9
    lb = {r["lower_bound_s"] for r in rows.values()}
    assert len(lb) == 1  # the same jobs for every policy
    # queues form on this cluster: the heuristics differ
    assert len({round(r["avg_jct_s"], 3) for r in rows.values()}) > 1
    assert rep.baseline == "backfill"
    assert {(q.policy, q.stat) for q in rep.ratios} == {
        (p, s) for p in ("sjf_bco", "best_fit", "qssf", "srtf_oracle") for s in ("avg", "p99")
    }
    # references: the best heuristic is never an oracle; the oracle ceiling is the oracle
    assert rep.references["oracle"] == "srtf_oracle"
    assert rep.references["best_heuristic"] in {"backfill", "sjf_bco", "best_fit", "qssf"}
    best = rep.references["best_heuristic"]
    assert all(rows[best]["avg_jct_s"] <= rows[p]["avg_jct_s"] for p in rows if p != "srtf_oracle")
    assert {q.baseline for q in rep.reference_ratios} <= {best, "srtf_oracle"}
    # the predictor: fit on the trace's jobs before the first evaluated window only
    pred = rep.context["predictor"]
    first = min(w["start"] for w in rep.context["evaluation_windows"])
    assert pred["history_jobs"] > 0 and pred["predictor_fit_until"] == pytest.approx(first)
    for q in rep.ratios:
        assert q.low <= q.ratio <= q.high and q.cases == 4
    md = (out / "report.md").read_text()
    assert "| sjf_bco |" in md and "![jct_cdf](jct_cdf.png)" in md
    assert "| srtf_oracle (oracle) |" in md and "avg JCT ratios to the references" in md
    assert "Run-time predictor: fit on" in md
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=evaluated["uri"])
    run = client.get_run(evaluated["run_id"])
    assert run.data.metrics["sjf_bco.avg_jct_s"] == pytest.approx(rows["sjf_bco"]["avg_jct_s"])
    assert "sjf_bco.avg_ratio_high" in run.data.metrics
    assert run.data.params["cluster"] == CLUSTER
    arts = {a.path for a in client.list_artifacts(run.info.run_id, "evaluation")}
    assert {"evaluation/report.md", "evaluation/jct_cdf.png", "evaluation/jobs.parquet"} <= arts


def test_saved_benchmark_reloads_to_the_same_statistics(evaluated: dict[str, Any]) -> None:
    rep = evaluated["report"]
    bench = load_benchmark(rep.out_dir)
    q = paired_ratio(bench, "sjf_bco", "backfill", "avg", n_boot=300, seed=0)
    (orig,) = [r for r in rep.ratios if r.policy == "sjf_bco" and r.stat == "avg"]
    assert (q.ratio, q.low, q.high) == pytest.approx((orig.ratio, orig.low, orig.high))
    run = bench.runs("best_fit")[0]
    jct, iso = np.asarray(run.jct_s), np.asarray(run.isolated_s)
    assert np.all(jct >= iso - 1e-6)
    slow = bounded_slowdown(jct, iso)
    assert run.metrics["unfair_share"] == pytest.approx(float((slow > UNFAIR_SLOWDOWN).mean()))


def test_prefect_executor_gives_the_serial_results(
    windows: list[Any], prefect_harness: None
) -> None:
    cases = make_cases(windows[:2], [0], from_spec(CLUSTER), block_s=600.0)
    serial = run_benchmark(
        [PolicySpec.parse("backfill"), PolicySpec.parse("sjf_bco")], cases, executor="serial"
    )
    threads = run_benchmark(
        [PolicySpec.parse("backfill"), PolicySpec.parse("sjf_bco")], cases, executor="threads:2"
    )
    assert [(r.policy, r.case_id, r.jct_s) for r in serial.results] == [
        (r.policy, r.case_id, r.jct_s) for r in threads.results
    ]


def test_bootstrap_interval_covers_the_true_ratio() -> None:
    """Challenger JCT = baseline JCT x U(0.6, 1.0), independent: the true ratio of means is
    0.8. A 95% interval from 3 cases x 300 jobs covers it in most of 40 replicates, and the
    interval is tight enough to tell the challenger is better."""
    rng = np.random.default_rng(42)
    covered, widths = 0, []
    for _ in range(40):
        base = [rng.lognormal(7.0, 1.0, 300) for _ in range(3)]
        chal = [b * rng.uniform(0.6, 1.0, b.size) for b in base]
        ratio, low, high = bootstrap_ratio(
            chal, base, "avg", n_boot=500, seed=int(rng.integers(1e9))
        )
        assert low <= ratio <= high
        covered += low <= 0.8 <= high
        widths.append(high - low)
        assert high < 1.0
    assert covered >= 34  # nominal 38 of 40
    assert 0.01 < float(np.mean(widths)) < 0.1
    # seeded: the same seed gives the same interval
    a = bootstrap_ratio(chal, base, "p99", n_boot=200, seed=7)
    assert a == bootstrap_ratio(chal, base, "p99", n_boot=200, seed=7)
    with pytest.raises(ValueError, match="same, non-zero number of jobs"):
        bootstrap_ratio([np.ones(3)], [np.ones(4)])


def test_gate_evidence_never_takes_an_oracle_as_the_best_heuristic(
    evaluated: dict[str, Any],
) -> None:
    from linkwise.pipelines.evaluate import gate_evidence

    bench = load_benchmark(evaluated["report"].out_dir)
    ev = gate_evidence(bench, "qssf", champion=None, n_boot=100)
    assert ev.best_heuristic is not None and ev.best_heuristic != "srtf_oracle"
    assert ev.best_heuristic == evaluated["report"].references["best_heuristic"]


def test_qssf_without_history_is_refused_before_any_simulation(
    manifest: Path, tmp_path: Path
) -> None:
    from linkwise.policies.heuristics import MissingPredictions

    with pytest.raises(MissingPredictions, match="--history"):
        evaluate(
            [PolicySpec.parse("backfill"), PolicySpec.parse("qssf")],
            trace=PHILLY,
            holdout_from=[manifest],
            n_windows=1,
            seeds=[0],
            cluster=CLUSTER,
            window_s=WINDOW_S,
            min_jobs=25,
            executor="serial",
            out_dir=tmp_path / "report",
            log=False,
        )
    assert not (tmp_path / "report").exists()


def test_evaluate_uses_the_clusters_calibration_by_default_and_records_it(
    windows: list[Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Without --calibration: the shipped one while no calibration is fitted for the
    cluster, the cluster's newest fitted one once there is; said on stdout and recorded in
    report.md and results.json."""
    uri = f"sqlite:///{tmp_path / 'ml' / 'mlflow.db'}"
    argv = ["evaluate", "--trace", str(PHILLY), "--windows", str(windows[0].window_id),
            "--window", str(WINDOW_S), "--cluster", CLUSTER, "--policies", "backfill,best_fit",
            "--seeds", "0", "--n-boot", "100", "--no-log", "--slurm-cluster", "philly",
            "--tracking-uri", uri]  # fmt: skip

    def run(out: Path) -> tuple[str, str, dict[str, Any]]:
        assert main([*argv, "--out", str(out)]) == 0
        printed = capsys.readouterr().out
        results = json.loads((out / "results.json").read_text())
        return printed, (out / "report.md").read_text(), results["context"]["calibration_used"]

    printed, md, used = run(tmp_path / "shipped")
    assert "calibration: shipped" in printed and "**calibration**: shipped" in md
    assert used["kind"] == "shipped" and used["path"] is None
    fitted = replace(load_calibration(None), alpha=0.9, source="test: a cluster fit")
    run_id = log_cluster_calibration(uri, fitted, "philly")
    printed, md, used = run(tmp_path / "cluster")
    line = f"cluster philly's fitted calibration (MLflow run {run_id}"
    assert f"calibration: {line}" in printed and line in md
    assert (used["kind"], used["run_id"], used["cluster"]) == ("cluster", run_id, "philly")
    assert load_calibration(used["path"]).alpha == 0.9
