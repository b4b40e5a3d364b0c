"""The dataset build under Prefect: rollouts on a local process pool and on a Dask cluster of
two workers, as Prefect task runs (the suite's Prefect API is configured), give the serial
frame; the build flow (logs + rollouts) and its CLI. The executor strings themselves:
``tests/cli/test_parallel.py``."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import polars as pl
import pytest

from linkwise.cli.data import add_build_dataset_parser
from linkwise.cluster.domain import Job
from linkwise.cluster.mdp import MdpConfig
from linkwise.cluster.topology.spec import from_spec
from linkwise.datasets.export import read_dataset
from linkwise.datasets.ingest import ingest_job_runs
from linkwise.datasets.prediction import predictor_digest, predictor_from_manifest
from linkwise.datasets.predictor import RuntimePredictor
from linkwise.datasets.rollouts import cut_windows, jobs_from_trace, make_tasks, run_rollouts
from linkwise.datasets.store import open_store
from linkwise.parallel import patient_prefect_server
from linkwise.pipelines.build_dataset import (
    build_dataset,
    build_dataset_flow,
    cap_log_share,
)
from linkwise.policies.spec import PolicySpec
from linkwise.testkit.history import simulated_history

DATA = Path(__file__).resolve().parents[3] / "shared" / "data"
PHILLY = DATA / "traces" / "philly_2017-09-04_2017-10-15.csv"
TOPO = "8x8,leaf=4"
CONFIG = MdpConfig(k_slots=4)


@pytest.fixture(scope="module")
def tasks() -> list:
    wins = [
        w
        for w in cut_windows(jobs_from_trace(PHILLY), 3600.0, max_gpus=32)
        if 15 <= len(w.jobs) <= 30
    ][:2]
    return make_tasks(
        wins,
        [PolicySpec.parse("fifo"), PolicySpec.parse("best_fit")],
        [0],
        from_spec(TOPO),
        epsilons=(0.0, 0.2),
        config=CONFIG,
        block_s=600.0,
    )


def test_bad_executors_and_batches_are_refused(tasks: list) -> None:
    for bad in ("pool", "dask:x", "dask://"):
        with pytest.raises(ValueError, match="executor"):
            run_rollouts(tasks, bad)
    with pytest.raises(ValueError, match="batch"):
        run_rollouts(tasks, "threads", batch=0)


def test_process_pool_and_dask_give_the_serial_frame(prefect_harness: None, tasks: list) -> None:
    from distributed import LocalCluster

    serial = run_rollouts(tasks, "serial")
    assert serial["episode"].n_unique() == len(tasks) == 8
    assert run_rollouts(tasks, "local:2").equals(serial)
    with LocalCluster(
        n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None
    ) as cluster:
        address = cluster.scheduler_address.removeprefix("tcp://")
        # three rollouts per Prefect task run (8 tasks: batches of 3, 3, 2), order kept
        assert run_rollouts(tasks, f"dask://{address}", batch=3).equals(serial)


def _store(path: Path) -> int:
    """A best_fit history of 40 jobs on the 8x8 cluster, written as accounting; its job count."""
    runs, _, _ = simulated_history(40, topology=TOPO, seed=4, max_gpus=32, load_scale=30.0)
    con = open_store(path)
    try:
        assert ingest_job_runs(con, runs, source="test").rejected == 0
    finally:
        con.close()
    return len(runs)


def test_build_flow_from_logs_and_rollouts(prefect_harness: None, tmp_path: Path) -> None:
    db = tmp_path / "store.duckdb"
    _store(db)
    kwargs = dict(
        db_path=str(db),
        trace=str(PHILLY),
        rollouts=2,
        policies=[PolicySpec.parse("sjf_bco")],
        epsilons=[0.0, 0.2],
        seeds=[0],
        window_s=3600.0,
        block_s=600.0,
        topology=TOPO,
        config=CONFIG,
        executor="serial",
        max_steps=40,
    )
    m = build_dataset_flow(out_dir=str(tmp_path / "a"), **kwargs)
    counts = m["counts"]["by_source"]
    assert counts["log"]["transitions"] > 40 and counts["rollout"]["episodes"] == 4
    assert m["report"]["match_by_source"]["log"]["exact_share"] == 1.0  # best_fit is a candidate
    assert m["sources"]["rollouts"]["policies"] == ["sjf_bco"]
    assert len(m["sources"]["rollouts"]["windows"]) == 2
    assert m["sources"]["accounting"]["db"] == str(db)
    df, manifest = read_dataset(m["path"])
    assert df.height == m["counts"]["transitions"] and manifest["hash"] == m["hash"]
    assert set(df["source"]) == {"log", "rollout"}
    # one run-time predictor, fit on the store's accounting (no until: all of it), recorded
    pred = predictor_from_manifest(manifest)
    assert pred is not None and manifest["sources"]["predictor"]["sha256"] == predictor_digest(pred)
    assert manifest["sources"]["predictor"]["source"]["history"] == str(db)
    # the same inputs built again (plain function, another folder): the same hash
    again = build_dataset(out_dir=str(tmp_path / "b"), **kwargs)  # type: ignore[arg-type]
    assert again["hash"] == m["hash"]
    # another predictor is another dataset (the predictions are in the observations)
    other = RuntimePredictor.fit([Job(1, 0.0, 1, 60.0)])
    changed = build_dataset(out_dir=str(tmp_path / "c"), predictor=other, **kwargs)  # type: ignore[arg-type]
    assert changed["hash"] != m["hash"]
    assert predictor_from_manifest(changed) == other


def test_history_fits_the_predictor_before_until(tmp_path: Path) -> None:
    """``history`` and ``until``: the predictor is fit on the history's jobs before the end of
    the dataset (here a trace history; rollouts from the same trace, also before ``until``:
    the slice's first 1% of jobs, past day 20, where hourly windows are busy)."""
    jobs = jobs_from_trace(PHILLY)
    until = float(jobs["submit_time"].sort()[len(jobs) // 100])
    m = build_dataset(
        trace=str(PHILLY),
        history=str(PHILLY),
        until=until,
        out_dir=str(tmp_path),
        rollouts=1,
        policies=[PolicySpec.parse("fifo")],
        epsilons=[0.0],
        window_s=3600.0,
        topology=TOPO,
        executor="serial",
        max_steps=20,
    )
    rec = m["sources"]["predictor"]
    assert rec["fit_until"] == until
    assert rec["n_jobs"] == int((jobs["submit_time"] < until).sum())


def test_cli_prints_the_report(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    parser = argparse.ArgumentParser()
    add_build_dataset_parser(parser.add_subparsers(dest="command"))
    base = [
        "build-dataset",
        "--trace",
        str(PHILLY),
        "--rollouts",
        "1",
        "--policies",
        "fifo",
        "--epsilons",
        "0",
        "--window",
        "3600",
        "--cluster",
        TOPO,
        "--executor",
        "serial",
        "--max-steps",
        "30",
        "--out",
        str(tmp_path),
    ]
    args = parser.parse_args([*base, "--json"])
    assert args.func(args) == 0
    m = json.loads(capsys.readouterr().out)
    n = m["counts"]["transitions"]
    assert 0 < n <= 30 and m["counts"]["episodes"] == 1 and Path(m["path"]).is_file()
    assert m["sources"]["predictor"]["source"] == {"history": str(PHILLY), "until": None}
    args = parser.parse_args(base)
    assert args.func(args) == 0
    text = capsys.readouterr().out
    assert f"dataset {m['hash'][:16]}: {n} transitions, 1 episodes" in text
    assert "exact-match share:" in text and "actions: wait" in text and m["path"] in text
    with pytest.raises(ValueError, match="nothing to build"):
        build_dataset(out_dir=tmp_path)
    assert pl.read_parquet(m["path"]).height == n
    # the MDP options reach the manifest, which training follows
    assert m["obs_spec"]["config"]["k_slots"] == MdpConfig().k_slots
    args = parser.parse_args([*base, "--k-slots", "3", "--slot-order", "smallest", "--json"])
    assert args.func(args) == 0
    asked = json.loads(capsys.readouterr().out)["obs_spec"]["config"]
    assert (asked["k_slots"], asked["slot_order"]) == (3, "smallest")


def test_cap_log_share_keeps_whole_episodes_deterministically() -> None:
    sizes = {"log/a": 10, "log/b": 20, "log/c": 30, "log/d": 40}
    logs = pl.DataFrame({"episode": [e for e, n in sizes.items() for _ in range(n)]})
    kept, rec = cap_log_share(logs, others=100, share=0.25)  # at most 100/3 log transitions
    assert 0 < kept.height <= 33 and rec["transitions"] == {"kept": kept.height, "total": 100,
                                                            "others": 100}  # fmt: skip
    counts = dict(kept.group_by("episode").len().rows())
    assert all(sizes[e] == n for e, n in counts.items())  # whole episodes only
    assert rec["episodes"] == {"kept": len(counts), "total": 4}
    assert cap_log_share(logs.reverse(), 100, 0.25)[0].sort("episode").equals(kept.sort("episode"))
    assert cap_log_share(logs, 100, 1.0)[0].height == 100
    assert cap_log_share(logs, 100, 0.0)[0].height == 0
    assert cap_log_share(logs, 900, 0.5)[0].height == 100
    with pytest.raises(ValueError, match="log_share"):
        cap_log_share(logs, 100, 1.5)


def test_log_share_caps_the_logs_and_changes_the_hash(tmp_path: Path) -> None:
    db = tmp_path / "store.duckdb"
    _store(db)
    kwargs = dict(
        db_path=str(db), trace=str(PHILLY), rollouts=1,
        policies=[PolicySpec.parse("sjf_bco:lam=2")],
        epsilons=[0.1], window_s=3600.0, block_s=600.0, topology=TOPO, config=CONFIG,
        executor="serial", max_steps=30, log_window_s=600.0,
    )  # fmt: skip
    full = build_dataset(out_dir=str(tmp_path / "a"), **kwargs)  # type: ignore[arg-type]
    capped = build_dataset(out_dir=str(tmp_path / "b"), log_share=0.3, **kwargs)  # type: ignore[arg-type]
    logs = full["counts"]["by_source"]["log"]
    rolled = full["counts"]["by_source"]["rollout"]["transitions"]
    assert logs["transitions"] > rolled and logs["episodes"] > 2  # the logs dominate without
    by = capped["counts"]["by_source"]
    assert by["rollout"]["transitions"] == rolled  # rollouts untouched
    assert 0 < by["log"]["transitions"] <= 0.3 * capped["counts"]["transitions"]
    assert capped["hash"] != full["hash"] and "log_share" not in full["sources"]
    rec = capped["sources"]["log_share"]
    assert rec["share"] == 0.3 and rec["transitions"]["kept"] == by["log"]["transitions"]
    assert capped["counts"]["by_behaviour"]["sjf_bco:lam=2+eps0.1"] == rolled
    again = build_dataset(out_dir=str(tmp_path / "c"), log_share=0.3, **kwargs)  # type: ignore[arg-type]
    assert again["hash"] == capped["hash"]


def test_every_window_before_until(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``rollouts=None`` (``--rollouts all``) rolls out every window with ``min_jobs`` jobs
    before ``until``, none after it; ``--policies`` takes specs with parameters."""
    jobs = jobs_from_trace(PHILLY)
    since = float(jobs["submit_time"].min()) + 20 * 86400.0  # type: ignore[arg-type]
    until = since + 12 * 3600.0  # the trace's first busy day: 1,500 jobs
    span = (pl.col("submit_time") >= since) & (pl.col("submit_time") < until)
    before = cut_windows(jobs.filter(span), 3600.0, max_gpus=64)
    want = [w.window_id for w in before if len(w.jobs) >= 20]
    m = build_dataset(
        trace=str(PHILLY), since=since, until=until, out_dir=str(tmp_path), rollouts=None,
        policies=[PolicySpec.parse("fifo")], epsilons=[0.0], window_s=3600.0, min_jobs=20,
        topology=TOPO,
        executor="serial", max_steps=3,
    )  # fmt: skip
    assert m["sources"]["rollouts"]["windows"] == want and 2 <= len(want) < len(before)
    assert m["counts"]["episodes"] == len(want)
    parser = argparse.ArgumentParser()
    add_build_dataset_parser(parser.add_subparsers(dest="command"))
    base = ["build-dataset", "--trace", str(PHILLY), "--policies", "sjf_bco:lam=2,kappa=4,fifo",
            "--epsilons", "0", "--window", "3600", "--cluster", TOPO, "--executor", "serial",
            "--max-steps", "3", "--out", str(tmp_path), "--json"]  # fmt: skip
    every = parser.parse_args([*base, "--rollouts", "all", "--min-jobs", "3"])
    assert every.rollouts is None and every.min_jobs == 3
    args = parser.parse_args([*base, "--rollouts", "1"])
    assert args.func(args) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["sources"]["rollouts"]["policies"] == ["sjf_bco:lam=2,kappa=4", "fifo"]
    assert set(out["counts"]["by_behaviour"]) == {"sjf_bco:lam=2,kappa=4", "fifo"}


def test_dataset_plan_takes_every_window_and_a_log_share() -> None:
    from linkwise.pipelines.experiment import EXPERIMENTS, DatasetPlan

    plan = DatasetPlan(rollouts=None, policies=("sjf_bco:lam=2",), epsilons=(0.1,), seeds=(0,),
                       log_share=0.3)  # fmt: skip
    assert plan.rollouts is None and plan.log_share == 0.3
    for bad in ({"rollouts": -1}, {"log_share": 1.5}):
        with pytest.raises(ValueError):
            DatasetPlan(**{"rollouts": 1, "policies": (), "epsilons": (0.0,), "seeds": (0,), **bad})
    # the default is no cap; the experiments on issue 16's recipe (LEARNING_DATA) cap the logs
    capped = {n for n, e in EXPERIMENTS.items() if e.dataset.log_share is not None}
    assert capped == {"full", "full-multigpu", "philly-all", "philly-multigpu"}
    assert DatasetPlan(rollouts=1, policies=(), epsilons=(0.0,), seeds=(0,)).log_share is None


def test_flows_give_a_slow_ephemeral_server_two_minutes(monkeypatch: pytest.MonkeyPatch) -> None:
    from prefect.settings import PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS as STARTUP

    name = "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS"
    monkeypatch.delenv(name, raising=False)
    before = STARTUP.value()
    # an environment variable set after import would not be seen: Prefect reads it once
    with patient_prefect_server():
        assert STARTUP.value() == max(before, 120)
    assert STARTUP.value() == before
    monkeypatch.setenv(name, "30")  # the operator's own setting is left alone: never raised
    with patient_prefect_server():
        # Prefect's own reading of it (a context that changes another setting reads the
        # environment again)
        assert STARTUP.value() in (before, 30)
