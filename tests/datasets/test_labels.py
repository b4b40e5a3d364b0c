"""Counterfactual labels (``datasets.labels``): the base's own action scores 0, the label
set is well formed and content-hashed, and the process pool gives the rows serial gives."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import polars as pl
import pytest

from linkwise.cli import main
from linkwise.cluster.mdp import MdpConfig, make_spec
from linkwise.cluster.profiles import load_calibration
from linkwise.cluster.restart import RestartModel
from linkwise.cluster.topology.spec import from_spec
from linkwise.datasets import synthetic
from linkwise.datasets.labels import LabelTask, read_labels, run_labels, write_labels
from linkwise.datasets.predictor import RuntimePredictor
from linkwise.datasets.rollouts import cut_windows
from linkwise.datasets.traces import jobs_frame
from linkwise.models.calibrations import log_cluster_calibration
from linkwise.policies.heuristics import make_policy

TOPO = from_spec("2x8")
CFG = MdpConfig(k_slots=3)


def _tasks(config: MdpConfig = CFG, seeds: tuple[int, ...] = (0,)) -> list[LabelTask]:
    jobs = synthetic.generate(60, seed=2, max_gpus=TOPO.total_gpus, load_scale=8.0)
    predictor = RuntimePredictor.fit(synthetic.generate(100, seed=9, max_gpus=16))
    windows = cut_windows(jobs_frame(jobs), 6 * 3600.0, max_gpus=TOPO.total_gpus, min_jobs=5)
    assert windows
    return [
        LabelTask(
            base=make_policy("sjf_bco"),
            base_name="sjf_bco",
            window=windows[0],
            topology=TOPO,
            seed=s,
            config=config,
            predictor=predictor,
            horizon_s=2 * 3600.0,
            n=2,
            points=3,
            alternatives=4,
        )
        for s in seeds
    ]


def test_labels_are_well_formed_and_the_base_scores_zero(tmp_path: Path) -> None:
    df = run_labels(_tasks(), "serial")
    assert df.height > 0
    spec = make_spec(CFG)
    assert set(df["obs"].list.len().to_list()) == {spec.dim}
    assert set(df["mask"].list.len().to_list()) == {CFG.n_actions}
    for (_, _), part in df.group_by("episode", "point"):
        base = part.filter(pl.col("action") == pl.col("base_action"))
        assert base.height == 1 and base["label_s"][0] == 0.0
        assert part["action"].n_unique() == part.height
        assert CFG.wait_action in part["action"].to_list()
        assert all(part["mask"][0][a] for a in part["action"].to_list())
    assert df["label_s"].is_finite().all() and (df["cost_s"] >= 0).all()
    assert (df["horizon_s"] == 7200.0).all() and (df["samples"] == 2).all()
    manifest = write_labels(df, CFG, {"base": "sjf_bco"}, tmp_path)
    again = write_labels(df.reverse(), CFG, {"base": "sjf_bco"}, tmp_path)
    assert manifest["hash"] == again["hash"]
    assert Path(manifest["path"]).name.startswith("labels-")
    back, meta = read_labels(manifest["path"])
    assert back.height == df.height and meta["obs_spec_version"] == spec.version
    assert meta["counts"]["rows"] == df.height
    other = write_labels(df, CFG, {"base": "qssf"}, tmp_path)
    assert other["hash"] != manifest["hash"]


def test_labels_are_deterministic_and_run_in_the_process_pool() -> None:
    tasks = _tasks(seeds=(0, 1))
    serial = run_labels(tasks, "serial")
    pooled = run_labels(tasks, "local:2")
    assert serial.equals(pooled)
    assert serial["episode"].unique(maintain_order=True).to_list() == [t.episode for t in tasks]


def test_running_rows_are_labelled() -> None:
    cfg = MdpConfig(k_slots=2, running_slots=2, min_run_s=60.0, migrate=False)
    tasks = [replace(t, restart=RestartModel.free(), alternatives=6) for t in _tasks(cfg)]
    df = run_labels(tasks, "serial")
    assert "preempt" in df["kind"].to_list()


def test_a_roll_in_visits_its_own_states_and_the_base_still_scores_zero() -> None:
    task = _tasks()[0]
    plain = run_labels([task], "serial")
    same = run_labels([replace(task, rollin=make_policy("sjf_bco"), rollin_name="sjf_bco")])
    assert same["episode"][0] == task.episode + "/in-sjf_bco"
    # the base as its own roll-in visits the same states (the forks' draws follow the episode)
    states = ["point", "time", "obs", "mask", "action", "kind", "base_action"]
    assert same.select(states).equals(plain.select(states))
    fifo = run_labels([replace(task, rollin=make_policy("fifo"), rollin_name="fifo")], "serial")
    assert fifo.height > 0 and fifo["episode"][0].endswith("/in-fifo")
    assert not fifo.select(states).equals(plain.select(states))
    for (_, _), part in fifo.group_by("episode", "point"):
        base = part.filter(pl.col("action") == pl.col("base_action"))
        assert base.height == 1 and base["label_s"][0] == 0.0
    with pytest.raises(ValueError, match="rollin_name"):
        replace(task, rollin=make_policy("fifo"))


def test_bad_inputs_are_refused(tmp_path: Path) -> None:
    task = _tasks()[0]
    with pytest.raises(ValueError):
        replace(task, n=0)
    with pytest.raises(ValueError, match="executor"):
        run_labels([task], "mpi")
    with pytest.raises(ValueError, match="columns"):
        write_labels(pl.DataFrame({"x": [1]}), CFG, {}, tmp_path)


def test_label_command_writes_a_label_set(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import json

    from linkwise.cli import main

    argv = ["label", "--base", "sjf_bco", "--jobs", "300", "--cluster", "2x8"]
    argv += ["--window-hours", "12", "--windows", "1", "--horizon", "1h", "--samples", "2"]
    argv += ["--points", "2", "--alternatives", "3", "--k-slots", "3", "--executor", "serial"]
    assert main([*argv, "--out", str(tmp_path), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["sources"]["base"] == "sjf_bco" and out["sources"]["horizon_s"] == 3600.0
    assert out["speed"]["labels"] == out["counts"]["rows"] > 0
    df, _ = read_labels(out["path"])
    assert df.height == out["counts"]["rows"]
    assert main(["label", "--base", "srtf_oracle", "--out", str(tmp_path)]) == 2
    assert "oracle" in capsys.readouterr().err


def test_labels_run_on_a_dask_cluster() -> None:
    from dask.distributed import LocalCluster

    tasks = _tasks()
    with LocalCluster(
        n_workers=1, threads_per_worker=1, processes=False, dashboard_address=None
    ) as cluster:
        df = run_labels(tasks, f"dask://{cluster.scheduler_address}")
    assert df.equals(run_labels(tasks, "serial"))


def test_label_uses_the_clusters_calibration_by_default_and_records_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Without --calibration: the shipped one while none is fitted for --slurm-cluster, the
    newest fitted one once there is; said on stdout and recorded in the label set's
    manifest (its sources)."""
    uri = f"sqlite:///{tmp_path / 'ml' / 'mlflow.db'}"
    argv = ["label", "--base", "sjf_bco", "--jobs", "300", "--cluster", "2x8"]
    argv += ["--window-hours", "12", "--windows", "1", "--horizon", "1h", "--samples", "1"]
    argv += ["--points", "1", "--alternatives", "2", "--k-slots", "3", "--executor", "serial"]
    argv += ["--slurm-cluster", "lab", "--tracking-uri", uri]

    def run(out: Path) -> tuple[str, dict[str, Any]]:
        assert main([*argv, "--out", str(out)]) == 0
        printed = capsys.readouterr().out
        (manifest,) = out.glob("*.json")
        return printed, json.loads(manifest.read_text())["sources"]

    printed, sources = run(tmp_path / "shipped")
    assert "calibration: shipped" in printed
    assert sources["calibration_used"]["kind"] == "shipped" and sources["calibration"] is None
    fitted = replace(load_calibration(None), alpha=0.9, source="test: a cluster fit")
    run_id = log_cluster_calibration(uri, fitted, "lab")
    printed, sources = run(tmp_path / "cluster")
    assert f"calibration: cluster lab's fitted calibration (MLflow run {run_id}" in printed
    used = sources["calibration_used"]
    assert (used["kind"], used["run_id"]) == ("cluster", run_id)
    assert sources["calibration"] == used["path"]
    assert load_calibration(sources["calibration"]).alpha == 0.9
