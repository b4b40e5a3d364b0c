"""Module-level Prefect flows for the deployments in ``prefect.yaml``.

A deployment's entrypoint must name a ``Flow`` object at module level, and its parameters
must be JSON values. The collection flows (``pipelines.collect``) already are; the dataset
build, training and evaluation are plain functions wrapped into flows at call time, so this
module gives them deployable flows with JSON-typed parameters and JSON results. Each one
only translates arguments and calls the plain function.

The dataset build and the evaluation run one experiment of ``pipelines.experiment`` (by name,
``daily`` unless the ``experiment`` parameter says otherwise): its windows, MDP, rollouts,
held-out windows, seeds and topology. A parameter given explicitly (in ``prefect.yaml`` or
per run) overrides the experiment's value.

``job_telemetry_flow`` (``job-telemetry``) summarizes the store's new job runs for ``linkwise
profiles`` (``pipelines.profiles``, whose module imports no Prefect: the command line builds
its parser for every command, ``serve`` included).
"""

from __future__ import annotations

from contextlib import closing
from dataclasses import replace
from typing import Any, TypeVar

from prefect import flow

from linkwise.datasets.job_telemetry import build_job_telemetry
from linkwise.datasets.operator import parse_time
from linkwise.datasets.store import open_store
from linkwise.pipelines.build_dataset import build_dataset
from linkwise.pipelines.evaluate import evaluate_and_promote
from linkwise.pipelines.experiment import get_experiment
from linkwise.pipelines.train import train
from linkwise.policies.spec import PolicySpec

__all__ = [
    "build_dataset_deployment",
    "evaluate_deployment",
    "job_telemetry_flow",
    "train_deployment",
]

T = TypeVar("T")


def _or(value: T | None, default: T) -> T:
    """The parameter when given, else the experiment's value."""
    return default if value is None else value


@flow(name="build-dataset", log_prints=False)
def build_dataset_deployment(
    db: str | None = None,
    trace: str | None = None,
    out_dir: str = "linkwise-out/datasets",
    experiment: str = "daily",
    rollouts: int | None = None,
    policies: list[str] | None = None,
    epsilons: list[float] | None = None,
    seeds: list[int] | None = None,
    window_s: float | None = None,
    block_s: float | None = None,
    min_jobs: int | None = None,
    topology: str | None = None,
    slurm_cluster: str | None = None,
    calibration: str | None = None,
    executor: str = "local",
    max_steps: int | None = None,
    tracking_uri: str | None = None,
    warm_start: bool | None = None,
) -> dict[str, Any]:
    """``pipelines.build_dataset.build_dataset`` with the experiment's numbers and MDP: the
    manifest (path, hash, counts); ``warm_start`` for rollouts from the store (windows start
    from its backlog). ``topology`` None: the cluster's nodes in the store."""
    exp = get_experiment(experiment)
    manifest = build_dataset(
        db,
        trace,
        out_dir=out_dir,
        rollouts=_or(rollouts, exp.dataset.rollouts),
        policies=[PolicySpec.parse(s) for s in _or(policies, list(exp.dataset.policies))],
        epsilons=_or(epsilons, list(exp.dataset.epsilons)),
        seeds=_or(seeds, list(exp.dataset.seeds)),
        window_s=_or(window_s, exp.windows.window_s),
        block_s=_or(block_s, exp.windows.block_s),
        min_jobs=_or(min_jobs, exp.windows.min_jobs),
        topology=topology,
        slurm_cluster=slurm_cluster,
        log_window_s=exp.dataset.log_window_s,
        config=exp.mdp,
        calibration=calibration,
        executor=executor,
        max_steps=_or(max_steps, exp.dataset.max_steps),
        warm_start=_or(warm_start, exp.windows.warm_start),
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
    dataset: str | None = None,
    db: str | None = None,
    since: str | None = None,
    until: str | None = None,
    steps: int | None = None,
) -> dict[str, Any]:
    """``pipelines.train.train`` on a TOML configuration (registers ``@challenger``);
    ``dataset`` (an exported one) or ``db`` with ``since``/``until`` (ISO or epoch seconds)
    replace its dataset source, ``steps`` its budget (``linkwise train``'s options)."""
    source = {
        "path": dataset,
        "db": db,
        "since": parse_time(since, "since"),
        "until": parse_time(until, "until"),
    }
    result = train(
        config,
        source={k: v for k, v in source.items() if v is not None},
        steps=steps,
        tracking_uri=tracking_uri,
        out_dir=out_dir,
        register=register,
        progress=False,
    )
    return result.to_json()


@flow(name="evaluate-and-promote", log_prints=False)
def evaluate_deployment(
    policies: list[str],
    trace: str | None = None,
    db: str | None = None,
    slurm_cluster: str | None = None,
    experiment: str = "daily",
    n_windows: int | None = None,
    seeds: list[int] | None = None,
    cluster: str | None = None,
    window_s: float | None = None,
    block_s: float | None = None,
    min_jobs: int | None = None,
    calibration: str | None = None,
    executor: str = "serial",
    out_dir: str = "linkwise-out/evaluation",
    tracking_uri: str | None = None,
    n_boot: int | None = None,
    gates: str | None = None,
    promote: bool = True,
    warm_start: bool | None = None,
    fqe: bool = True,
    ope: str | None = None,
    ope_steps: int | None = None,
    ope_seeds: list[int] | None = None,
) -> dict[str, Any]:
    """``pipelines.evaluate.evaluate_and_promote`` with the experiment's numbers: benchmark
    on its held-out windows, gate ``@challenger`` and promote it to ``@shadow`` when it passes
    (a refusal is logged, the run completes); ``warm_start`` with ``db``: windows start from
    the accounting's backlog. ``cluster``: a topology spec or slurm.conf folder (default: with
    ``db``, the cluster the store's ``nodes`` table describes; else the experiment's).

    The gate requires FQE evidence: ``ope`` names a table (``linkwise ope --out``); else with
    ``fqe`` the challenger's FQE is computed on the held-out episodes of the dataset it was
    trained on, ``ope_steps`` steps per seed of ``ope_seeds`` (the experiment's by default).
    Without either the gate refuses every challenger for missing evidence."""
    exp = get_experiment(experiment)
    plan = replace(
        exp.evaluation,
        ope_steps=_or(ope_steps, exp.evaluation.ope_steps),
        ope_seeds=tuple(_or(ope_seeds, list(exp.evaluation.ope_seeds))),
    )
    return evaluate_and_promote(
        [PolicySpec.parse(s) for s in policies],
        gates=gates,
        ope=ope,
        fqe=plan if fqe else None,
        promote=promote,
        trace=trace,
        db=db,
        slurm_cluster=slurm_cluster,
        n_windows=_or(n_windows, exp.evaluation.heldout_windows),
        seeds=_or(seeds, list(exp.evaluation.seeds)),
        cluster=cluster if cluster is not None or db is not None else exp.topology,
        window_s=_or(window_s, exp.windows.window_s),
        block_s=_or(block_s, exp.windows.block_s),
        min_jobs=_or(min_jobs, exp.windows.min_jobs),
        calibration=calibration,
        executor=executor,
        out_dir=out_dir,
        tracking_uri=tracking_uri,
        n_boot=_or(n_boot, exp.evaluation.n_boot),
        warm_start=_or(warm_start, exp.windows.warm_start),
    )


@flow(name="job-telemetry", log_prints=False)
def job_telemetry_flow(
    db: str, cluster: str | None = None, interval_s: float = 30.0
) -> dict[str, Any]:
    """Summarize the store's new job runs (``build_job_telemetry``); the report as a dict."""
    with closing(open_store(db)) as con:
        return build_job_telemetry(con, cluster=cluster, interval_s=interval_s).to_dict()
