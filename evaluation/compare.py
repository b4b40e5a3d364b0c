"""Run several policies on the same scenario (cluster, workload, contention model) and compare.

A ``Scenario`` is everything but the policy; it is picklable so policies can run in
parallel worker processes.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from linkwise.cluster.contention import (
    AnalyticModel,
    ContentionModel,
    EmpiricalModel,
    NoContention,
)
from linkwise.cluster.domain import Job, Policy, Topology
from linkwise.cluster.metrics import RunMetrics, summarize
from linkwise.cluster.profiles import Calibration
from linkwise.cluster.simulator import SimConfig, simulate
from linkwise.models.policy_spec import PolicySpec


@dataclass(frozen=True)
class Scenario:
    """A cluster, a workload and a contention model: what a policy is run on."""

    topology: Topology
    jobs: tuple[Job, ...]
    calibration: Calibration
    contention: str = "analytic"  # "analytic", "empirical" or "none" (pure queueing)
    config: SimConfig = field(default_factory=SimConfig)
    data_dir: str | None = None  # ../shared/data, for the empirical model's table

    def model(self) -> ContentionModel:
        if self.contention == "analytic":
            return AnalyticModel(self.calibration)
        if self.contention == "none":
            return NoContention()
        if self.contention == "empirical":
            if self.data_dir is None:
                raise ValueError(
                    "the empirical contention model needs --data pointing at shared/data"
                )
            # cluster.calibration imports scipy (about 1 s): only the empirical model needs it
            from linkwise.cluster.calibration import load_deepshare

            return EmpiricalModel(load_deepshare(Path(self.data_dir)))
        raise ValueError(
            f"unknown contention model {self.contention!r} (analytic, empirical, none)"
        )


@dataclass(frozen=True)
class PolicyRun:
    """One policy's result on a scenario: the summary and every job's JCT."""

    metrics: RunMetrics
    jct_s: tuple[float, ...]


def make_scenario_policy(scenario: Scenario, spec: str) -> Policy:
    """The policy ``spec`` names (``models.policy_spec``); a learned policy's encoder predicts
    contention with the scenario's calibrated analytic model, as the live scheduler would."""
    return PolicySpec.parse(spec).build(AnalyticModel(scenario.calibration))


def run_policy(scenario: Scenario, spec: str) -> PolicyRun:
    """Simulate one policy (``name[:key=value,...]`` or ``model:ALIAS|PATH``) on the scenario."""
    policy = make_scenario_policy(scenario, spec)
    result = simulate(scenario.topology, scenario.jobs, scenario.model(), policy, scenario.config)
    metrics = summarize(
        result.records,
        total_gpus=scenario.topology.total_gpus,
        events=result.events,
        wall_s=result.wall_s,
        policy=spec,
    )
    return PolicyRun(metrics=metrics, jct_s=tuple(r.jct for r in result.records))


def compare(
    scenario: Scenario,
    specs: Sequence[str],
    *,
    workers: int = 1,
    on_done: Callable[[str], None] | None = None,
) -> list[PolicyRun]:
    """Run every policy on the same scenario; results in the order of ``specs``."""
    for spec in specs:  # fail fast on unknown names and unloadable models, before any work
        make_scenario_policy(scenario, spec)
    if workers <= 1 or len(specs) == 1:
        runs = []
        for spec in specs:
            runs.append(run_policy(scenario, spec))
            if on_done:
                on_done(spec)
        return runs
    results: dict[str, PolicyRun] = {}
    with ProcessPoolExecutor(max_workers=min(workers, len(specs), os.cpu_count() or 1)) as pool:
        futures = {pool.submit(run_policy, scenario, spec): spec for spec in specs}
        for fut in as_completed(futures):
            results[futures[fut]] = fut.result()
            if on_done:
                on_done(futures[fut])
    return [results[s] for s in specs]


def plot_jct_cdf(runs: Sequence[PolicyRun], path: Path, *, title: str = "") -> Path:
    """Save the JCT CDF of each policy (log time axis) as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for run in runs:
        jct = np.sort(np.asarray(run.jct_s)) / 3600.0
        ax.plot(jct, np.arange(1, len(jct) + 1) / len(jct), label=run.metrics.policy)
    ax.set_xscale("log")
    ax.set_xlabel("job completion time (hours)")
    ax.set_ylabel("fraction of jobs")
    ax.set_title(title or "JCT CDF")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
