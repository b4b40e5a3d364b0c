"""The learned policies of an experiment: DiscreteBC and DiscreteCQL on the dataset it built
(``models/experiments/demo_bc.toml``, ``demo_cql.toml`` with the experiment's steps; CQL ends
as ``@challenger``), and the DeepShare-style online baseline, MaskablePPO in the simulator on
the workload's training days (``ppo.toml``), registered as ``linkwise-ppo``."""

from __future__ import annotations

import math
import tomllib
from dataclasses import replace
from pathlib import Path
from typing import Any

from rich.console import Console

from linkwise.models.ppo import PpoConfig
from linkwise.models.registry import MODEL_NAME
from linkwise.models.training import TrainConfig
from linkwise.pipelines.experiment import Experiment, TrainingPlan
from linkwise.pipelines.ppo import train_ppo
from linkwise.pipelines.train import train

__all__ = ["CONFIGS", "heldout_share", "train_config", "train_offline", "train_online"]

CONFIGS = Path(__file__).resolve().parents[1] / "models" / "experiments"
BC_TOML = CONFIGS / "demo_bc.toml"
CQL_TOML = CONFIGS / "demo_cql.toml"
PPO_TOML = CONFIGS / "ppo.toml"


def train_config(
    toml: str | Path, dataset_path: str, *, n_steps: int, per_epoch: int
) -> TrainConfig:
    """A training configuration: the TOML with the built dataset and ``n_steps`` (a whole
    number of epochs of ``per_epoch`` steps, at least one)."""
    data = tomllib.loads(Path(toml).read_text())
    data["dataset"] = {**data.get("dataset", {}), "path": dataset_path}
    per = min(per_epoch, n_steps)
    steps = max(per, n_steps // per * per)
    data["train"] = {**data.get("train", {}), "n_steps": steps, "n_steps_per_epoch": per}
    return TrainConfig.from_mapping(data, base=Path(toml).parent, source=str(toml))


def heldout_share(dataset_path: str) -> float:
    """The share of the dataset's episodes training held out (CQL's; FQE runs on them)."""
    return float(train_config(CQL_TOML, dataset_path, n_steps=1, per_epoch=1).dataset.holdout)


def train_offline(
    dataset_path: str,
    plan: TrainingPlan,
    *,
    seed: int,
    uri: str,
    out: Path,
    console: Console,
) -> dict[str, dict[str, Any]]:
    """BC, then CQL (``@challenger``) on the dataset; their model entries by algorithm."""
    models: dict[str, dict[str, Any]] = {}
    for algo, toml, steps in (("bc", BC_TOML, plan.bc_steps), ("cql", CQL_TOML, plan.cql_steps)):
        cfg = train_config(toml, dataset_path, n_steps=steps, per_epoch=plan.steps_per_epoch)
        res = train(replace(cfg, seed=seed), tracking_uri=uri, out_dir=out / "train")
        models[algo] = {
            "model_name": MODEL_NAME,
            "version": res.model_version,
            "run_id": res.run_id,
            "package_dir": res.package_dir,
            "steps": res.steps,
            "seconds": res.seconds,
            "heldout_action_match": res.metrics.get("heldout_action_match"),
            "heldout_chance": res.metrics.get("heldout_chance"),
        }
        console.print(
            f"{algo}: version {res.model_version}, {res.steps} steps in {res.seconds:.0f} s, "
            f"held-out action match {res.metrics.get('heldout_action_match', math.nan):.3f}"
        )
    return models


def train_online(
    trace: str,
    experiment: Experiment,
    train_days: float,
    *,
    seed: int,
    uri: str,
    out: Path,
    console: Console,
    predictor: str | Path | None = None,
) -> dict[str, Any]:
    """MaskablePPO in the simulator on the trace's first ``train_days`` days (the dataset's
    span, so the evaluation windows stay held out), on the experiment's cluster, windows and
    decision problem, its jobs annotated by the run-time predictor JSON ``predictor`` (the
    dataset's; None: one fit on those days); its model entry (registered as
    ``linkwise-ppo``)."""
    assert experiment.training is not None
    w = experiment.windows
    base = tomllib.loads(PPO_TOML.read_text())
    env = {
        **base["env"],
        "trace": trace,
        "topology": experiment.topology,
        "window_s": w.window_s,
        "block_s": w.block_s,
        "min_jobs": w.min_jobs,
        "max_jobs": None,
        "train_days": train_days,
        "predictor": str(predictor) if predictor is not None else None,
        "mdp": experiment.mdp.to_json(),
    }
    n_steps = int(base["train"]["n_steps"])
    total = max(n_steps, experiment.training.ppo_steps // n_steps * n_steps)
    data = {**base, "seed": seed, "env": env, "train": {**base["train"], "total_timesteps": total}}
    cfg = PpoConfig.from_mapping(data, base=CONFIGS, source=str(PPO_TOML))
    res = train_ppo(cfg, tracking_uri=uri, out_dir=out / "train", progress=False)
    console.print(
        f"ppo: {res.model_name} version {res.model_version}, {res.timesteps} steps in "
        f"{res.seconds:.0f} s ({res.env_steps_per_s:.0f} env steps/s), "
        f"on windows {list(res.windows)}"
    )
    return {
        "model_name": res.model_name,
        "version": res.model_version,
        "run_id": res.run_id,
        "package_dir": res.package_dir,
        "steps": res.timesteps,
        "seconds": res.seconds,
        "windows": list(res.windows),
        "train_days": train_days,
        "evaluation": res.evaluation,
    }
