"""Train a policy from a configuration file, track it in MLflow and register it.

``train`` is the plain function (tested without Prefect); ``train_flow`` the thin Prefect
flow around it. Steps:

1. Read the TOML configuration (``models.training.TrainConfig``).
2. The dataset: an exported one (``dataset.path``, its content hash verified) or built
   (``pipelines.build_dataset``, serial, into ``OUT/datasets``; content-hashed, so the same
   configuration gives the same file) from the cluster's store (``dataset.db``: its
   accounting's decisions plus warm-started rollouts on the store's cluster, over
   ``[since, until)``) or from rollouts of a trace. Its ObsSpec must match this encoder.
   ``linkwise train --dataset PATH`` or ``--db STORE --since --until`` replace the file's
   source (``DatasetConfig.from_source``).
3. Split by episode into training and held-out transitions.
4. One MLflow run (experiment with an explicit artifact location): the configuration and
   the dataset hash as parameters, the dataset as a run input, the TOML as an artifact;
   d3rlpy's parameters and metrics through ``MlflowAdapterFactory``.
5. Fit DiscreteBC or DiscreteCQL; held-out evaluation (masked action match against the
   logged actions, with the uniform-chance and majority baselines).
6. Package (TorchScript, ObsSpec, manifest, checksums) into ``OUT/packages/RUN_ID``; log it
   as a pyfunc model and register it as ``linkwise-policy`` with alias ``challenger``.

``linkwise train --config FILE`` (``linkwise/cli/train.py``) calls them.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from contextlib import closing
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import polars as pl

from linkwise.cluster.mdp import ObsSpec
from linkwise.cluster.topology.spec import DEFAULT_TOPOLOGY
from linkwise.datasets.export import read_dataset, to_mdp_dataset
from linkwise.datasets.rollouts import jobs_from_store
from linkwise.datasets.store import open_store
from linkwise.models.learned import masked_argmax
from linkwise.models.packaging import save_package
from linkwise.models.registry import default_tracking_uri, mlflow_env
from linkwise.models.training import (
    MlflowAdapterFactory,
    TrainConfig,
    action_values,
    build_algo,
    fit,
    frame_arrays,
    make_evaluators,
    pick_device,
    quiet_d3rlpy,
    split_episodes,
)
from linkwise.parallel import patient_prefect_server
from linkwise.pipelines._run import TrainingRun, summary_footer, training_run
from linkwise.pipelines.build_dataset import build_dataset
from linkwise.policies.spec import PolicySpec

__all__ = [
    "TrainResult",
    "heldout_report",
    "load_training_data",
    "train",
    "train_flow",
    "with_steps",
]


@dataclass(frozen=True)
class Checkpoint:
    """A package written during training (``train(checkpoint_every=)``)."""

    step: int
    package_dir: str
    seconds: float  # training time up to this step
    heldout: dict[str, float] = field(default_factory=dict)  # ``heldout_report`` at this step


@dataclass(frozen=True)
class TrainResult:
    """What a training run produced."""

    run_id: str
    experiment_id: str
    tracking_uri: str
    name: str
    algo: str
    dataset_hash: str
    dataset_path: str
    obs_spec_version: str
    package_dir: str
    model_uri: str
    model_name: str | None
    model_version: str | None
    alias: str | None
    train_transitions: int
    heldout_transitions: int
    steps: int
    seconds: float
    steps_per_s: float
    metrics: dict[str, float] = field(default_factory=dict)
    checkpoints: tuple[Checkpoint, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def with_steps(cfg: TrainConfig, steps: int) -> TrainConfig:
    """``cfg`` trained for ``steps`` steps (``linkwise train --steps``): the epoch length kept
    when it divides them, else one epoch of ``steps``."""
    per_epoch = cfg.params.n_steps_per_epoch
    per_epoch = per_epoch if steps > 0 and steps % per_epoch == 0 else steps
    return replace(cfg, params=replace(cfg.params, n_steps=steps, n_steps_per_epoch=per_epoch))


def load_training_data(
    cfg: TrainConfig, out_dir: str | Path
) -> tuple[pl.DataFrame, dict[str, Any], ObsSpec]:
    """The configuration's transitions, the dataset manifest (with ``path``) and its spec."""

    ds = cfg.dataset
    if ds.db is not None and not Path(ds.db).is_file():
        raise FileNotFoundError(
            f"dataset.db: no store at {Path(ds.db).resolve()}: collect the cluster's accounting "
            "into it first (`linkwise collect accounting --db ...`), or name one with --db"
        )
    until = ds.until
    if ds.db is not None and until is None and ds.holdout_last_s > 0:
        with closing(open_store(ds.db)) as con:
            last = jobs_from_store(con)["submit_time"].max()
        until = float(last) - ds.holdout_last_s if last is not None else None  # type: ignore[arg-type]
    if ds.path:
        path = ds.path
    else:
        built = build_dataset(
            ds.db,
            trace=ds.trace,
            out_dir=Path(out_dir) / "datasets",
            rollouts=ds.rollouts,
            policies=[PolicySpec.parse(s) for s in ds.policies],
            epsilons=list(ds.epsilons),
            windows=list(ds.windows) or None,
            seeds=list(ds.seeds),
            window_s=ds.window_s,
            block_s=ds.block_s,
            min_jobs=ds.min_jobs,
            topology=ds.topology or (None if ds.db else DEFAULT_TOPOLOGY),
            since=ds.since,
            until=until,
            config=ds.mdp_config(),
            calibration=ds.calibration,
            executor="serial",
            max_steps=ds.max_steps,
            warm_start=ds.db is not None,  # windows start from the accounting's backlog
        )
        path = str(built["path"])
    df, manifest = read_dataset(path)
    spec = ObsSpec.from_json(manifest["obs_spec"])
    ds.check_manifest(spec.config, f"the dataset {path}")
    return df, {**manifest, "path": str(Path(path).resolve())}, spec


def heldout_report(
    values: np.ndarray, masks: np.ndarray, actions: np.ndarray, wait_action: int
) -> dict[str, float]:
    """Masked greedy action vs logged action on held-out steps, with baselines: uniform
    choice among allowed actions (expected match) and always the most frequent allowed
    logged action (majority); the same on "choice" steps (more than one allowed action)."""

    n = len(actions)
    if n == 0:
        return {}
    chosen = masked_argmax(values, masks)
    hit = chosen == actions
    allowed = masks.sum(axis=1)
    counts = np.bincount(actions, minlength=masks.shape[1]).astype(float)
    majority = masked_argmax(np.broadcast_to(counts, masks.shape), masks)
    choice = allowed > 1
    starts = actions != wait_action
    out = {
        "heldout_action_match": float(hit.mean()),
        "heldout_chance": float(np.mean(1.0 / allowed)),
        "heldout_majority": float(np.mean(majority == actions)),
        "heldout_wait_share": float(np.mean(~starts)),
        "heldout_chose_masked": float(np.mean(~masks[np.arange(n), chosen])),
        "heldout_steps": float(n),
    }
    if choice.any():
        out["heldout_choice_match"] = float(hit[choice].mean())
        out["heldout_choice_chance"] = float(np.mean(1.0 / allowed[choice]))
        out["heldout_choice_majority"] = float(np.mean((majority == actions)[choice]))
    if starts.any():
        out["heldout_start_match"] = float(hit[starts].mean())
    return out


def progress_bar(enabled: bool) -> Any:
    """The rich progress bar of long training runs (on stderr; a no-op when disabled)."""
    # rich on use: the command line imports this module before any training starts
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[info]}"),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        console=Console(stderr=True),
        disable=not enabled,
    )


def train(
    config: str | Path | TrainConfig,
    *,
    source: Mapping[str, Any] | None = None,
    steps: int | None = None,
    tracking_uri: str | None = None,
    out_dir: str | Path = "linkwise-out/train",
    register: bool | None = None,
    progress: bool = True,
    checkpoint_every: int = 0,
) -> TrainResult:
    """Train the configured policy, track it in MLflow and (unless ``register`` is False or
    the configuration says so) register it as ``model_name`` with alias ``challenger``.

    ``checkpoint_every`` > 0: a package every that many steps as well, into
    ``out_dir/packages/RUN_ID/step_NNNNNN`` (``policy.json``'s ``checkpoint_step``), listed
    in ``TrainResult.checkpoints`` with its held-out report; the last one is the run's package.
    ``source``: ``DatasetConfig.from_source``'s keywords (``path``, ``db``, ``since``,
    ``until``), replacing the configuration's dataset source. ``steps``: the training budget
    instead of ``[train] n_steps`` (``with_steps``)."""

    mlflow_env()
    t0 = time.perf_counter()
    cfg = config if isinstance(config, TrainConfig) else TrainConfig.from_toml(config)
    if source:
        cfg = replace(cfg, dataset=cfg.dataset.from_source(**source))
    if steps is not None:
        cfg = with_steps(cfg, steps)
    out = Path(out_dir).resolve()
    uri = tracking_uri or default_tracking_uri()
    df, manifest, spec = load_training_data(cfg, out)
    cfg = cfg.with_mdp(spec.config)  # the manifest's configuration is what was used

    import d3rlpy  # type: ignore[import-untyped]  # torch behind it: only when training runs

    data = _split_data(cfg, df, spec)
    device = pick_device(cfg.device)
    params = _run_params(manifest, spec, data, device, checkpoint_every)
    with training_run(
        cfg,
        tracking_uri=uri,
        algo=cfg.algo,
        data_hash=manifest["hash"],
        params=params,
        dataset=manifest,
    ) as run:
        d3rlpy.seed(cfg.seed)
        algo = build_algo(cfg.algo, cfg.params, device, spec=spec)
        factory = MlflowAdapterFactory(run.client, run.run_id)
        evaluators = make_evaluators(cfg.algo, data.held_ds, data.held)
        n_steps = cfg.params.n_steps
        with progress_bar(progress) as bar:
            task = bar.add_task(f"{cfg.algo} {cfg.name}", total=n_steps, info="")
            saver = _Checkpoints(checkpoint_every, spec, manifest, out, run, data.held, bar, task)
            saver.t_fit = time.perf_counter()
            epochs = fit(
                algo,
                data.train_ds,
                cfg.params,
                evaluators=evaluators,
                adapter=factory,
                callback=saver,
                experiment_name=cfg.name,
            )
            fit_s = time.perf_counter() - saver.t_fit
        final: dict[str, float] = {"steps_per_s": n_steps / fit_s if fit_s > 0 else math.nan}
        if data.held is not None:
            obs, masks, actions = data.held
            final.update(
                heldout_report(action_values(algo, obs), masks, actions, spec.config.wait_action)
            )
        run.log_final(final, n_steps)
        metrics: dict[str, float] = {**(dict(epochs[-1][1]) if epochs else {}), **final}
        checkpoints = saver.saved
        if checkpoints and checkpoints[-1].step == n_steps:
            pkg = Path(checkpoints[-1].package_dir)
        else:
            pkg = save_package(
                algo, spec, manifest, out / "packages" / run.run_id, meta=run.package_meta()
            )
        reg = run.register_package(pkg, register)
    return TrainResult(
        run_id=run.run_id,
        experiment_id=run.experiment_id,
        tracking_uri=uri,
        name=cfg.name,
        algo=cfg.algo,
        dataset_hash=str(manifest["hash"]),
        dataset_path=str(manifest["path"]),
        obs_spec_version=spec.version,
        package_dir=str(pkg),
        model_uri=reg.model_uri,
        model_name=reg.name,
        model_version=reg.version,
        alias=reg.alias,
        train_transitions=data.train_df.height,
        heldout_transitions=data.held_df.height,
        steps=n_steps,
        seconds=time.perf_counter() - t0,
        steps_per_s=metrics["steps_per_s"],
        metrics={k: float(v) for k, v in metrics.items()},
        checkpoints=tuple(checkpoints),
    )


HeldArrays = tuple[npt.NDArray[np.float32], npt.NDArray[np.bool_], npt.NDArray[np.int64]]


@dataclass(frozen=True)
class SplitData:
    """A dataset's transitions split by episode into training and held-out parts, as frames,
    as d3rlpy datasets (each step's action mask in the observation when the configuration
    says so) and, for the held-out part, as (observations, masks, actions) arrays."""

    transitions: int
    train_df: pl.DataFrame
    held_df: pl.DataFrame
    train_ds: Any
    held_ds: Any  # None without held-out episodes
    held: HeldArrays | None


def _split_data(cfg: TrainConfig, df: pl.DataFrame, spec: ObsSpec) -> SplitData:
    train_df, held_df = split_episodes(df, cfg.dataset.holdout, cfg.seed)
    with quiet_d3rlpy():
        with_masks = cfg.params.masked  # each step's action mask in the observation
        train_ds = to_mdp_dataset(train_df, spec, masks=with_masks)
        held_ds = to_mdp_dataset(held_df, spec, masks=with_masks) if held_df.height else None
    held = frame_arrays(held_df, spec) if held_df.height else None
    return SplitData(df.height, train_df, held_df, train_ds, held_ds, held)


def _run_params(
    manifest: Mapping[str, Any],
    spec: ObsSpec,
    data: SplitData,
    device: str,
    checkpoint_every: int,
) -> dict[str, str]:
    """The MLflow params a training run logs of its data and device."""
    params = {
        "dataset.hash": str(manifest["hash"]),
        "dataset.path": str(manifest["path"]),
        "dataset.obs_spec_version": spec.version,
        "dataset.transitions": str(data.transitions),
        "dataset.train_transitions": str(data.train_df.height),
        "dataset.heldout_transitions": str(data.held_df.height),
        "device": device,
    }
    if checkpoint_every:
        params["checkpoint_every"] = str(checkpoint_every)
    return params


@dataclass
class _Checkpoints:
    """The fit's per-step callback: the progress bar, and every ``every`` steps (0: never) a
    package under ``out/packages/RUN_ID/step_NNNNNN`` with its held-out report (``saved``).
    ``t_fit``: when the fit started (set just before it)."""

    every: int
    spec: ObsSpec
    manifest: Mapping[str, Any]
    out: Path
    run: TrainingRun
    held: HeldArrays | None
    bar: Any
    task: Any
    t_fit: float = 0.0
    saved: list[Checkpoint] = field(default_factory=list)

    def __call__(self, fitted: Any, epoch: int, step: int) -> None:
        self.bar.update(self.task, completed=step, info=f"epoch {epoch}")
        if not (self.every and step % self.every == 0):
            return
        pkg = save_package(
            fitted,
            self.spec,
            self.manifest,
            self.out / "packages" / self.run.run_id / f"step_{step:06d}",
            meta={**self.run.package_meta(), "checkpoint_step": step},
        )
        wait_action = self.spec.config.wait_action
        held = self.held
        report = (
            heldout_report(action_values(fitted, held[0]), held[1], held[2], wait_action)
            if held is not None
            else {}
        )
        seconds = time.perf_counter() - self.t_fit
        self.saved.append(Checkpoint(step, str(pkg), seconds, report))


def _flow() -> Any:
    from prefect import flow  # Prefect (heavy, starts a server) only for a flow run

    return flow(name="train", validate_parameters=False, log_prints=False)(train)


def train_flow(config: str | Path, **kwargs: Any) -> TrainResult:
    """``train`` as a Prefect flow run (same arguments)."""
    with patient_prefect_server():
        result: TrainResult = _flow()(config, **kwargs)
    return result


# ------------------------------------------------------------------------ CLI


def format_result(r: TrainResult) -> str:
    """The human-readable summary, ending with the MLflow run id."""
    m: Mapping[str, float] = r.metrics
    lines = [
        f"trained {r.algo} '{r.name}' for {r.steps} steps in {r.seconds:.1f} s "
        f"({r.steps_per_s:.0f} steps/s)",
        f"  dataset {r.dataset_hash[:16]}: {r.train_transitions} train / "
        f"{r.heldout_transitions} held-out transitions; obs spec {r.obs_spec_version}",
    ]
    if "heldout_action_match" in m:
        lines.append(
            f"  held-out action match {m['heldout_action_match']:.1%} (chance "
            f"{m['heldout_chance']:.1%}, majority {m['heldout_majority']:.1%})"
            + (
                f"; on choice steps {m['heldout_choice_match']:.1%} (chance "
                f"{m['heldout_choice_chance']:.1%})"
                if "heldout_choice_match" in m
                else ""
            )
        )
    for key in ("td_error", "initial_state_value", "loss"):
        if key in m:
            lines.append(f"  {key} {m[key]:.4g}")
    lines.extend(summary_footer(r))
    return "\n".join(lines)
