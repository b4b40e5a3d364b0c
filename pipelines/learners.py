"""The learned policies of an experiment: DiscreteBC and DiscreteCQL on the dataset it built
(``models/experiments/demo_bc.toml``, ``demo_cql.toml`` with the experiment's steps and
``[train]`` overrides; CQL ends as ``@challenger``), and the DeepShare-style online baseline,
MaskablePPO in the simulator on the workload's training days (``ppo.toml``), registered as
``linkwise-ppo``.

Without validation windows (``TrainingPlan.validation_windows`` 0) each of BC and CQL is one
``pipelines.train.train`` run and its last step is the package. With them, every training
seed (and for CQL every alpha of ``cql_alphas``) is one run that writes a package each
``steps_per_epoch`` steps (``train_checkpoints``); the caller's ``validate`` scores them all
(average JCT on the validation windows, ``pipelines.selection``) and the best one is registered."""

from __future__ import annotations

import math
import time
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from rich.console import Console

from linkwise.models.ppo import PpoConfig
from linkwise.models.registry import log_policy
from linkwise.models.training import (
    TrainConfig,
)
from linkwise.pipelines.experiment import Experiment, TrainingPlan
from linkwise.pipelines.ppo import train_ppo
from linkwise.pipelines.selection import Candidate, log_selection, select
from linkwise.pipelines.train import train
from linkwise.policies.source import MODEL_NAME

__all__ = [
    "CONFIGS",
    "Validate",
    "candidate_configs",
    "heldout_share",
    "train_checkpoints",
    "train_config",
    "train_offline",
    "train_online",
]

CONFIGS = Path(__file__).resolve().parents[1] / "models" / "experiments"
BC_TOML = CONFIGS / "demo_bc.toml"
CQL_TOML = CONFIGS / "demo_cql.toml"
PPO_TOML = CONFIGS / "ppo.toml"

# label -> package folder  ->  label -> validation average JCT (None: a failed candidate)
Validate = Callable[[Mapping[str, str]], Mapping[str, float | None]]


def train_config(
    toml: str | Path,
    dataset_path: str,
    *,
    n_steps: int,
    per_epoch: int,
    overrides: Mapping[str, Any] | None = None,
) -> TrainConfig:
    """A training configuration: the TOML with the built dataset, its ``[train]`` table
    updated by ``overrides`` and ``n_steps`` (a whole number of epochs of ``per_epoch``
    steps, at least one)."""
    data = tomllib.loads(Path(toml).read_text())
    data["dataset"] = {**data.get("dataset", {}), "path": dataset_path}
    per = min(per_epoch, n_steps)
    steps = max(per, n_steps // per * per)
    data["train"] = {
        **data.get("train", {}),
        **(overrides or {}),
        "n_steps": steps,
        "n_steps_per_epoch": per,
    }
    return TrainConfig.from_mapping(data, base=Path(toml).parent, source=str(toml))


def heldout_share(dataset_path: str) -> float:
    """The share of the dataset's episodes training held out (CQL's; FQE runs on them)."""
    return float(train_config(CQL_TOML, dataset_path, n_steps=1, per_epoch=1).dataset.holdout)


def candidate_configs(
    algo: str, dataset_path: str, plan: TrainingPlan, seed: int
) -> list[TrainConfig]:
    """The runs of one algorithm: a configuration per training seed (``seed`` plus each of
    ``plan.train_seeds``) and, for CQL, per alpha of ``plan.cql_alphas`` (alphas outer)."""
    toml, steps = (BC_TOML, plan.bc_steps) if algo == "bc" else (CQL_TOML, plan.cql_steps)
    base = train_config(
        toml, dataset_path, n_steps=steps, per_epoch=plan.steps_per_epoch, overrides=plan.train
    )
    alphas = plan.cql_alphas if algo == "cql" and plan.cql_alphas else (base.params.alpha,)
    return [
        replace(base, seed=seed + offset, params=replace(base.params, alpha=float(alpha)))
        for alpha in alphas
        for offset in plan.train_seeds
    ]


def train_checkpoints(cfg: TrainConfig, *, uri: str, out: Path) -> list[Candidate]:
    """Train ``cfg`` (``pipelines.train.train``, nothing registered) with a package every
    ``n_steps_per_epoch`` steps into ``out/packages/RUN_ID/step_NNNNNN``: the checkpoints in
    step order, each with its held-out action match."""
    res = train(
        cfg,
        tracking_uri=uri,
        out_dir=out,
        register=False,
        progress=False,
        checkpoint_every=cfg.params.n_steps_per_epoch,
    )
    return [
        Candidate(
            algo=cfg.algo,
            seed=cfg.seed,
            alpha=cfg.params.alpha if cfg.algo == "cql" else None,
            step=c.step,
            package_dir=c.package_dir,
            run_id=res.run_id,
            seconds=c.seconds,
            heldout_action_match=c.heldout.get("heldout_action_match"),
            heldout_chance=c.heldout.get("heldout_chance"),
        )
        for c in res.checkpoints
    ]


def train_offline(
    dataset_path: str,
    plan: TrainingPlan,
    *,
    seed: int,
    uri: str,
    out: Path,
    console: Console,
    validate: Validate | None = None,
) -> dict[str, dict[str, Any]]:
    """BC, then CQL (``@challenger``) on the dataset; their model entries by algorithm. With
    ``plan.validation_windows`` every checkpoint of every candidate run is scored by
    ``validate`` and the best is registered (the entry's ``selection`` says which and lists
    them all)."""
    if plan.validation_windows and validate is None:
        raise ValueError("validation_windows > 0 needs a validate function")
    models: dict[str, dict[str, Any]] = {}
    for algo in ("bc", "cql"):
        cfgs = candidate_configs(algo, dataset_path, plan, seed)
        if validate is None:
            models[algo] = _train_last(cfgs[0], uri=uri, out=out)
        else:
            models[algo] = _train_selected(cfgs, validate, uri=uri, out=out, console=console)
        m = models[algo]
        console.print(
            f"{algo}: version {m['version']}, {m['steps']} steps in {m['seconds']:.0f} s, "
            f"held-out action match {m['heldout_action_match'] or math.nan:.3f}"
        )
    return models


def _train_last(cfg: TrainConfig, *, uri: str, out: Path) -> dict[str, Any]:
    """One run, its last step registered: the model entry."""
    res = train(cfg, tracking_uri=uri, out_dir=out / "train", progress=False)
    return {
        "model_name": MODEL_NAME,
        "version": res.model_version,
        "run_id": res.run_id,
        "package_dir": res.package_dir,
        "steps": res.steps,
        "seconds": res.seconds,
        "heldout_action_match": res.metrics.get("heldout_action_match"),
        "heldout_chance": res.metrics.get("heldout_chance"),
    }


def _train_selected(
    cfgs: list[TrainConfig], validate: Validate, *, uri: str, out: Path, console: Console
) -> dict[str, Any]:
    """Every configuration with checkpoints, each checkpoint scored by ``validate``, the
    best registered (``cfg.model_name``, ``@challenger``): the model entry with its
    ``selection``."""
    t0 = time.perf_counter()
    candidates = [c for cfg in cfgs for c in train_checkpoints(cfg, uri=uri, out=out / "train")]
    train_s = time.perf_counter() - t0
    scores = validate({c.label: c.package_dir for c in candidates})
    validate_s = time.perf_counter() - t0 - train_s
    selection = select(candidates, scores, train_s=train_s, validate_s=validate_s)
    best = selection.chosen
    name = cfgs[0].model_name if cfgs[0].register else None
    reg = log_policy(best.package_dir, run_id=best.run_id, tracking_uri=uri, name=name)
    files = log_selection(selection, uri=uri, out=out / f"selection_{best.algo}")
    console.print(selection.format())
    return {
        "model_name": reg.name,
        "version": reg.version,
        "run_id": best.run_id,
        "package_dir": best.package_dir,
        "steps": best.step,
        "seconds": selection.train_s + selection.validate_s,
        "heldout_action_match": best.heldout_action_match,
        "heldout_chance": best.heldout_chance,
        "seed": best.seed,
        "alpha": best.alpha,
        "selection": {**selection.to_json(), "files": files},
    }


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
