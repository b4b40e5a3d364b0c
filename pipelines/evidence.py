"""Evidence about the learned policies beside the benchmark: FQE estimates on the dataset's
held-out episodes (for the gate; ``challenger_fqe``: the registry's ``@challenger`` on the
held-out episodes of the dataset it was trained on, what the Prefect evaluation gates with),
and how often each policy's guard (``models.learned``, aging by default) overrode a wait on
the held-out windows."""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from linkwise.cluster.contention import AnalyticModel
from linkwise.cluster.domain import ClusterState, Decision, Job, Topology
from linkwise.cluster.loop import drive
from linkwise.cluster.mdp import ObsSpec
from linkwise.cluster.profiles import assign_profiles, load_calibration
from linkwise.cluster.simulator.engine import Simulator
from linkwise.datasets.export import read_dataset
from linkwise.deployer.promote import CHALLENGER, current_aliases
from linkwise.evaluation.ope import FqeParams, ope_table, run_ope
from linkwise.models.learned import LearnedPolicy, PackageError, load_package
from linkwise.models.registry import load_policy, registry_client
from linkwise.models.training import split_episodes
from linkwise.pipelines.experiment import EvaluationPlan
from linkwise.pipelines.history import accounting_jobs
from linkwise.policies.source import MODEL_NAME
from linkwise.policies.spec import PolicySpec

__all__ = ["challenger_fqe", "fqe_evidence", "guard_overrides"]

LOG = logging.getLogger("linkwise.demo")


def fqe_evidence(
    dataset_path: str,
    packages: Mapping[str, str | LearnedPolicy],
    plan: EvaluationPlan,
    holdout: float,
    seed: int,
) -> tuple[dict[str, Any] | None, str]:
    """FQE of each learned policy (label -> package folder or loaded policy) on the dataset's
    held-out episodes: (the table the gates read, a note); None with the reason when there is
    none."""
    df, manifest = read_dataset(dataset_path)
    spec = ObsSpec.from_json(manifest["obs_spec"])
    _, held = split_episodes(df, holdout, seed)
    if held.height == 0:
        return None, "no held-out episodes for FQE"
    per = min(plan.ope_steps, 500)
    params = FqeParams(n_steps=max(per, plan.ope_steps // per * per), n_steps_per_epoch=per)
    try:
        policies = {
            k: v if isinstance(v, LearnedPolicy) else PolicySpec.parse(f"model:{v}")
            for k, v in packages.items()
        }
        results = run_ope(held, policies, spec=spec, seeds=plan.ope_seeds, params=params)
    except Exception as exc:  # a failed FQE is missing evidence (the gate says so), not a crash
        LOG.warning("FQE failed: %s", exc)
        return None, f"FQE failed ({type(exc).__name__}: {str(exc)[:200]})"
    return ope_table(results), f"FQE on {held.height} held-out transitions"


def challenger_fqe(tracking_uri: str, plan: EvaluationPlan) -> tuple[dict[str, Any] | None, str]:
    """FQE of the registry's ``@challenger`` on the held-out episodes of the dataset it was
    trained on (its training run's ``dataset.path``, checked against the hash in its package;
    the share and seed of the split from the package's training configuration), ``plan``'s
    ``ope_steps`` and ``ope_seeds``: (the table the challenger gate reads, keyed by the
    version's pinned spec ``model:models:/linkwise-policy/N`` as the evaluation names it, and
    a note); None with the reason when there is none (the gate then refuses for missing FQE
    evidence, and the reason says why)."""
    if plan.ope_steps <= 0:
        return None, "no FQE asked (ope_steps 0)"
    version = current_aliases(tracking_uri).get(CHALLENGER)
    if version is None:
        return None, f"no @{CHALLENGER} in the registry at {tracking_uri}"
    client = registry_client(tracking_uri)
    mv = client.get_model_version(MODEL_NAME, version)
    run_id = (mv.tags or {}).get("linkwise.run_id") or mv.run_id
    path = client.get_run(run_id).data.params.get("dataset.path") if run_id else None
    if not path or not Path(path).is_file():
        return None, f"version {version}: its training dataset {path or '(not recorded)'} is gone"
    try:
        policy = load_policy(f"models:/{MODEL_NAME}/{version}", tracking_uri=tracking_uri)
    except PackageError as exc:
        return None, f"version {version}: {exc}"
    config = policy.meta.get("config", {})
    holdout = config.get("dataset", {}).get("holdout")
    if holdout is None or "seed" not in config:
        return None, f"version {version}: its package records no held-out split of its dataset"
    found = json.loads(Path(path).with_suffix(".json").read_text()).get("hash")
    if found != policy.meta.get("dataset_hash"):
        return None, (
            f"version {version}: {path} is no longer the dataset it was trained on (hash "
            f"{str(found)[:16]}, trained on {str(policy.meta.get('dataset_hash'))[:16]})"
        )
    label = f"model:models:/{MODEL_NAME}/{version}"
    try:  # read_dataset checks the content against that hash
        return fqe_evidence(path, {label: policy}, plan, float(holdout), int(config["seed"]))
    except ValueError as exc:
        return None, f"version {version}: {exc}"


def guard_overrides(
    packages: Mapping[str, str],
    windows: Sequence[Mapping[str, Any]],
    db: str | Path,
    *,
    cluster: str,
    topology: Topology,
    seed: int = 0,
    calibration: str | None = None,
) -> dict[str, dict[str, int]]:
    """How often each learned policy's guard overrode a wait (label -> counts): each
    package (label -> folder) is run over every window's original arrivals from the store
    (``windows``: ``start``/``end``), counting ``wait_overrides``, starts and decision points
    (the benchmark's own cases are block-bootstrapped and keep no policy state). These
    windows start from an empty cluster: the evaluated, warm-started cases' counts are the
    benchmark rows' ``guard_overrides``, where a backlog of long-waiting jobs makes the
    aging guard fire far more often."""
    cal = load_calibration(calibration)
    model = AnalyticModel(cal)
    window_jobs: list[list[Job]] = [
        list(assign_profiles(
            accounting_jobs(db, cluster=cluster, since=float(w["start"]), until=float(w["end"]),
                            max_gpus=topology.total_gpus),
            cal, seed=seed,
        ))
        for w in windows
    ]  # fmt: skip
    out: dict[str, dict[str, int]] = {}
    for label, pkg in packages.items():
        policy = load_package(pkg, model=model)
        starts = points = 0

        def count(_state: ClusterState, decision: Decision) -> None:
            nonlocal starts, points
            starts += len(decision.starts)
            points += 1

        for jobs in window_jobs:
            if jobs:
                drive(Simulator(topology, jobs, model), policy, on_decision=count)
        out[label] = {
            "windows": sum(1 for j in window_jobs if j),
            "jobs": sum(len(j) for j in window_jobs),
            "decision_points": points,
            "starts": starts,
            "wait_overrides": policy.wait_overrides,
        }
    return out
