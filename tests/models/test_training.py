"""Training: TOML configurations, DiscreteBC imitating one heuristic on held-out episodes,
DiscreteCQL with its evaluators, every d3rlpy metric in MLflow, nothing in the working
directory, and the learned policy in the simulator (never a masked action)."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pytest

from linkwise.cluster.contention import AnalyticModel
from linkwise.cluster.mdp import MdpConfig, MdpPolicy, make_spec
from linkwise.cluster.profiles import assign_profiles, load_calibration
from linkwise.cluster.topology.load import load_topology
from linkwise.cluster.topology.spec import from_spec
from linkwise.datasets.export import export_dataset
from linkwise.datasets.prediction import predictor_record
from linkwise.datasets.rollouts import cut_windows, jobs_from_trace, make_tasks, run_rollouts
from linkwise.datasets.windows import choose_windows
from linkwise.evaluation.compare import Scenario, run_policy
from linkwise.models.learned import load_package, masked_argmax
from linkwise.models.training import (
    AlgoConfig,
    DatasetConfig,
    TrainConfig,
    split_episodes,
)
from linkwise.pipelines.train import TrainResult, train
from linkwise.policies.spec import PolicySpec

REPO = Path(__file__).resolve().parents[2]
DATA = REPO.parent / "shared" / "data"
PHILLY = DATA / "traces" / "philly_2017-09-04_2017-10-15.csv"
TOPO = "8x8,leaf=2"
CONFIG = MdpConfig(k_slots=4)
SPEC = make_spec(CONFIG)
SMALL = AlgoConfig(
    n_steps=300, n_steps_per_epoch=100, batch_size=64, learning_rate=1e-3, hidden_units=(64, 64)
)


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """best_fit rollouts on six busy hours of the real Philly arrivals, two seeds each."""
    wins = choose_windows(
        cut_windows(jobs_from_trace(PHILLY), 3600.0, max_gpus=64), n=6, min_jobs=20
    )
    tasks = make_tasks(
        wins, [PolicySpec.parse("best_fit")], [0, 1], from_spec(TOPO), config=CONFIG, block_s=600.0
    )
    df = run_rollouts(tasks)
    sources = {
        "rollouts": {"policies": ["best_fit"], "seeds": [0, 1], "trace": "philly"},
        "predictor": predictor_record(tasks[0].predictor, {"fit_on": "the windows' jobs"}),
    }
    return export_dataset(df, SPEC, sources, tmp_path_factory.mktemp("data"))


def _config(dataset: dict[str, Any], algo: str, **params: Any) -> TrainConfig:
    return TrainConfig(
        name=f"test-{algo}",
        algo=algo,
        dataset=DatasetConfig(path=dataset["path"], holdout=0.25),
        params=dataclasses.replace(SMALL, **params),
        seed=0,
        device="cpu",
    )


@pytest.fixture(scope="module")
def bc_run(
    dataset: dict[str, Any], tmp_path_factory: pytest.TempPathFactory
) -> tuple[TrainResult, Path, Path]:
    """BC trained through ``train`` from an empty working directory."""
    root = tmp_path_factory.mktemp("bc")
    cwd = root / "cwd"
    cwd.mkdir()
    old = Path.cwd()
    os.chdir(cwd)
    try:
        result = train(
            _config(dataset, "bc"),
            tracking_uri=f"sqlite:///{root / 'mlflow.db'}",
            out_dir=root / "out",
            progress=False,
        )
    finally:
        os.chdir(old)
    return result, root, cwd


def test_the_dataset_manifest_decides_the_mdp_configuration(
    dataset: dict[str, Any], tmp_path: Path
) -> None:
    from linkwise.pipelines.train import load_training_data

    asks_more = DatasetConfig(path=dataset["path"], mdp={"k_slots": 8, "slot_order": "head"})
    cfg = dataclasses.replace(_config(dataset, "bc"), dataset=asks_more)
    with pytest.raises(ValueError, match="k_slots: dataset 4, experiment 8"):
        load_training_data(cfg, tmp_path)
    agrees = dataclasses.replace(
        cfg, dataset=DatasetConfig(path=dataset["path"], mdp={"k_slots": 4})
    )
    _df, _manifest, spec = load_training_data(agrees, tmp_path)
    assert spec.config == CONFIG
    # what is logged is the manifest's whole configuration, not the partial one asked
    logged = agrees.with_mdp(spec.config).to_json()["dataset"]["mdp"]
    assert logged == CONFIG.to_json() and logged["slot_order"] == CONFIG.slot_order
    with pytest.raises(ValueError, match="unknown MdpConfig fields"):
        DatasetConfig(path=dataset["path"], mdp={"k_slot": 4})


def test_checked_in_configs_load_with_explicit_cql_hyperparameters() -> None:
    bc = TrainConfig.from_toml(REPO / "models" / "experiments" / "bc.toml")
    cql = TrainConfig.from_toml(REPO / "models" / "experiments" / "cql.toml")
    assert (bc.algo, cql.algo) == ("bc", "cql")
    assert bc.dataset.trace is not None and Path(bc.dataset.trace).is_file()
    assert bc.dataset.mdp_config() == CONFIG and "best_fit" in bc.dataset.policies
    p = cql.params
    # not d3rlpy's Atari defaults (batch 32, lr 6.25e-5, target update every 8000 steps)
    assert p.batch_size != 32 and p.learning_rate != 6.25e-5 and p.target_update_interval < 8000
    assert p.target_update_interval <= p.n_steps and p.n_critics >= 1
    assert bc.digest() != cql.digest() and len(bc.digest()) == 64


def test_config_rejects_unknown_keys_and_bad_values() -> None:
    base = {"algo": "bc", "dataset": {"trace": str(PHILLY)}}
    assert TrainConfig.from_mapping(base).params == AlgoConfig()
    with pytest.raises(ValueError, match="unknown keys"):
        TrainConfig.from_mapping({**base, "train": {"learning_rat": 0.1}})
    with pytest.raises(ValueError, match="algo"):
        TrainConfig.from_mapping({**base, "algo": "ppo"})
    with pytest.raises(ValueError, match="multiple"):
        TrainConfig.from_mapping({**base, "train": {"n_steps": 150, "n_steps_per_epoch": 100}})
    with pytest.raises(ValueError, match="exactly one of path"):
        TrainConfig.from_mapping({"algo": "cql", "dataset": {}})


def test_episode_split_is_disjoint_and_deterministic(dataset: dict[str, Any]) -> None:
    df = pl.read_parquet(dataset["path"])
    a_train, a_held = split_episodes(df, 0.25, seed=0)
    _, b_held = split_episodes(df, 0.25, seed=0)
    assert a_held.equals(b_held) and a_train.height + a_held.height == df.height
    held_eps = set(a_held["episode"].unique())
    assert held_eps and held_eps.isdisjoint(set(a_train["episode"].unique()))
    assert len(held_eps) == 3  # ceil(0.25 * 12 episodes)
    assert set(split_episodes(df, 0.25, seed=1)[1]["episode"].unique()) != held_eps


def test_masked_argmax_never_picks_a_masked_action() -> None:
    rng = np.random.default_rng(0)
    values = rng.normal(size=(500, 17)).astype(np.float32)
    values[rng.random(values.shape) < 0.1] = np.nan
    masks = rng.random((500, 17)) < 0.3
    masks[:, -1] = True
    chosen = masked_argmax(values, masks)
    assert masks[np.arange(500), chosen].all()
    best = np.where(masks & ~np.isnan(values), values, -np.inf).max(axis=1)
    finite = np.isfinite(best)
    assert finite.sum() > 400
    assert np.array_equal(values[np.arange(500), chosen][finite], best[finite])
    assert masked_argmax(values[:1], np.zeros((1, 17), dtype=bool))[0] == -1


def test_bc_matches_the_heuristic_on_held_out_episodes(
    bc_run: tuple[TrainResult, Path, Path],
) -> None:
    r, _, _ = bc_run
    m = r.metrics
    print(  # the numbers for the report (pytest -s)
        f"BC held-out: match {m['heldout_action_match']:.3f} chance {m['heldout_chance']:.3f} "
        f"majority {m['heldout_majority']:.3f}; choice steps {m['heldout_choice_match']:.3f} vs "
        f"chance {m['heldout_choice_chance']:.3f}, majority {m['heldout_choice_majority']:.3f}; "
        f"starts {m['heldout_start_match']:.3f}; {r.heldout_transitions} steps"
    )
    assert r.heldout_transitions > 500 and r.train_transitions > 1500
    assert m["heldout_chose_masked"] == 0.0
    assert m["heldout_action_match"] > 0.9
    assert m["heldout_action_match"] > m["heldout_chance"] + 0.25
    assert m["heldout_action_match"] > m["heldout_majority"] + 0.3
    # where the heuristic had a real choice, BC is far above a uniform pick
    assert m["heldout_choice_match"] > m["heldout_choice_chance"] + 0.5
    assert m["heldout_start_match"] > 0.8


def test_every_d3rlpy_metric_and_the_config_land_in_mlflow(
    bc_run: tuple[TrainResult, Path, Path],
) -> None:
    from mlflow.tracking import MlflowClient

    r, root, cwd = bc_run
    client = MlflowClient(tracking_uri=r.tracking_uri)
    run = client.get_run(r.run_id)
    d3 = {"loss", "imitation_loss", "regularization_loss", "time_step", "time_sample_batch",
          "time_algorithm_update", "action_match", "action_match_masked"}  # fmt: skip
    assert d3 <= set(run.data.metrics)
    for key in d3:
        steps = [h.step for h in client.get_metric_history(r.run_id, key)]
        assert steps == [100, 200, 300], key  # one value per epoch
    p = run.data.params
    assert p["dataset.hash"] == r.dataset_hash and len(r.dataset_hash) == 64
    assert p["config.algo"] == "bc" and p["config.params.learning_rate"] == "0.001"
    assert p["d3rlpy.config.params.batch_size"] == "64"  # d3rlpy's own parameters
    # trained on the action masks (the default), and d3rlpy's config says so
    assert p["config.params.masked"] == "True"
    assert p["d3rlpy.config.type"] == "linkwise_masked_discrete_bc"
    assert p["dataset.obs_spec_version"] == SPEC.version
    inputs = run.inputs.dataset_inputs
    assert inputs and inputs[0].dataset.digest == r.dataset_hash[:16]
    # registered as the challenger; experiment artifacts beside the store, not ./mlruns
    mv = client.get_model_version_by_alias("linkwise-policy", "challenger")
    assert str(mv.version) == r.model_version == "1"
    exp = client.get_experiment(r.experiment_id)
    assert exp.artifact_location == (root / "artifacts").resolve().as_uri()
    # d3rlpy and MLflow wrote nothing into the working directory
    assert list(cwd.iterdir()) == []


def test_learned_policy_runs_in_the_simulator_without_masked_actions(
    bc_run: tuple[TrainResult, Path, Path],
) -> None:
    r, _, _ = bc_run
    cal = load_calibration(None)
    policy = load_package(r.package_dir, model=AnalyticModel(cal))
    seen: list[int] = []
    act = policy.act

    def checked(obs: Any, mask: Any) -> int:
        a = act(obs, mask)
        assert mask[a]
        seen.append(a)
        return a

    checked_policy = MdpPolicy(act=checked, spec=policy.spec, model=policy.model)
    win = choose_windows(
        cut_windows(jobs_from_trace(PHILLY), 3600.0, max_gpus=32), n=1, min_jobs=15
    )
    assert policy.predictor is not None  # the package carries the dataset's predictor
    jobs = policy.predictor.annotate(assign_profiles(win[0].jobs, cal, seed=0))
    from linkwise.cluster.simulator.run import simulate

    res = simulate(load_topology("4x8,leaf=2"), jobs, AnalyticModel(cal), checked_policy)
    assert len(res.records) == len(jobs)
    assert seen and any(a != CONFIG.wait_action for a in seen)
    # the same package through the CLI's policy strings (linkwise simulate --policy model:PATH)
    scenario = Scenario(topology=load_topology("4x8,leaf=2"), jobs=tuple(jobs), calibration=cal)
    run = run_policy(scenario, PolicySpec.parse(f"model:{r.package_dir}"))
    assert run.metrics.jobs == len(jobs)


def test_cql_trains_with_td_error_and_initial_state_value(
    dataset: dict[str, Any], tmp_path: Path
) -> None:
    from mlflow.tracking import MlflowClient

    cfg = _config(dataset, "cql", n_steps=200, target_update_interval=50, learning_rate=3e-4)
    r = train(cfg, tracking_uri=f"sqlite:///{tmp_path / 'm.db'}", out_dir=tmp_path / "o",
              register=False, progress=False)  # fmt: skip
    assert r.model_version is None and r.algo == "cql"
    metrics = MlflowClient(tracking_uri=r.tracking_uri).get_run(r.run_id).data.metrics
    for key in ("td_loss", "conservative_loss", "td_error", "initial_state_value",
                "action_match_masked", "heldout_action_match"):  # fmt: skip
        assert key in metrics and np.isfinite(metrics[key]), key
    assert r.metrics["heldout_chose_masked"] == 0.0
    assert load_package(r.package_dir).values == "q"
