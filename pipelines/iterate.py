"""Self-rollout iterations: the learned policy's own behaviour data, then retraining on it.

A round takes a dataset and the package trained on it, rolls the package out itself
(``model:PATH`` behaviour, with epsilon exploration) on the training windows in the
simulator (``datasets.rollouts``), appends those transitions to the dataset (a new
content-hashed dataset whose manifest lists every round in ``sources.self_rollouts``), and
trains again with the same ``TrainConfig`` except the dataset path (``pipelines.train``).
``iterate`` runs ``rounds`` such rounds, each one's package rolling out in the next; every
round's training run is tagged ``linkwise.iterate.round`` (and carries the dataset hash as
``linkwise.dataset_hash``, as every training run does).

The rollouts see what the package was trained for: the dataset's MDP (its manifest's
ObsSpec, which the package must share), its calibration, and the package's run-time
predictor (else the dataset's).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import polars as pl

from linkwise.cluster.domain import Topology
from linkwise.cluster.mdp import ObsSpec
from linkwise.cluster.profiles import load_calibration
from linkwise.datasets.backlog import Backlog
from linkwise.datasets.export import export_dataset, read_dataset
from linkwise.datasets.prediction import predictor_from_manifest
from linkwise.datasets.rollouts import Window, make_tasks, run_rollouts
from linkwise.models.build import token
from linkwise.models.calibrations import recorded_calibration
from linkwise.models.registry import default_tracking_uri, registry_client
from linkwise.models.training import TrainConfig
from linkwise.pipelines.build_dataset import resolve_learned
from linkwise.pipelines.train import TrainResult, train
from linkwise.policies.spec import PolicySpec

__all__ = [
    "ROUND_TAG",
    "IterationPlan",
    "RoundResult",
    "append_transitions",
    "iterate",
    "self_rollouts",
]

ROUND_TAG = "linkwise.iterate.round"
PARENT_TAG = "linkwise.iterate.parent_package"


@dataclass(frozen=True)
class IterationPlan:
    """How the policy's own data is collected each round: exploration rates, resampling seeds
    (each epsilon x window x seed one rollout), the bootstrap block, an optional episode cut
    and the executor of ``datasets.rollouts.run_rollouts``."""

    rounds: int = 2
    epsilons: tuple[float, ...] = (0.1,)
    seeds: tuple[int, ...] = (0, 1, 2)
    block_s: float = 3600.0
    max_steps: int | None = None
    executor: str = "serial"

    def __post_init__(self) -> None:
        if self.rounds < 1:
            raise ValueError("rounds must be at least 1")
        if not self.epsilons or not self.seeds:
            raise ValueError("give at least one epsilon and one seed")


@dataclass(frozen=True)
class RoundResult:
    """One round: the dataset it trained on (with the transitions it added) and the run."""

    round: int
    behaviour_package: str  # the package that rolled out
    dataset_path: str
    dataset_hash: str
    added_transitions: int
    train: TrainResult


def self_rollouts(
    package_dir: str | Path,
    windows: Sequence[Window],
    topology: Topology,
    manifest: Mapping[str, Any],
    plan: IterationPlan,
    backlogs: Mapping[int, Backlog] | None = None,
    tracking_uri: str | None = None,
) -> pl.DataFrame:
    """The package's own rollouts (``model:PATH`` with every epsilon, window and seed of
    ``plan``) on the dataset's MDP and calibration (``manifest``; a cluster's fitted one
    reloaded from its MLflow run at ``tracking_uri``: ``recorded_calibration``), its jobs
    annotated by the package's predictor (else the dataset's)."""
    policy = PolicySpec.parse(f"model:{Path(package_dir).resolve()}")
    spec = ObsSpec.from_json(manifest["obs_spec"])
    calibration = load_calibration(recorded_calibration(manifest.get("sources", {}), tracking_uri))
    learned = resolve_learned([policy], spec, calibration)  # at the edge: datasets/ never loads it
    predictor = learned[policy].predictor or predictor_from_manifest(manifest)
    tasks = make_tasks(
        windows,
        [policy],
        plan.seeds,
        topology,
        epsilons=plan.epsilons,
        config=spec.config,
        calibration=calibration,
        block_s=plan.block_s,
        max_steps=plan.max_steps,
        backlogs=backlogs,
        predictor=predictor,
        learned=learned,
    )
    return run_rollouts(tasks, plan.executor)


def append_transitions(
    dataset_path: str | Path,
    frame: pl.DataFrame,
    record: Mapping[str, Any],
    out_dir: str | Path,
) -> dict[str, Any]:
    """A new dataset: the one at ``dataset_path`` plus ``frame``, its manifest's sources with
    ``record`` appended to ``self_rollouts`` (so the content hash changes with every round)."""
    df, manifest = read_dataset(dataset_path)
    spec = ObsSpec.from_json(manifest["obs_spec"])
    sources = dict(manifest["sources"])
    sources["self_rollouts"] = [*sources.get("self_rollouts", []), dict(record)]
    return export_dataset(pl.concat([df, frame], how="vertical"), spec, sources, out_dir)


def _round_record(
    r: int, package_dir: str, windows: Sequence[Window], plan: IterationPlan, frame: pl.DataFrame
) -> dict[str, Any]:
    return {
        "round": r,
        "package": package_dir,
        "package_checksums_sha256": token(PolicySpec.parse(f"model:{package_dir}")),
        "windows": [w.window_id for w in windows],
        "epsilons": [float(e) for e in plan.epsilons],
        "seeds": [int(s) for s in plan.seeds],
        "block_s": plan.block_s,
        "max_steps": plan.max_steps,
        "transitions": frame.height,
        "episodes": frame["episode"].n_unique() if frame.height else 0,
    }


def _tag_round(result: TrainResult, r: int, parent: str) -> None:
    client = registry_client(result.tracking_uri)
    client.set_tag(result.run_id, ROUND_TAG, str(r))
    client.set_tag(result.run_id, PARENT_TAG, parent)


def iterate(
    config: TrainConfig,
    dataset_path: str | Path,
    package_dir: str | Path,
    windows: Sequence[Window],
    topology: Topology,
    *,
    plan: IterationPlan = IterationPlan(),
    backlogs: Mapping[int, Backlog] | None = None,
    tracking_uri: str | None = None,
    out_dir: str | Path = "linkwise-out/iterate",
    register: bool | None = False,
    progress: bool = False,
) -> list[RoundResult]:
    """``plan.rounds`` self-rollout rounds from ``dataset_path`` and the package trained on it
    (``package_dir``): each round rolls the latest package out on ``windows`` (the training
    windows; ``backlogs`` warm-starts them), appends the transitions into a new dataset under
    ``out_dir/datasets``, and trains ``config`` on it (same configuration, that dataset's
    path) into ``out_dir``, the run tagged with its round (1, 2, ...). ``register`` as in
    ``train`` (default False: no round becomes the challenger by itself)."""
    if not windows:
        raise ValueError("no training windows to roll out on")
    uri = tracking_uri or default_tracking_uri()
    out = Path(out_dir)
    path, package = str(dataset_path), str(Path(package_dir).resolve())
    results: list[RoundResult] = []
    for r in range(1, plan.rounds + 1):
        _df, manifest = read_dataset(path)
        frame = self_rollouts(package, windows, topology, manifest, plan, backlogs, tracking_uri)
        record = _round_record(r, package, windows, plan, frame)
        built = append_transitions(path, frame, record, out / "datasets")
        cfg = replace(config, dataset=replace(config.dataset, path=str(built["path"])))
        result = train(cfg, tracking_uri=uri, out_dir=out, register=register, progress=progress)
        _tag_round(result, r, package)
        results.append(
            RoundResult(
                round=r,
                behaviour_package=package,
                dataset_path=str(built["path"]),
                dataset_hash=str(built["hash"]),
                added_transitions=frame.height,
                train=result,
            )
        )
        path, package = str(built["path"]), result.package_dir
    return results
