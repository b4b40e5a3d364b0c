"""The counterfactual shadow report on a window with a known answer: the accounting is a
backfill history replayed in the simulator (single-node jobs with time limits: no contention,
so the accounting's run times are the isolated times), the live loop's shadow mode ran
backfill over it (its real DecisionLog, explanations included), and the report, warm-started
from the accounting in the middle of the history with jobs running and pending, replays
backfill: a ratio of 1 within its interval to what ran. Then the command line: Markdown,
plots, JSON and the MLflow run; bad input refused."""

from __future__ import annotations

import json
import logging
from contextlib import closing
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from linkwise.cli import main
from linkwise.cluster.contention import AnalyticModel
from linkwise.cluster.loop import drive
from linkwise.cluster.profiles import assign_profiles, load_calibration
from linkwise.cluster.simulator.engine import Simulator
from linkwise.cluster.topology.spec import from_spec
from linkwise.datasets.rollouts import cut_windows, jobs_from_trace
from linkwise.datasets.store import open_store
from linkwise.datasets.windows import choose_windows
from linkwise.deployer.loop import ServeConfig
from linkwise.deployer.metrics import ServeMetrics
from linkwise.deployer.policies import GuardedPolicy, PolicyHolder
from linkwise.deployer.recorder import Recorder
from linkwise.evaluation.shadow_replay import METRICS, shadow_report
from linkwise.evaluation.shadow_report import write_shadow_report
from linkwise.models.calibrations import log_cluster_calibration
from linkwise.pipelines.history import PARTITION, accounting_jobs, replay_history
from linkwise.pipelines.sim_shadow import SimShadowBackend
from linkwise.policies.heuristics import make_policy
from linkwise.policies.spec import PolicySpec

ROOT = Path(__file__).resolve().parents[2]
PHILLY = ROOT.parent / "shared" / "data" / "traces" / "philly_2017-09-04_2017-10-15.csv"
TOPO = "4x8"
CLUSTER = "ka"


def _shadow_loop(db: Path, since: float, policy: str, root: Path) -> None:
    """The live loop's shadow mode (``SimShadowBackend``: its own DecisionLog) with ``policy``
    over the accounting's jobs from ``since``."""
    cal = load_calibration(None)
    spec = PolicySpec.parse(policy)
    jobs = accounting_jobs(db, cluster=CLUSTER, since=since, max_gpus=32)
    sim = Simulator(from_spec(TOPO), assign_profiles(jobs, cal, seed=0), AnalyticModel(cal))
    cfg = ServeConfig(mode="shadow", partitions=(PARTITION,), policy=spec, db=str(db),
                      state_dir=str(root / "serve"), max_cycles=60, watchdog=False)  # fmt: skip
    metrics, log = ServeMetrics(), logging.getLogger("test.shadow_report")
    holder = PolicyHolder(spec, PolicySpec.parse("backfill"), metrics=metrics, logger=log)
    guarded = GuardedPolicy(holder, metrics)
    backend = SimShadowBackend(sim, make_policy("backfill"), cfg, guarded,
                               Recorder(str(db), cfg.spool_path, logger=log), metrics,
                               cluster=CLUSTER)  # fmt: skip
    backend.start()
    drive(backend, guarded)


@pytest.fixture(scope="module")
def known(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, float, float]:
    """A backfill history as the store's accounting, the shadow loop's backfill decisions over
    its second part, and (since, until): an instant with jobs running and pending, and the
    last submit (nothing arrives after the window that the replay would lack)."""
    root = tmp_path_factory.mktemp("shadow-report")
    (w,) = choose_windows(
        cut_windows(jobs_from_trace(PHILLY), 6 * 3600.0, max_gpus=8), n=1, min_jobs=60
    )
    jobs = [replace(j, time_limit=float(max(60, round(2 * j.duration)))) for j in w.jobs][:80]
    db = root / "live.duckdb"
    replay_history(jobs, from_spec(TOPO), db, cluster=CLUSTER)
    with closing(open_store(db)) as con:
        rows = con.execute(
            "SELECT submit_time, start_time FROM jobs ORDER BY submit_time, job_id"
        ).fetchall()
    last = max(float(s) for s, _ in rows)
    waited = [(s, t) for s, t in rows[len(rows) // 3 : 2 * len(rows) // 3] if t - s > 1.0]
    sub, start = max(waited, key=lambda r: r[1] - r[0])
    since = (float(sub) + float(start)) / 2  # that job is pending then
    _shadow_loop(db, since, "backfill", root)
    return db, since, last + 1.0


def test_a_shadow_policy_equal_to_what_ran_gives_a_ratio_of_one(
    known: tuple[Path, float, float],
) -> None:
    db, since, until = known
    with closing(open_store(db)) as con:
        report = shadow_report(con, topology=from_spec(TOPO), since=since, until=until,
                               n_boot=400)  # fmt: skip
    assert report.policy_spec == "backfill" and report.window.model_version == "heuristic:backfill"
    assert report.backlog["running"] > 0 and report.backlog["pending"] > 0
    assert report.jobs >= 40
    for metric in ("avg_jct", "p99_jct", "avg_queue"):
        i = report.interval(metric)  # the shadow policy replayed / the accounting
        assert i.low is not None and i.high is not None and i.ratio is not None
        assert i.low <= 1.0 <= i.high, (metric, i)
        assert i.ratio == pytest.approx(1.0, abs=0.02)
    assert report.values["policy"] == report.values["backfill"]
    assert report.deviations["decisions"] > 0 and report.deviations["deviated"] == 0
    assert report.deviations["explained"] == report.deviations["decisions"]


def test_a_different_policy_is_measured_against_the_same_accounting(
    known: tuple[Path, float, float],
) -> None:
    db, since, until = known
    with closing(open_store(db)) as con:
        base = shadow_report(con, topology=from_spec(TOPO), since=since, until=until,
                             n_boot=200)  # fmt: skip
        other = shadow_report(con, topology=from_spec(TOPO), since=since, until=until,
                              policy=PolicySpec.parse("fifo"), n_boot=200)  # fmt: skip
    assert other.policy_spec == "fifo" and other.jobs == base.jobs
    assert other.values["accounting"] == base.values["accounting"]
    assert other.values["backfill"] == base.values["backfill"]
    # FIFO never backfills: on a queue with waiting jobs it cannot beat backfill's queueing
    assert other.values["policy"]["avg_queue"] >= base.values["policy"]["avg_queue"]


def test_shadow_report_command_writes_markdown_plots_json_and_mlflow(
    known: tuple[Path, float, float], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db, since, until = known
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    out = tmp_path / "rep"
    args = ["shadow-report", "--db", str(db), "--cluster", TOPO, "--since", str(since),
            "--until", str(until), "--n-boot", "200", "--out", str(out), "--tracking-uri", uri,
            "--json"]  # fmt: skip
    assert main(args) == 0
    doc: dict[str, Any] = json.loads(capsys.readouterr().out)
    assert doc["headline"].startswith("shadow report (backfill, ")
    assert {i["metric"] for i in doc["intervals"]} == set(METRICS)
    md = (out / "shadow_report.md").read_text()
    assert doc["headline"] in md and "| policy / accounting |" in md
    assert (out / "shadow_jct_cdf.png").stat().st_size > 0
    assert (out / "shadow_ratios.png").stat().st_size > 0
    from mlflow.tracking import MlflowClient

    run = MlflowClient(tracking_uri=uri).get_run(doc["mlflow_run_id"])
    assert run.data.metrics["policy_over_accounting.avg_jct"] == pytest.approx(1.0, abs=0.02)
    assert run.data.params["policy_spec"] == "backfill"
    assert main(args[:-1]) == 0
    assert "| schedule | avg JCT | p99 JCT | avg queue |" in capsys.readouterr().out


def test_shadow_report_refuses_bad_input(
    known: tuple[Path, float, float], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db, since, until = known
    assert main(["shadow-report", "--db", str(tmp_path / "none.duckdb")]) == 2
    assert "no such store" in capsys.readouterr().err
    base = ["shadow-report", "--db", str(db), "--cluster", TOPO, "--no-log",
            "--out", str(tmp_path / "r")]  # fmt: skip
    assert main([*base, "--since", str(until), "--until", str(since)]) == 2
    assert "before --since" in capsys.readouterr().err
    assert main([*base, "--since", "yesterday"]) == 2
    assert "not a time" in capsys.readouterr().err
    assert main([*base, "--since", str(until + 1e6)]) == 2
    assert "no shadow-mode decisions" in capsys.readouterr().err
    assert main([*base, "--policy", "no_such_policy"]) == 2
    assert not (tmp_path / "r").exists()


def test_written_report_round_trips(known: tuple[Path, float, float], tmp_path: Path) -> None:
    db, since, until = known
    with closing(open_store(db)) as con:
        report = shadow_report(con, topology=from_spec(TOPO), since=since, until=until,
                               n_boot=100)  # fmt: skip
    paths = write_shadow_report(report, tmp_path)
    doc = json.loads(paths["json"].read_text())
    assert doc["headline"] == report.headline()
    assert doc["deviations"] == report.deviations


def test_the_shadow_gate_reads_the_reports_interval(known: tuple[Path, float, float]) -> None:
    from dataclasses import replace as dc_replace

    from linkwise.deployer.promote import shadow_evidence
    from linkwise.evaluation.gates import ShadowGates, check_shadow, load_gates

    db, _, _ = known
    with closing(open_store(db)) as con:
        ev, info = shadow_evidence(con, "heuristic:backfill", policy=PolicySpec.parse("backfill"),
                                   topology=from_spec(TOPO), calibration=load_calibration(None),
                                   n_boot=200)  # fmt: skip
    assert ev.avg_jct_ci is not None and ev.p99_jct_ci is not None
    assert ev.avg_jct_ci[0] <= ev.avg_jct_ratio <= ev.avg_jct_ci[1]
    assert info["headline"].startswith("shadow report (backfill, ")
    assert info["deviations"]["deviated"] == 0
    assert load_gates().shadow.require_ci is True  # the shipped gate reads the interval
    loose = ShadowGates(min_cycles=1, min_jobs=1, max_avg_jct_ratio=1.5, max_p99_jct_ratio=1.5,
                        require_ci=True)  # fmt: skip
    assert check_shadow(ev, loose).passed
    # the point estimate passes, the interval's upper end does not: refused
    wide = dc_replace(ev, avg_jct_ci=(ev.avg_jct_ratio - 0.1, 1.6))
    report = check_shadow(wide, loose)
    (avg,) = [c for c in report.checks if c.name == "counterfactual_avg_jct"]
    assert not avg.passed and "upper end" in avg.reason and avg.values["high"] == 1.6
    assert check_shadow(wide, dc_replace(loose, require_ci=False)).passed
    # no interval at all: missing evidence when the gate requires one
    bare = dc_replace(ev, avg_jct_ci=None)
    (avg,) = [c for c in check_shadow(bare, loose).checks if c.name == "counterfactual_avg_jct"]
    assert not avg.passed and "missing evidence" in avg.reason


def test_shadow_report_uses_the_clusters_calibration_by_default_and_records_it(
    known: tuple[Path, float, float], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Without --calibration: the shipped one while none is fitted for the store's cluster,
    the newest fitted one once there is; said on stdout and recorded in shadow_report.md
    and shadow_report.json."""
    db, since, until = known
    uri = f"sqlite:///{tmp_path / 'ml' / 'mlflow.db'}"
    args = ["shadow-report", "--db", str(db), "--cluster", TOPO, "--since", str(since),
            "--until", str(until), "--n-boot", "100", "--tracking-uri", uri,
            "--no-log"]  # fmt: skip

    def run(out: Path) -> tuple[str, str, dict[str, Any]]:
        assert main([*args, "--out", str(out)]) == 0
        printed = capsys.readouterr().out
        doc = json.loads((out / "shadow_report.json").read_text())
        return printed, (out / "shadow_report.md").read_text(), doc["calibration"]

    printed, md, used = run(tmp_path / "shipped")
    assert "calibration: shipped" in printed and "- calibration: shipped" in md
    assert used["kind"] == "shipped"
    fitted = replace(load_calibration(None), alpha=0.9, source="test: a cluster fit")
    run_id = log_cluster_calibration(uri, fitted, CLUSTER)
    printed, md, used = run(tmp_path / "cluster")
    line = f"cluster {CLUSTER}'s fitted calibration (MLflow run {run_id}"
    assert f"calibration: {line}" in printed and f"- calibration: {line}" in md
    assert (used["kind"], used["run_id"]) == ("cluster", run_id)
