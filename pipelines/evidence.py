"""Evidence about the learned policies beside the benchmark: FQE estimates on the dataset's
held-out episodes (for the gate), and how often each policy's guard (``models.learned``,
aging by default) overrode a wait on the held-out windows."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from linkwise.cluster.contention import AnalyticModel
from linkwise.cluster.domain import ClusterState, Decision, Job, Topology
from linkwise.cluster.loop import drive
from linkwise.cluster.mdp import ObsSpec
from linkwise.cluster.profiles import assign_profiles, load_calibration
from linkwise.cluster.simulator import Simulator
from linkwise.datasets.export import read_dataset
from linkwise.evaluation.ope import FqeParams, ope_table, run_ope
from linkwise.models.learned import load_package
from linkwise.models.training import split_episodes
from linkwise.pipelines.experiment import EvaluationPlan
from linkwise.pipelines.history import accounting_jobs

__all__ = ["fqe_evidence", "guard_overrides"]

LOG = logging.getLogger("linkwise.demo")


def fqe_evidence(
    dataset_path: str,
    packages: Mapping[str, str],
    plan: EvaluationPlan,
    holdout: float,
    seed: int,
) -> tuple[dict[str, Any] | None, str]:
    """FQE of each learned policy (label -> package folder) on the dataset's held-out
    episodes: (the table the gates read, a note); None with the reason when there is none."""
    df, manifest = read_dataset(dataset_path)
    spec = ObsSpec.from_json(manifest["obs_spec"])
    _, held = split_episodes(df, holdout, seed)
    if held.height == 0:
        return None, "no held-out episodes for FQE"
    per = min(plan.ope_steps, 500)
    params = FqeParams(n_steps=max(per, plan.ope_steps // per * per), n_steps_per_epoch=per)
    try:
        results = run_ope(held, dict(packages), spec=spec, seeds=plan.ope_seeds, params=params)
    except Exception as exc:  # a failed FQE is missing evidence (the gate says so), not a crash
        LOG.warning("FQE failed: %s", exc)
        return None, f"FQE failed ({type(exc).__name__}: {str(exc)[:200]})"
    return ope_table(results), f"FQE on {held.height} held-out transitions"


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
