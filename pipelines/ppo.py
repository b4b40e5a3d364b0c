"""Train the DeepShare-style online baseline (MaskablePPO in the simulator), track it in
MLflow and register it.

``train_ppo`` is the plain function, ``linkwise train-ppo --config FILE``
(``linkwise/cli/train.py``) its command. Steps:

1. Read the TOML configuration (``models.ppo.PpoConfig``); pick the trace windows.
2. One MLflow run: the configuration, the workload hash and the training windows as
   parameters, the TOML as an artifact; after every PPO rollout the mean episode return,
   episode length, environment steps/s and the update's losses as metrics.
3. Train MaskablePPO (masked actions raise in the environment: never taken).
4. Evaluate on fresh seeds of the same windows: PPO (through the exported network, as it
   will be served) against best_fit and random, undiscounted return and mean JCT.
5. Package (``models.learned`` format) into ``OUT/packages/RUN_ID``; log it as a pyfunc model
   and register it as ``linkwise-ppo`` (the configuration's ``model_name``) with alias
   ``challenger``.
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from linkwise.cluster.mdp import make_spec
from linkwise.cluster.metrics import duration_text
from linkwise.models.learned import load_package
from linkwise.models.ppo import (
    PpoConfig,
    build_ppo,
    compare_returns,
    learn,
    make_vec_env,
    save_ppo_package,
    workload_manifest,
    workloads,
)
from linkwise.models.registry import default_tracking_uri, mlflow_env
from linkwise.pipelines._run import summary_footer, training_run
from linkwise.pipelines.train import progress_bar

__all__ = ["PpoResult", "format_ppo_result", "train_ppo"]

EVAL_SEED_BASE = 1_000_000  # evaluation episodes use seeds the training never drew first


@dataclass(frozen=True)
class PpoResult:
    """What a PPO training run produced."""

    run_id: str
    experiment_id: str
    tracking_uri: str
    name: str
    workload_hash: str
    obs_spec_version: str
    package_dir: str
    model_uri: str
    model_name: str | None
    model_version: str | None
    alias: str | None
    windows: tuple[int, ...]
    timesteps: int
    seconds: float
    env_steps_per_s: float
    metrics: dict[str, float] = field(default_factory=dict)
    evaluation: dict[str, dict[str, float]] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def train_ppo(
    config: str | Path | PpoConfig,
    *,
    tracking_uri: str | None = None,
    out_dir: str | Path = "linkwise-out/train",
    register: bool | None = None,
    progress: bool = True,
) -> PpoResult:
    """Train MaskablePPO as configured, evaluate it, package, log and (unless ``register`` is
    False or the configuration says so) register it with alias ``challenger``."""

    mlflow_env()
    t0 = time.perf_counter()
    cfg = config if isinstance(config, PpoConfig) else PpoConfig.from_toml(config)
    out = Path(out_dir).resolve()
    uri = tracking_uri or default_tracking_uri()
    spec = make_spec(cfg.env.mdp)
    factory = workloads(cfg.env)
    manifest = workload_manifest(cfg.env, factory)

    # MLflow takes about a second to import: only where a run or the registry is used
    import mlflow

    params = {
        "workload.hash": str(manifest["hash"]),
        "workload.trace_sha256": str(manifest["trace_sha256"]),
        "workload.windows": ",".join(str(w.window_id) for w in factory.windows),
        "obs_spec_version": spec.version,
    }
    with training_run(
        cfg, tracking_uri=uri, algo="ppo", data_hash=manifest["hash"], params=params
    ) as run:
        # torch takes seconds to import: only where a network is built, exported or read
        import torch

        saved_threads = torch.get_num_threads()
        torch.set_num_threads(cfg.params.torch_threads)
        vec = make_vec_env(factory, spec, cfg.params, cfg.seed, cfg.env.max_steps)
        try:
            model = build_ppo(vec, cfg.params, cfg.seed, cfg.device)
            total = cfg.params.total_timesteps
            with progress_bar(progress) as bar:
                task = bar.add_task(f"ppo {cfg.name}", total=total, info="")

                def on_rollout(steps: int, m: dict[str, float]) -> None:
                    finite = {k: v for k, v in m.items() if math.isfinite(v)}
                    mlflow.log_metrics(finite, step=steps)
                    ret = m.get("ep_return_mean")
                    info = f"return {ret:.1f}" if ret is not None else ""
                    bar.update(task, completed=min(steps, total), info=info)

                t_fit = time.perf_counter()
                history = learn(model, total, on_rollout)
                fit_s = time.perf_counter() - t_fit
        finally:
            vec.close()
            torch.set_num_threads(saved_threads)
        steps_done = int(model.num_timesteps)
        final: dict[str, float] = {
            "env_steps_per_s": steps_done / fit_s if fit_s > 0 else math.nan,
            "train_seconds": fit_s,
            "masked_actions_taken": 0.0,  # the environment raises on any
        }
        if history:
            final.update({k: v for k, v in history[-1].items() if k.startswith("ep_")})

        pkg = save_ppo_package(
            model,
            spec,
            manifest,
            out / "packages" / run.run_id,
            meta=run.package_meta(),
        )
        served = load_package(pkg)
        evaluation: dict[str, dict[str, float]] = {}
        if cfg.env.eval_episodes > 0:
            seeds = [EVAL_SEED_BASE + cfg.seed * 1000 + i for i in range(cfg.env.eval_episodes)]
            evaluation = compare_returns(
                factory,
                spec,
                {"ppo": served.act, "best_fit": "best_fit", "random": "random"},
                seeds,
                cfg.env.max_steps,
            )
            for pol, stats in evaluation.items():
                for k, v in stats.items():
                    final[f"eval.{pol}.{k}"] = v
        run.log_final(final, steps_done)
        reg = run.register_package(pkg, register)
    return PpoResult(
        run_id=run.run_id,
        experiment_id=run.experiment_id,
        tracking_uri=uri,
        name=cfg.name,
        workload_hash=str(manifest["hash"]),
        obs_spec_version=spec.version,
        package_dir=str(pkg),
        model_uri=reg.model_uri,
        model_name=reg.name,
        model_version=reg.version,
        alias=reg.alias,
        windows=tuple(w.window_id for w in factory.windows),
        timesteps=steps_done,
        seconds=time.perf_counter() - t0,
        env_steps_per_s=final["env_steps_per_s"],
        metrics={k: float(v) for k, v in final.items()},
        evaluation=evaluation,
    )


# ------------------------------------------------------------------------ CLI


def format_ppo_result(r: PpoResult) -> str:
    """The human-readable summary, ending with the MLflow run id."""
    lines = [
        f"trained MaskablePPO '{r.name}' for {r.timesteps} env steps in {r.seconds:.1f} s "
        f"({r.env_steps_per_s:.0f} env steps/s while training)",
        f"  workload {r.workload_hash[:16]}: windows {list(r.windows)}; "
        f"obs spec {r.obs_spec_version}",
    ]
    if "ep_return_mean" in r.metrics:
        lines.append(f"  last episodes' mean return {r.metrics['ep_return_mean']:.2f}")
    if r.evaluation:
        lines.append("  evaluation on fresh workloads (mean return, mean JCT):")
        for pol, s in r.evaluation.items():
            lines.append(f"    {pol:<10} {s['return']:10.2f} {duration_text(s['mean_jct_s']):>10}")
    lines.extend(summary_footer(r))
    return "\n".join(lines)
