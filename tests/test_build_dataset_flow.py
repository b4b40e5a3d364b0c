"""The dataset build under Prefect: rollouts on a local process pool and on a Dask cluster of
two workers give the serial frame; the build flow (logs + rollouts) and its CLI."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import polars as pl
import pytest

from linkwise.cluster.domain import Job
from linkwise.cluster.mdp import MdpConfig
from linkwise.cluster.topology import from_spec
from linkwise.datasets.export import read_dataset
from linkwise.datasets.ingest import ingest_job_runs
from linkwise.datasets.prediction import predictor_digest, predictor_from_manifest
from linkwise.datasets.predictor import RuntimePredictor
from linkwise.datasets.rollouts import (
    cut_windows,
    jobs_from_trace,
    make_task_runner,
    make_tasks,
    rollouts_flow,
    run_rollouts,
)
from linkwise.datasets.store import open_store
from linkwise.pipelines.build_dataset import (
    add_build_dataset_parser,
    build_dataset,
    build_dataset_flow,
)
from linkwise.tests._history import simulated_history

DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"
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
        ["fifo", "best_fit"],
        [0],
        from_spec(TOPO),
        epsilons=(0.0, 0.2),
        config=CONFIG,
        block_s=600.0,
    )


def test_executor_strings_select_task_runners() -> None:
    from prefect.task_runners import ProcessPoolTaskRunner
    from prefect_dask import DaskTaskRunner

    local = make_task_runner("local:2")
    assert isinstance(local, ProcessPoolTaskRunner) and local._max_workers == 2
    dask = make_task_runner("dask://10.0.0.5:8786")
    assert isinstance(dask, DaskTaskRunner) and dask.address == "tcp://10.0.0.5:8786"
    assert make_task_runner("dask://tls://h:1").address == "tls://h:1"
    for bad in ("pool", "dask:x", "dask://"):
        with pytest.raises(ValueError, match="executor"):
            make_task_runner(bad)
    with pytest.raises(ValueError, match="batch"):
        rollouts_flow([], "threads", batch=0)


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
        policies=["sjf_bco"],
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
    the dataset (here a trace history; rollouts from the same trace)."""
    jobs = jobs_from_trace(PHILLY)
    t0 = float(jobs["submit_time"].min())  # type: ignore[arg-type]
    until = t0 + 2 * 86400.0
    m = build_dataset(
        trace=str(PHILLY),
        history=str(PHILLY),
        until=until,
        out_dir=str(tmp_path),
        rollouts=1,
        policies=["fifo"],
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
