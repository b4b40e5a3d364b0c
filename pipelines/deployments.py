"""Module-level Prefect flows for the deployments in ``prefect.yaml``.

A deployment's entrypoint must name a ``Flow`` object at module level, and its parameters
must be JSON values. The collection flows (``pipelines.collect``) already are; the dataset
build, training and evaluation are plain functions wrapped into flows at call time, so this
module gives them deployable flows with JSON-typed parameters and JSON results. Each one
only translates arguments and calls the plain function.
"""

from __future__ import annotations

from typing import Any

from prefect import flow

from linkwise.cluster.topology import DEFAULT_TOPOLOGY

__all__ = ["build_dataset_deployment", "evaluate_deployment", "train_deployment"]


@flow(name="build-dataset", log_prints=False)
def build_dataset_deployment(
    db: str | None = None,
    trace: str | None = None,
    out_dir: str = "linkwise-out/datasets",
    rollouts: int = 0,
    policies: list[str] | None = None,
    epsilons: list[float] | None = None,
    seeds: list[int] | None = None,
    window_s: float = 6 * 3600.0,
    block_s: float = 1800.0,
    min_jobs: int = 10,
    topology: str | None = None,
    slurm_cluster: str | None = None,
    calibration: str | None = None,
    executor: str = "local",
    max_steps: int | None = None,
    tracking_uri: str | None = None,
    warm_start: bool = False,
) -> dict[str, Any]:
    """``pipelines.build_dataset.build_dataset``: the manifest (path, hash, counts);
    ``warm_start`` for rollouts from the store (windows start from its backlog)."""
    from linkwise.pipelines.build_dataset import (
        DEFAULT_EPSILONS,
        DEFAULT_POLICIES,
        build_dataset,
    )

    manifest = build_dataset(
        db,
        trace,
        out_dir=out_dir,
        rollouts=rollouts,
        policies=policies or list(DEFAULT_POLICIES),
        epsilons=list(DEFAULT_EPSILONS) if epsilons is None else epsilons,
        seeds=seeds or [0],
        window_s=window_s,
        block_s=block_s,
        min_jobs=min_jobs,
        topology=topology,
        slurm_cluster=slurm_cluster,
        calibration=calibration,
        executor=executor,
        max_steps=max_steps,
        warm_start=warm_start,
        tracking_uri=tracking_uri,
    )
    keys = ("path", "hash", "counts", "mlflow_run_id", "seconds")
    return {k: manifest.get(k) for k in keys}


@flow(name="train", log_prints=False)
def train_deployment(
    config: str,
    tracking_uri: str | None = None,
    out_dir: str = "linkwise-out/train",
    register: bool | None = None,
) -> dict[str, Any]:
    """``pipelines.train.train`` on a TOML configuration (registers ``@challenger``)."""
    from linkwise.pipelines.train import train

    result = train(
        config, tracking_uri=tracking_uri, out_dir=out_dir, register=register, progress=False
    )
    return result.to_json()


@flow(name="evaluate-and-promote", log_prints=False)
def evaluate_deployment(
    policies: list[str],
    trace: str | None = None,
    db: str | None = None,
    slurm_cluster: str | None = None,
    n_windows: int = 4,
    seeds: list[int] | None = None,
    cluster: str = DEFAULT_TOPOLOGY,
    window_s: float = 6 * 3600.0,
    block_s: float = 1800.0,
    min_jobs: int = 10,
    calibration: str | None = None,
    executor: str = "serial",
    out_dir: str = "linkwise-out/evaluation",
    tracking_uri: str | None = None,
    n_boot: int = 2000,
    gates: str | None = None,
    promote: bool = True,
    warm_start: bool = False,
) -> dict[str, Any]:
    """``pipelines.evaluate.evaluate_and_promote``: benchmark, gate ``@challenger`` and
    promote it to ``@shadow`` when it passes (a refusal is logged, the run completes);
    ``warm_start`` with ``db``: windows start from the accounting's backlog."""
    from linkwise.pipelines.evaluate import evaluate_and_promote

    return evaluate_and_promote(
        policies,
        gates=gates,
        promote=promote,
        trace=trace,
        db=db,
        slurm_cluster=slurm_cluster,
        n_windows=n_windows,
        seeds=seeds or [0, 1, 2],
        cluster=cluster,
        window_s=window_s,
        block_s=block_s,
        min_jobs=min_jobs,
        calibration=calibration,
        executor=executor,
        out_dir=out_dir,
        tracking_uri=tracking_uri,
        n_boot=n_boot,
        warm_start=warm_start,
    )
