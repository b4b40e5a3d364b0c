"""Export: content-hashed Parquet and manifest, d3rlpy MDPDataset, MLflow dataset input."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from linkwise.cluster.mdp import MdpConfig, make_spec
from linkwise.cluster.topology.spec import from_spec
from linkwise.datasets.export import (
    canonical_frame,
    content_hash,
    dataset_report,
    export_dataset,
    log_to_mlflow,
    read_dataset,
    to_mdp_dataset,
)
from linkwise.datasets.rollouts import cut_windows, jobs_from_trace, make_tasks, run_rollouts
from linkwise.policies.spec import PolicySpec

DATA = Path(__file__).resolve().parents[3] / "shared" / "data"
PHILLY = DATA / "traces" / "philly_2017-09-04_2017-10-15.csv"
CONFIG = MdpConfig(k_slots=4)
SPEC = make_spec(CONFIG)
SOURCES = {"rollouts": {"trace": "philly", "policies": ["fifo", "best_fit"], "seeds": [0, 1]}}


@pytest.fixture(scope="module")
def frame() -> pl.DataFrame:
    """Eight episodes: two policies (one with exploration) x two windows x two seeds, some cut."""
    wins = [
        w
        for w in cut_windows(jobs_from_trace(PHILLY), 3600.0, max_gpus=64)
        if 15 <= len(w.jobs) <= 25
    ][:2]
    tasks = make_tasks(
        wins,
        [PolicySpec.parse("fifo")],
        [0, 1],
        from_spec("8x8,leaf=2"),
        config=CONFIG,
        block_s=600.0,
    )
    tasks += make_tasks(
        wins,
        [PolicySpec.parse("best_fit")],
        [0, 1],
        from_spec("8x8,leaf=2"),
        epsilons=(0.3,),
        config=CONFIG,
        block_s=600.0,
        max_steps=25,
    )
    return run_rollouts(tasks)


def test_same_inputs_give_the_same_hash_and_file(frame: pl.DataFrame, tmp_path: Path) -> None:
    a = export_dataset(frame, SPEC, SOURCES, tmp_path / "a")
    shuffled = frame.sample(fraction=1.0, shuffle=True, seed=7)
    b = export_dataset(shuffled, SPEC, SOURCES, tmp_path / "b")
    assert a["hash"] == b["hash"] and len(a["hash"]) == 64
    assert Path(a["path"]).name == Path(b["path"]).name == f"transitions-{a['hash'][:16]}.parquet"
    assert Path(a["manifest_path"]).read_text() == Path(b["manifest_path"]).read_text()
    # anything that changes the content or the inputs changes the hash
    other_src = export_dataset(frame, SPEC, {"rollouts": {"seeds": [0]}}, tmp_path / "c")
    bumped = frame.with_columns(
        pl.when(pl.int_range(pl.len()) == 3)
        .then(pl.col("reward") - 1e-9)
        .otherwise(pl.col("reward"))
        .alias("reward")
    )
    inputs = {k: a[k] for k in ("format", "version", "sources", "obs_spec")}
    assert len({a["hash"], other_src["hash"], content_hash(bumped, inputs)}) == 3
    assert content_hash(frame, inputs) == a["hash"]


def test_manifest_and_round_trip(frame: pl.DataFrame, tmp_path: Path) -> None:
    m = export_dataset(frame, SPEC, SOURCES, tmp_path)
    on_disk = json.loads(Path(m["manifest_path"]).read_text())
    assert on_disk["sources"] == SOURCES
    assert on_disk["obs_spec"]["version"] == SPEC.version == on_disk["obs_spec_version"]
    counts = on_disk["counts"]
    assert counts["transitions"] == frame.height
    assert counts["episodes"] == frame["episode"].n_unique() == 8
    assert counts["by_source"] == {"rollout": {"transitions": frame.height, "episodes": 8}}
    assert set(counts["by_behaviour"]) == {"fifo", "best_fit+eps0.3"}
    df, manifest = read_dataset(m["path"])
    assert df.equals(canonical_frame(frame))
    assert manifest["hash"] == m["hash"]
    # a changed file no longer matches its manifest
    df.with_columns(pl.col("action").reverse()).write_parquet(m["path"])
    with pytest.raises(ValueError, match="hash"):
        read_dataset(m["manifest_path"])


def test_report_counts(frame: pl.DataFrame) -> None:
    rep = dataset_report(frame, SPEC)
    acts = rep["actions"]
    n_wait = int((frame["action"] == CONFIG.wait_action).sum())
    assert acts["wait_share"] == pytest.approx(n_wait / frame.height)
    assert sum(acts["by_slot"]) == sum(acts["by_candidate"].values()) == frame.height - n_wait
    attempts = frame.filter(pl.col("match").is_in(["exact", "nearest", "unslotted"]))
    exact = int((attempts["match"] == "exact").sum())
    assert rep["exact_match_share"] == pytest.approx(exact / attempts.height)
    assert rep["match_kinds"]["policy"] > 0


def test_mdp_dataset_round_trip(frame: pl.DataFrame) -> None:
    ds = to_mdp_dataset(frame, SPEC)
    canon = canonical_frame(frame)
    episodes = canon["episode"].unique(maintain_order=True).to_list()
    assert ds.dataset_info.action_size == SPEC.n_actions == CONFIG.n_actions
    assert ds.size() == len(episodes)
    cut = frame.group_by("episode").agg(pl.col("timeout").any()).filter("timeout").height
    assert 0 < cut < len(episodes)
    for ep, name in zip(ds.episodes, episodes, strict=True):
        rows = canon.filter(pl.col("episode") == name)
        assert ep.observations.shape == (rows.height, SPEC.dim)
        np.testing.assert_array_equal(ep.actions.ravel(), rows["action"].to_numpy())
        np.testing.assert_allclose(ep.rewards.ravel(), rows["reward"].to_numpy(), rtol=1e-6)
        np.testing.assert_array_equal(
            ep.observations[0], np.asarray(rows["obs"][0].to_list(), dtype=np.float32)
        )
        assert bool(ep.terminated) == bool(rows["terminal"][-1])
    with pytest.raises(ValueError, match="features"):
        to_mdp_dataset(frame, make_spec(MdpConfig(k_slots=5)))


def test_one_step_cut_episodes_are_left_out_and_the_rest_line_up(frame: pl.DataFrame) -> None:
    """A log window cut after one step gives d3rlpy no transition (no next state): it is left
    out, and every other episode keeps its own times and rewards (they used to shift)."""
    canon = canonical_frame(frame)
    first = canon["episode"][0]
    row = canon.filter(pl.col("episode") == first).head(1)
    lone = row.with_columns(
        pl.lit("log/lone").alias("episode"),
        pl.lit(False).alias("terminal"),
        pl.lit(True).alias("timeout"),
    )
    with_lone = pl.concat([lone, frame], how="vertical_relaxed")
    ds = to_mdp_dataset(with_lone, SPEC, masks=True)
    plain = to_mdp_dataset(frame, SPEC, masks=True)
    assert ds.size() == plain.size() == canon["episode"].n_unique()
    for a, b in zip(ds.episodes, plain.episodes, strict=True):
        np.testing.assert_array_equal(a.rewards, b.rewards)
        np.testing.assert_array_equal(a.dts, b.dts)
    with pytest.raises(ValueError, match="no episode has a transition"):
        to_mdp_dataset(lone, SPEC)


def test_mdp_dataset_with_masks(frame: pl.DataFrame) -> None:
    """``masks=True``: each observation is (obs, mask); a transition's next observation
    carries the next step's mask; a terminal's next observation allows nothing."""
    ds = to_mdp_dataset(frame, SPEC, masks=True)
    canon = canonical_frame(frame)
    for ep, name in zip(ds.episodes, canon["episode"].unique(maintain_order=True), strict=True):
        rows = canon.filter(pl.col("episode") == name)
        obs, mask = ep.observations
        assert obs.shape == (rows.height, SPEC.dim) and mask.shape == (rows.height, SPEC.n_actions)
        assert mask.dtype == np.float32 and set(np.unique(mask)) <= {0.0, 1.0}
        np.testing.assert_array_equal(mask.astype(bool), np.array(rows["mask"].to_list()))
        t = ds.transition_picker(ep, 0)
        np.testing.assert_array_equal(t.next_observation[1], mask[1])
        last = ds.transition_picker(ep, ep.transition_count - 1)
        if ep.terminated:
            assert last.terminal == 1.0 and not last.next_observation[1].any()
    bad = frame.with_columns(
        pl.when(pl.int_range(pl.len()) == 5)
        .then(pl.col("mask").list.eval(pl.element() & False))
        .otherwise(pl.col("mask"))
        .alias("mask")
    )
    with pytest.raises(ValueError, match="not allowed by their own mask"):
        to_mdp_dataset(bad, SPEC, masks=True)
    to_mdp_dataset(bad, SPEC)  # without masks, the mask column is not read


def test_logged_to_mlflow_as_a_dataset_input(
    frame: pl.DataFrame, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MLFLOW_DISABLE_TELEMETRY", "true")
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    m = export_dataset(frame, SPEC, SOURCES, tmp_path / "ds")
    assert log_to_mlflow(m["path"], m) is None  # no tracking URI: nothing logged
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    run_id = log_to_mlflow(m["path"], m)
    assert run_id is not None
    from mlflow.tracking import MlflowClient

    run = MlflowClient(uri).get_run(run_id)
    (inp,) = run.inputs.dataset_inputs
    assert inp.dataset.digest == m["hash"][:16]
    assert inp.dataset.name == f"transitions-{m['hash'][:16]}"
    assert Path(m["path"]).resolve().as_uri() in inp.dataset.source
    assert run.data.tags["linkwise.dataset.hash"] == m["hash"]
    assert run.data.tags["linkwise.dataset.transitions"] == str(frame.height)
    assert run.info.status == "FINISHED"
