"""The online baseline: MaskablePPO trains in the simulator on bootstrapped windows of the real
Philly arrivals, never takes a masked action, is packaged like the offline learners, reloads
through ``models.learned`` and decides exactly as the trained model does."""

from __future__ import annotations

import dataclasses
import math
import tempfile
from glob import glob
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from linkwise.cluster.env import ClusterEnv
from linkwise.cluster.mdp import MdpConfig, make_spec
from linkwise.cluster.topology.spec import from_spec
from linkwise.models.learned import load_package, verify_checksums
from linkwise.models.ppo import (
    PpoConfig,
    PpoEnvConfig,
    PpoParams,
    build_ppo,
    learn,
    make_vec_env,
    save_ppo_package,
    select_windows,
    workload_manifest,
    workloads,
)
from linkwise.pipelines.ppo import train_ppo

REPO = Path(__file__).resolve().parents[2]
PHILLY = REPO.parent / "shared" / "data" / "traces" / "philly_2017-09-04_2017-10-15.csv"
ENV = PpoEnvConfig(
    trace=str(PHILLY),
    topology="4x8,leaf=2",
    window_s=3600.0,
    block_s=600.0,
    min_jobs=15,
    max_jobs=30,
    n_windows=3,
    train_days=28,  # from the trace's first submit; the busy part starts on day 20
    max_steps=2000,
    eval_episodes=2,
    mdp=MdpConfig(k_slots=4),
)
PARAMS = PpoParams(
    total_timesteps=3072,
    n_steps=256,
    batch_size=64,
    learning_rate=1e-3,
    ent_coef=0.0,
    hidden_units=(64, 64),
)
SPEC = make_spec(ENV.mdp)


@pytest.fixture(scope="module")
def trained() -> dict[str, Any]:
    """A MaskablePPO trained for 3072 environment steps on three tiny busy hours."""
    import torch

    torch.set_num_threads(1)
    factory = workloads(ENV)
    vec = make_vec_env(factory, SPEC, PARAMS, 0, ENV.max_steps)
    model = build_ppo(vec, PARAMS, 0)
    history = learn(model, PARAMS.total_timesteps)
    vec.close()
    return {"model": model, "history": history, "factory": factory}


def _observations(factory: Any, n_episodes: int = 2) -> tuple[np.ndarray, np.ndarray]:
    """Observations and masks met by best_fit on fresh workloads (states PPO may not know)."""
    from linkwise.cluster.mdp import StepPolicyAdapter
    from linkwise.policies.heuristics import make_policy

    obs, masks = [], []
    for seed in range(n_episodes):
        env = ClusterEnv(factory, SPEC, max_steps=300)
        o, info = env.reset(seed=100 + seed)
        adapter = StepPolicyAdapter(make_policy("best_fit"))
        while True:
            obs.append(o)
            masks.append(info["action_mask"])
            o, _, term, trunc, info = env.step(adapter.act(env.candidates))
            if term or trunc:
                break
    return np.asarray(obs, dtype=np.float32), np.asarray(masks, dtype=bool)


def test_training_learns_without_masked_actions(trained: dict[str, Any]) -> None:
    history = trained["history"]
    assert trained["model"].num_timesteps >= PARAMS.total_timesteps
    returns = [h["ep_return_mean"] for h in history if "ep_return_mean" in h]
    assert len(returns) >= 5 and all(math.isfinite(r) for r in returns)
    # the environment raises InvalidAction on a masked action: training finishing proves none
    # was taken. The critic learns the return (explained variance up, value loss down). The
    # return itself is not asserted to rise in this 3k-step budget: with the observation
    # holding predicted run times instead of the true ones (issue 15) it stays within the
    # episodes' noise here (first -783, mean of the last three -792 on 2026-12-01); the
    # evaluation is where PPO is compared.
    updates = [h for h in history if "train.explained_variance" in h]
    assert len(updates) >= 5
    ev = [h["train.explained_variance"] for h in updates]
    loss = [h["train.value_loss"] for h in updates]
    assert np.mean(ev[-3:]) > ev[0] + 0.2 and np.mean(loss[-3:]) < loss[0] / 2
    assert all(h["env_steps_per_s"] > 0 for h in history)


def test_package_reloads_and_decides_like_the_model(
    trained: dict[str, Any], tmp_path: Path
) -> None:
    model, factory = trained["model"], trained["factory"]
    manifest = workload_manifest(ENV, factory)
    pkg = save_ppo_package(model, SPEC, manifest, tmp_path / "pkg", meta={"run_id": "test"})
    verify_checksums(pkg)
    policy = load_package(pkg)
    assert policy.meta["algo"] == "MaskablePPO" and policy.values == "logits"
    assert policy.meta["dataset_hash"] == manifest["hash"]
    obs, masks = _observations(factory)
    assert len(obs) > 20 and (masks[:, :-1].sum(axis=1) > 1).any()
    expected, _ = model.predict(obs, action_masks=masks, deterministic=True)
    served = policy.act_batch(obs, masks)
    assert np.array_equal(served, expected)
    assert masks[np.arange(len(obs)), served].all()
    # the packaged policy drives the environment (which raises on masked actions) to the end
    env = ClusterEnv(factory, SPEC, invalid_action="raise", max_steps=400)
    o, info = env.reset(seed=7)
    steps = 0
    while True:
        a = policy.act(o, info["action_mask"])
        assert info["action_mask"][a]
        o, _, term, trunc, info = env.step(a)
        steps += 1
        if term or trunc:
            break
    assert steps > 1
    with pytest.raises(FileExistsError):
        save_ppo_package(model, SPEC, manifest, tmp_path / "pkg")


def test_train_ppo_pipeline_registers_and_reports(tmp_path: Path) -> None:
    cfg = PpoConfig(
        name="test-ppo",
        env=ENV,
        params=dataclasses.replace(PARAMS, total_timesteps=512, n_steps=256),
        seed=0,
    )
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    r = train_ppo(cfg, tracking_uri=uri, out_dir=tmp_path / "out", progress=False)
    assert r.timesteps >= 512 and r.env_steps_per_s > 0
    assert r.model_name == "linkwise-ppo" and r.model_version == "1" and r.alias == "challenger"
    assert set(r.evaluation) == {"ppo", "best_fit", "random"}
    for stats in r.evaluation.values():
        assert {"return", "mean_jct_s", "finished", "steps"} <= set(stats)
    assert r.metrics["masked_actions_taken"] == 0.0
    policy = load_package(r.package_dir)
    assert policy.spec == SPEC

    from linkwise.models.registry import load_policy

    again = load_policy("models:/linkwise-ppo@challenger", tracking_uri=uri)
    obs, masks = _observations(workloads(ENV), 1)
    assert np.array_equal(again.act_batch(obs, masks), policy.act_batch(obs, masks))


def test_shipped_config_parses() -> None:
    cfg = PpoConfig.from_toml(REPO / "models" / "experiments" / "ppo.toml")
    assert cfg.env.mdp.k_slots == 4 and Path(cfg.env.trace).is_file()
    assert cfg.params.total_timesteps > 0 and cfg.model_name == "linkwise-ppo"
    assert len(cfg.digest()) == 64
    with pytest.raises(ValueError, match="unknown keys"):
        PpoConfig.from_mapping({"env": {"trace": "x", "bogus": 1}})


def test_building_and_learning_writes_no_sb3_log_folder() -> None:
    import torch

    torch.set_num_threads(1)
    pattern = str(Path(tempfile.gettempdir()) / "SB3-*")
    before = set(glob(pattern))
    params = dataclasses.replace(PARAMS, total_timesteps=128, n_steps=64, batch_size=32)
    vec = make_vec_env(workloads(ENV), SPEC, params, 0, ENV.max_steps)
    model = build_ppo(vec, params, 0)
    history = learn(model, params.total_timesteps)
    vec.close()
    assert set(glob(pattern)) == before
    assert model.logger.dir is None and model.logger.output_formats == []
    assert len(history) == 2 and "train.loss" in history[-1]  # metrics still reach the hook


def test_train_days_count_from_the_traces_first_submit() -> None:
    """The training windows end within ``train_days`` of the trace's first job, even though
    the first eligible window starts on day 20 (so later weeks stay held out)."""
    from linkwise.datasets.rollouts import jobs_from_trace

    first = float(jobs_from_trace(PHILLY)["submit_time"].min())  # type: ignore[arg-type]
    for days in (21.0, 28.0):
        env = dataclasses.replace(ENV, train_days=days, n_windows=50, max_jobs=None)
        wins = select_windows(env, from_spec(env.topology))
        assert wins and max(w.end for w in wins) <= first + days * 86400.0 + 1e-6
    with pytest.raises(ValueError, match="no window"):
        select_windows(dataclasses.replace(ENV, train_days=5.0), from_spec(ENV.topology))
