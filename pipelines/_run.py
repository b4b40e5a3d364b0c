"""The MLflow run of a training pipeline (``train``, ``train_ppo``).

``training_run`` starts the run in the configuration's experiment (explicit artifact location)
with the configuration flattened as ``config.*`` parameters plus its digest and the
pipeline's own parameters, the algorithm and data hash as tags, the dataset as a run input
(when given) and the TOML file as an artifact. The ``TrainingRun`` it yields logs the final
metrics, gives the package's ``meta`` and logs and registers the package.

``summary_footer`` is the end both summaries share.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from linkwise.datasets.export import log_to_mlflow
from linkwise.models.registry import ensure_experiment, log_policy, registry_client
from linkwise.models.training import flatten_params

if TYPE_CHECKING:
    from linkwise.models.registry import RegisteredPolicy

__all__ = [
    "RunConfig",
    "RunSummary",
    "TrainingRun",
    "summary_footer",
    "training_run",
]


class RunConfig(Protocol):
    """What a training configuration offers its run (``TrainConfig``, ``PpoConfig``)."""

    @property
    def name(self) -> str: ...

    @property
    def experiment(self) -> str: ...

    @property
    def model_name(self) -> str: ...

    @property
    def register(self) -> bool: ...

    @property
    def source(self) -> str | None: ...

    def to_json(self) -> dict[str, Any]: ...

    def digest(self) -> str: ...


@dataclass(frozen=True)
class TrainingRun:
    """The active MLflow run of one training configuration."""

    cfg: RunConfig
    run_id: str
    experiment_id: str
    tracking_uri: str
    client: Any  # the MlflowClient of ``tracking_uri``

    def package_meta(self) -> dict[str, Any]:
        """The policy package's ``meta``: run id, configuration and its digest."""
        return {
            "run_id": self.run_id,
            "config": self.cfg.to_json(),
            "config_sha256": self.cfg.digest(),
        }

    def log_final(self, metrics: Mapping[str, float], step: int) -> None:
        """Log the finite ``metrics`` at ``step``."""
        # MLflow takes about a second to import: only where a run or the registry is used
        import mlflow

        mlflow.log_metrics({k: v for k, v in metrics.items() if np.isfinite(v)}, step=step)

    def register_package(self, pkg: str | Path, register: bool | None) -> RegisteredPolicy:
        """Log the package as the run's model; register it as the configuration's
        ``model_name`` with alias ``challenger`` unless ``register`` is False (None: as the
        configuration says)."""

        do_register = self.cfg.register if register is None else register
        return log_policy(
            pkg,
            run_id=self.run_id,
            tracking_uri=self.tracking_uri,
            name=self.cfg.model_name if do_register else None,
        )


@contextmanager
def training_run(
    cfg: RunConfig,
    *,
    tracking_uri: str,
    algo: str,
    data_hash: str,
    params: Mapping[str, str],
    dataset: Mapping[str, Any] | None = None,
) -> Iterator[TrainingRun]:
    """Start the configuration's MLflow run (see the module docstring) and yield it; the run
    ends (failed on an exception) when the block does. ``dataset``: an exported dataset's
    manifest with its ``path``, logged as the run's input."""
    # MLflow takes about a second to import: only where a run or the registry is used
    import mlflow

    client = registry_client(tracking_uri)
    mlflow.set_tracking_uri(tracking_uri)
    exp_id = ensure_experiment(client, cfg.experiment, tracking_uri=tracking_uri)
    with mlflow.start_run(experiment_id=exp_id, run_name=cfg.name) as run:
        run_id = run.info.run_id
        all_params = flatten_params(cfg.to_json(), "config.")
        all_params.update({"config.sha256": cfg.digest(), **params})
        mlflow.log_params(all_params)
        mlflow.set_tags({"linkwise.algo": algo, "linkwise.dataset_hash": data_hash})
        if dataset is not None:
            log_to_mlflow(dataset["path"], dataset, tracking_uri=tracking_uri, run_id=run_id)
        if cfg.source and Path(cfg.source).is_file():
            mlflow.log_artifact(cfg.source, artifact_path="config")
        yield TrainingRun(cfg, run_id, exp_id, tracking_uri, client)


# ------------------------------------------------------------------------ CLI


class RunSummary(Protocol):
    """What a training result says about its run (``TrainResult``, ``PpoResult``)."""

    @property
    def run_id(self) -> str: ...

    @property
    def experiment_id(self) -> str: ...

    @property
    def tracking_uri(self) -> str: ...

    @property
    def package_dir(self) -> str: ...

    @property
    def model_name(self) -> str | None: ...

    @property
    def model_version(self) -> str | None: ...

    @property
    def alias(self) -> str | None: ...


def summary_footer(r: RunSummary) -> list[str]:
    """The summary's last lines: package, registration, tracking and the MLflow run id."""
    lines = [f"  package: {r.package_dir}"]
    if r.model_version:
        lines.append(f"  registered {r.model_name} version {r.model_version} @{r.alias}")
    lines.append(f"  tracking: {r.tracking_uri} (experiment {r.experiment_id})")
    lines.append(f"MLflow run id: {r.run_id}")
    return lines
