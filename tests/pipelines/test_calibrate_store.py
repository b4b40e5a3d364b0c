"""``linkwise calibrate --db`` (pipelines/cluster_calibration.py) on a small hidden-truth
store, the calibration logged in MLflow (models/calibrations.py) and the one rule commands
follow to pick a calibration (``resolve_calibration``)."""

from __future__ import annotations

import json
import logging
import math
import shutil
from contextlib import closing
from dataclasses import replace
from pathlib import Path

import polars as pl
import pytest

from linkwise.cli import main
from linkwise.cluster.contention import AnalyticModel
from linkwise.cluster.loop import drive
from linkwise.cluster.profiles import assign_profiles, load_calibration
from linkwise.cluster.simulator.engine import Simulator
from linkwise.cluster.topology.spec import from_spec
from linkwise.datasets.comm_profiles import PROFILE_PREFIX, load_profile_book
from linkwise.datasets.hidden_truth.store import fill_truth_store
from linkwise.datasets.hidden_truth.truth import HiddenTruth
from linkwise.datasets.ingest import ingest_job_runs
from linkwise.datasets.rollouts import cut_windows, jobs_from_store, runs_from_store
from linkwise.datasets.store import open_store
from linkwise.datasets.traces import frame_jobs, jobs_frame, load_trace, write_native
from linkwise.deployer.loop import ServeConfig
from linkwise.deployer.metrics import ServeMetrics
from linkwise.deployer.policies import GuardedPolicy, PolicyHolder
from linkwise.deployer.recorder import Recorder
from linkwise.models.calibrations import (
    CalibrationChoice,
    latest_cluster_calibration,
    log_cluster_calibration,
    lookup_tracking_uri,
    recorded_calibration,
    resolve_calibration,
)
from linkwise.pipelines.demo_data import NO_TELEMETRY, calibrate_history
from linkwise.pipelines.history import PARTITION, accounting_jobs
from linkwise.pipelines.sim_shadow import SimShadowBackend
from linkwise.policies.heuristics import make_policy
from linkwise.policies.spec import PolicySpec
from linkwise.testkit.history import simulated_history

SMALL = "2x8,leaf=1,nic=50,intra=450,oversub=2"
TRUTH = HiddenTruth.default(
    hours=1.5, load=1.0, min_s=240.0, max_s=900.0, seed=3, overhead_s=0.015, topology_spec=SMALL
)


@pytest.fixture(scope="module")
def truth_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A store the hidden truth filled (accounting and exporter text through the collectors),
    its job telemetry not built yet."""
    path = tmp_path_factory.mktemp("truth") / "store.duckdb"
    con = open_store(path)
    try:
        fill_truth_store(con, TRUTH)
    finally:
        con.close()
    return path


def _copy(src: Path, tmp_path: Path) -> Path:
    dst = tmp_path / "store.duckdb"
    shutil.copyfile(src, dst)
    return dst


def test_calibrate_on_a_store_prints_writes_and_logs_the_fit(
    truth_db: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The job telemetry is built, the fit printed (jobs, hours, validation), written where
    --out says and logged with its span; then the cluster's calibration is the default pick."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    db = _copy(truth_db, tmp_path)
    out = tmp_path / "cal.json"
    uri = f"sqlite:///{tmp_path / 'ml' / 'mlflow.db'}"
    # nothing logged yet: shipped
    assert resolve_calibration(None, cluster="truth", tracking_uri=uri).kind == "shipped"
    args = ["calibrate", "--db", str(db), "--cluster", SMALL, "--interval", "60"]
    assert main([*args, "--out", str(out), "--tracking-uri", uri]) == 0
    text = capsys.readouterr().out
    assert "cluster truth from" in text
    assert "job telemetry: 24 runs summarized now" in text
    assert "fitted on 24 runs" in text and "over 1.5 h" in text
    assert "validation on" in text and "MAE" in text
    assert "logged as MLflow run" in text
    cal = load_calibration(out)
    assert cal.fit["data"]["runs_summarized"] == 24
    record = latest_cluster_calibration(uri, "truth")
    assert record is not None
    assert f"logged as MLflow run {record.run_id}" in text
    assert record.params["cluster"] == "truth" and record.params["jobs"] == "24"
    assert float(record.params["hours"]) == pytest.approx(cal.fit["data"]["hours"])
    assert load_calibration(record.path).alpha == pytest.approx(cal.alpha)
    assert latest_cluster_calibration(uri, "elsewhere") is None
    choice = resolve_calibration(None, cluster="truth", tracking_uri=uri)
    assert (choice.kind, choice.run_id, choice.path) == ("cluster", record.run_id, str(record.path))
    assert choice.describe().startswith(
        f"cluster truth's fitted calibration (MLflow run {record.run_id}"
    )
    # built once: a second run summarizes nothing new, and --json carries the run id
    assert main([*args, "--json", "--tracking-uri", uri]) == 0
    second = json.loads(capsys.readouterr().out)
    assert second["job_telemetry"]["built"] == 0
    assert second["mlflow_run_id"] not in (None, record.run_id)
    assert latest_cluster_calibration(uri, "truth").run_id == second["mlflow_run_id"]  # type: ignore[union-attr]
    # build-dataset on the store takes the newest one by default and says so, in its report
    # and in its manifest; a file given wins
    build = ["build-dataset", "--from-db", str(db), "--cluster", SMALL, "--tracking-uri", uri]
    assert main([*build, "--out", str(tmp_path / "ds")]) == 0
    newest = second["mlflow_run_id"]
    assert f"calibration: cluster truth's fitted calibration (MLflow run {newest}" in (
        capsys.readouterr().out
    )
    assert main([*build, "--out", str(tmp_path / "ds2"), "--calibration", str(out), "--json"]) == 0
    manifest = json.loads(capsys.readouterr().out)
    assert manifest["sources"]["calibration_used"]["kind"] == "file"
    assert manifest["sources"]["calibration"] == str(out)


def test_too_little_telemetry_is_one_line_saying_how_much_is_missing(
    truth_db: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = _copy(truth_db, tmp_path)
    until = str(TRUTH.t0 + 1200.0)  # 20 minutes: runs last 4 to 15
    code = main(
        ["calibrate", "--db", str(db), "--cluster", SMALL, "--interval", "60", "--until", until]
    )
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert "\n" not in err
    assert "too little telemetry to calibrate cluster truth" in err
    have = int(err.split(", ")[1].split(" of them")[0])
    assert have < 10 and err.endswith(f"the fit needs 10 such runs, {10 - have} missing")


def test_the_pick_without_a_tracking_store_or_with_a_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A file given wins and says so; with no tracking store (none configured, no default
    one on disk) the shipped calibration, and nothing is created to look."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    assert lookup_tracking_uri() is None
    shipped = resolve_calibration(None, cluster="truth")
    assert (shipped.kind, shipped.path) == ("shipped", None)
    assert shipped.describe().startswith("shipped")
    assert not (tmp_path / "linkwise-out").exists()
    given = resolve_calibration(tmp_path / "c.json", cluster="truth")
    assert (given.kind, given.describe()) == ("file", f"a file ({tmp_path / 'c.json'})")
    # a registry named (serve's --tracking-uri) but not there yet: not created to look
    missing = f"sqlite:///{tmp_path / 'registry' / 'mlflow.db'}"
    assert lookup_tracking_uri(missing) is None
    assert resolve_calibration(None, cluster="truth", tracking_uri=missing).kind == "shipped"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", missing)
    assert lookup_tracking_uri() is None
    assert not (tmp_path / "registry").exists()


def test_the_demo_calibrates_on_its_history_or_says_plainly_why_not(
    truth_db: Path, tmp_path: Path
) -> None:
    """The demo's calibrate stage (``demo_data.calibrate_history``): on a store with
    telemetry, what was fitted, from how many jobs and hours, the validation error; on the
    demo's replayed history (accounting only), that there is no telemetry, and that the
    shipped calibration is used."""
    done = calibrate_history(_copy(truth_db, tmp_path), "truth", SMALL)
    runs = done["data"]["runs_summarized"]
    assert done["fitted"] and runs >= 24  # 25 at the default 30 s interval
    assert f"fitted on {runs} runs" in done["text"] and "over 1.5 h" in done["text"]
    assert "validation on" in done["text"] and "MAE" in done["text"]
    runs, _, _ = simulated_history(
        30, topology="2x8", seed=0, max_gpus=8, load_scale=1.0, cluster="demo"
    )
    bare = tmp_path / "bare.duckdb"
    with closing(open_store(bare)) as con:
        ingest_job_runs(con, runs, source="accounting:demo")
    plain = calibrate_history(bare, "demo", "2x8")
    assert not plain["fitted"]
    assert "not fitted" in plain["text"] and "holds no GPU activity telemetry" in plain["text"]
    assert NO_TELEMETRY in plain["text"] and "shipped calibration" in NO_TELEMETRY


def test_a_datasets_cluster_calibration_is_reloaded_from_its_run_not_a_temp_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``linkwise iterate`` reloads the calibration a dataset was built with
    (``recorded_calibration``): a cluster's fitted one from its MLflow run, even once the
    temporary copy the build read is gone; a file as recorded; the shipped one as None."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    uri = f"sqlite:///{tmp_path / 'ml' / 'mlflow.db'}"
    fitted = replace(load_calibration(None), alpha=0.9, source="test: a cluster fit")
    run_id = log_cluster_calibration(uri, fitted, "lab")
    choice = resolve_calibration(None, cluster="lab", tracking_uri=uri)
    assert choice.run_id == run_id and choice.path is not None
    sources = {"calibration": choice.path, "calibration_used": choice.to_dict()}
    Path(choice.path).unlink()  # the temporary copy is gone
    again = recorded_calibration(sources, uri)
    assert again is not None and load_calibration(again).alpha == 0.9
    with pytest.raises(ValueError, match="name the tracking store"):
        recorded_calibration(sources)  # none configured, none on disk
    given = CalibrationChoice.given(tmp_path / "c.json")
    file_sources = {"calibration": given.path, "calibration_used": given.to_dict()}
    assert recorded_calibration(file_sources) == str(tmp_path / "c.json")
    assert recorded_calibration({"calibration": None}) is None


def test_replays_with_the_fitted_calibration_give_jobs_their_learned_profiles(
    truth_db: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """After ``calibrate --db``, ``evaluate --db``, ``label --db`` and ``shadow-report``
    replay with the cluster's fitted calibration: the jobs of a name with earlier runs in the
    store's telemetry get its ``history:name=NAME`` profile (the fit's values), the others
    the default mix, and each says how many had which; the counts are those the profile book
    gives (from the runs before the replayed window; label: the store's runs)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    db = _copy(truth_db, tmp_path)
    uri = f"sqlite:///{tmp_path / 'ml' / 'mlflow.db'}"
    args = ["--db", str(db), "--cluster", SMALL, "--tracking-uri", uri]
    assert main(["calibrate", *args, "--interval", "60", "--json"]) == 0
    run_id = json.loads(capsys.readouterr().out)["mlflow_run_id"]
    with closing(open_store(db)) as con:
        jobs = jobs_from_store(con)
        book = load_profile_book(con)
    cal = load_calibration(latest_cluster_calibration(uri, "truth").path)  # type: ignore[union-attr]
    assert {f"{PROFILE_PREFIX}name={n}" for n in book.by_name} <= set(cal.profiles)
    # evaluate: the held-out window's jobs, profiles learned before it
    window_s = 1800.0
    assert main(["evaluate", *args, "--policies", "fifo", "--window", str(window_s),
                 "--n-windows", "1", "--min-jobs", "3", "--seeds", "0", "--no-log",
                 "--out", str(tmp_path / "ev"), "--json"]) == 0  # fmt: skip
    doc = json.loads(capsys.readouterr().out)
    assert doc["calibration_used"]["run_id"] == run_id
    (w,) = doc["context"]["evaluation_windows"]
    with closing(open_store(db)) as con:
        before = load_profile_book(con, until=w["start"])
    inside = jobs.filter((pl.col("submit_time") >= w["start"]) & (pl.col("submit_time") < w["end"]))
    named = sum(n in before.by_name for n in inside["name"])
    counts = doc["context"]["profile_counts"]
    assert counts["history_name"] == named > 0
    assert counts["history"] + counts["default"] + counts["declared"] == inside.height
    assert "jobs from history" in (tmp_path / "ev" / "report.md").read_text()
    # label: a native trace of the store's jobs, profiles from the store's telemetry
    trace = tmp_path / "truth.csv"
    write_native(frame_jobs(jobs), trace)
    label = ["label", "--db", str(db), "--tracking-uri", uri, "--cluster", SMALL,
             "--trace", str(trace), "--window-hours", "0.5", "--fit-windows", "1",
             "--windows", "1", "--horizon", "600", "--samples", "1", "--points", "1",
             "--alternatives", "2", "--out", str(tmp_path / "labels")]  # fmt: skip
    assert main(label) == 0
    assert "jobs from history" in capsys.readouterr().out
    assert main([*label, "--json"]) == 0
    sources = json.loads(capsys.readouterr().out)["sources"]
    assert sources["calibration_used"]["run_id"] == run_id
    cut = cut_windows(jobs_frame(load_trace(trace).jobs), 1800.0, max_gpus=16, min_jobs=5)
    labelled = cut[1].jobs
    assert sources["windows"] == [cut[1].window_id]
    assert sources["profiles"]["history_name"] == sum(j.name in book.by_name for j in labelled)
    assert sources["profiles"]["history_name"] > 0
    assert sum(sources["profiles"][k] for k in ("history", "default", "declared")) == len(labelled)

    # shadow-report: the live loop's shadow mode ran backfill over the second half of the
    # history; the replay of its window gives the window's jobs their learned profiles
    since = float(jobs["submit_time"].sort()[jobs.height // 2]) - 1.0
    _shadow_loop(db, since, tmp_path)
    assert main(["shadow-report", *args, "--slurm-cluster", "truth", "--since", str(since),
                 "--n-boot", "50", "--no-log", "--out", str(tmp_path / "sr")]) == 0  # fmt: skip
    printed = capsys.readouterr().out
    assert f"MLflow run {run_id}" in printed and "window's jobs' profiles:" in printed
    doc = json.loads((tmp_path / "sr" / "shadow_report.json").read_text())
    win = doc["window"]
    with closing(open_store(db)) as con:
        earlier = load_profile_book(con, until=win["since"])
        runs = runs_from_store(con, since=win["since"], until=math.nextafter(win["until"], 9e99))
    assert doc["profiles"]["history_name"] == sum(n in earlier.by_name for n in runs["name"]) > 0
    assert sum(doc["profiles"][k] for k in ("history", "default", "declared")) == runs.height


def _shadow_loop(db: Path, since: float, root: Path) -> None:
    """The live loop's shadow mode (``SimShadowBackend``) running backfill over the store's
    jobs submitted from ``since`` (as tests/evaluation/test_shadow_report.py does)."""
    cal = load_calibration(None)
    spec = PolicySpec.parse("backfill")
    jobs = accounting_jobs(db, cluster="truth", since=since, max_gpus=16)
    sim = Simulator(from_spec(SMALL), assign_profiles(jobs, cal, seed=0), AnalyticModel(cal))
    cfg = ServeConfig(mode="shadow", partitions=(PARTITION,), policy=spec, db=str(db),
                      state_dir=str(root / "serve"), max_cycles=60, watchdog=False)  # fmt: skip
    metrics, log = ServeMetrics(), logging.getLogger("test.calibrate_store")
    holder = PolicyHolder(spec, spec, metrics=metrics, logger=log)
    guarded = GuardedPolicy(holder, metrics)
    backend = SimShadowBackend(sim, make_policy("backfill"), cfg, guarded,
                               Recorder(str(db), cfg.spool_path, logger=log), metrics,
                               cluster="truth")  # fmt: skip
    backend.start()
    drive(backend, guarded)
