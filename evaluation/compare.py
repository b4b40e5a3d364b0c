"""Run several policies on the same scenario (cluster, workload, contention model) and compare.

A ``Scenario`` is everything but the policy; it is picklable so policies can run in
parallel worker processes. Policies come as parsed specs (``policies.spec.PolicySpec``, parsed
once where the run starts), each built once (``make_scenario_policy``: a learned package is
loaded and verified once per run). Its ``predictor`` (fit on the workload's history,
``evaluation.predictions``) annotates the jobs with run-time predictions for every policy,
except a learned policy whose package carries its own predictor, which gets that one.

Every run's row (``PolicyRun.row``, what ``linkwise simulate|compare --json`` print) is the
run's ``cluster.metrics.RunMetrics`` plus ``job_metrics`` and:

- ``oracle``: whether the policy reads the true run time (``PolicySpec.is_oracle``); an
  oracle is a ceiling, never a baseline;
- ``predictions``: where the predictions it saw came from (``history``, ``package``, None);
- ``restart``: the restart model's name (``sia``, ``free``, ``30s``; ``cluster/restart.py``)
  and ``free_preemption`` whether preemption cost nothing; the metrics' ``preemptions_per_job``
  and ``restart_s_per_job`` (grace held + restore + work redone, mean per job) what it cost.

``job_metrics`` splits the average JCT into its parts, ``avg_jct_s = avg_queue_s +
lower_bound_isolated_s * (1 + avg_runtime_inflation)``:

- ``avg_queue_s``: mean time without GPUs (from submit to end, minus the time holding GPUs);
- ``avg_runtime_inflation``: how much contention lengthens the run times, as a whole:
  ``mean(actual run time) / mean(isolated run time) - 1`` (0: none; run times weighted by
  length, so it is the share of run time added by contention). The per-job mean of
  ``actual / isolated`` is ``avg_contention_slowdown`` (unweighted: many short single-node
  jobs at 1.0 pull it towards 1), and ``avg_multinode_slowdown`` is that mean over the jobs
  that spanned more than one node (nan when none did), where placement decides contention;
- ``lower_bound_isolated_s`` (also ``lower_bound_s``): the mean isolated run time, no
  queueing, no contention; ``lower_bound_queue_s``: the larger of that and preemptive SRPT of
  the jobs' GPU-seconds on the pooled GPUs (``cluster.bounds``), which counts queueing;
  ``avg_jct_over_lb`` and ``avg_jct_over_queue_lb`` the average JCT's ratios to them;
- fairness: ``unfair_share`` (jobs whose bounded slowdown exceeds ``UNFAIR_SLOWDOWN``),
  ``avg_slowdown`` and ``p95_slowdown`` (JCT / isolated run time, bounded, 10 s floor).
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from linkwise.cluster.bounds import queue_bound
from linkwise.cluster.calibration.measurements import load_deepshare
from linkwise.cluster.contention import (
    AnalyticModel,
    ContentionModel,
    EmpiricalModel,
    NoContention,
)
from linkwise.cluster.domain import Job, Policy, Topology
from linkwise.cluster.metrics import BOUNDED_SLOWDOWN_FLOOR_S, RunMetrics, summarize
from linkwise.cluster.profiles import Calibration
from linkwise.cluster.simulator.config import SimConfig
from linkwise.cluster.simulator.records import JobRecord
from linkwise.cluster.simulator.run import simulate
from linkwise.datasets.predictor import RuntimePredictor
from linkwise.evaluation.predictions import check_predictions, package_predictor
from linkwise.models.build import build_policy
from linkwise.policies.spec import PolicySpec

UNFAIR_SLOWDOWN = 5.0  # a job is treated unfairly when its bounded slowdown exceeds this


def bounded_slowdown(jct: np.ndarray, isolated: np.ndarray) -> np.ndarray:
    """``max(1, JCT / max(isolated, 10 s))`` per job."""
    out: np.ndarray = np.maximum(1.0, jct / np.maximum(isolated, BOUNDED_SLOWDOWN_FLOOR_S))
    return out


def job_metrics(
    jct: np.ndarray,
    run: np.ndarray,
    isolated: np.ndarray,
    queue_lb: float = math.nan,
    nodes: np.ndarray | None = None,
) -> dict[str, float]:
    """Lower bounds, ratios to them, queueing and contention apart, slowdowns and fairness of
    one run's jobs (module docstring); ``queue_lb``: the queueing-aware bound of their
    average JCT (``cluster.bounds.queue_bound`` / n); ``nodes``: nodes each job spanned."""
    lb = float(isolated.mean())
    lb99 = float(np.percentile(isolated, 99))
    slow = bounded_slowdown(jct, isolated)
    contention = run / isolated
    multi = contention[nodes > 1] if nodes is not None else np.zeros(0)
    return {
        "lower_bound_s": lb,
        "lower_bound_isolated_s": lb,
        "lower_bound_p99_s": lb99,
        "lower_bound_queue_s": queue_lb,
        "avg_jct_over_lb": float(jct.mean()) / lb if lb > 0 else math.nan,
        "avg_jct_over_queue_lb": float(jct.mean()) / queue_lb if queue_lb > 0 else math.nan,
        "p99_jct_over_lb": float(np.percentile(jct, 99)) / lb99 if lb99 > 0 else math.nan,
        "avg_runtime_inflation": float(run.mean()) / lb - 1.0 if lb > 0 else math.nan,
        "avg_multinode_slowdown": float(multi.mean()) if multi.size else math.nan,
        "avg_slowdown": float(slow.mean()),
        "p95_slowdown": float(np.percentile(slow, 95)),
        "unfair_share": float((slow > UNFAIR_SLOWDOWN).mean()),
        "p95_contention_slowdown": float(np.percentile(contention, 95)),
    }


def records_metrics(records: Sequence[JobRecord], total_gpus: int) -> dict[str, float]:
    """``job_metrics`` of a run's records, with the queueing bound of their jobs."""
    jct = np.array([r.jct for r in records])
    run = np.array([r.run_s for r in records])
    iso = np.array([r.job.duration for r in records])
    nodes = np.array([r.nodes for r in records])
    queue_lb = queue_bound([r.job for r in records], total_gpus) / len(records)
    return job_metrics(jct, run, iso, queue_lb, nodes)


@dataclass(frozen=True)
class Scenario:
    """A cluster, a workload and a contention model: what a policy is run on."""

    topology: Topology
    jobs: tuple[Job, ...]
    calibration: Calibration
    contention: str = "analytic"  # "analytic", "empirical" or "none" (pure queueing)
    config: SimConfig = field(default_factory=SimConfig)
    data_dir: str | None = None  # ../shared/data, for the empirical model's table
    predictor: RuntimePredictor | None = None  # fit on the history (``--history``), or None

    def jobs_for(self, policy: Any) -> tuple[tuple[Job, ...], str | None]:
        """The jobs a policy runs on, annotated with run-time predictions, and where they
        come from: a learned package's own predictor, else the scenario's (the history's)."""
        own = package_predictor(policy)
        if own is not None:
            return own.annotate(self.jobs), "package"
        if self.predictor is not None:
            return self.predictor.annotate(self.jobs), "history"
        return self.jobs, None

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
            return EmpiricalModel(load_deepshare(Path(self.data_dir)))
        raise ValueError(
            f"unknown contention model {self.contention!r} (analytic, empirical, none)"
        )


@dataclass(frozen=True)
class PolicyRun:
    """One policy's result on a scenario: the summary, every job's JCT, the bounds,
    queueing and contention apart and fairness (``job_metrics``), whether it is an oracle
    and where its predictions came from."""

    metrics: RunMetrics
    jct_s: tuple[float, ...]
    extra: dict[str, float] = field(default_factory=dict)
    oracle: bool = False
    predictions: str | None = None
    restart: str = "sia"
    free_preemption: bool = False

    def row(self) -> dict[str, Any]:
        """The JSON row of ``linkwise simulate|compare --json``."""
        return {
            **self.metrics.to_dict(),
            **self.extra,
            "oracle": self.oracle,
            "predictions": self.predictions,
            "restart": self.restart,
            "free_preemption": self.free_preemption,
        }


def make_scenario_policy(scenario: Scenario, spec: PolicySpec) -> Policy:
    """The policy ``spec`` names (``models.build.build_policy``); a learned policy's encoder
    predicts contention with the scenario's calibrated analytic model, as the live scheduler
    would."""
    return build_policy(spec, AnalyticModel(scenario.calibration))


def _stats(policy: Policy) -> dict[str, float]:
    """What a policy reports of its own run (the lookahead: decision latency in ms per
    decision point, searched points, deviations per 1,000), else nothing."""
    stats = getattr(policy, "stats", None)
    return dict(stats()) if callable(stats) else {}


def run_policy(scenario: Scenario, spec: PolicySpec, policy: Policy | None = None) -> PolicyRun:
    """Simulate one policy on the scenario: ``policy``, built from ``spec`` when None."""
    if policy is None:
        policy = make_scenario_policy(scenario, spec)
    jobs, source = scenario.jobs_for(policy)
    result = simulate(scenario.topology, jobs, scenario.model(), policy, scenario.config)
    metrics = summarize(
        result.records,
        total_gpus=scenario.topology.total_gpus,
        events=result.events,
        wall_s=result.wall_s,
        policy=spec.label,
    )
    return PolicyRun(
        metrics=metrics,
        jct_s=tuple(r.jct for r in result.records),
        extra={**records_metrics(result.records, scenario.topology.total_gpus), **_stats(policy)},
        oracle=spec.is_oracle,
        predictions=source,
        restart=scenario.config.restart.name,
        free_preemption=scenario.config.restart.is_free,
    )


def compare(
    scenario: Scenario,
    specs: Sequence[PolicySpec],
    *,
    workers: int = 1,
    on_done: Callable[[PolicySpec], None] | None = None,
    learned_need_predictions: bool = False,
    built: Sequence[Policy] | None = None,
) -> list[PolicyRun]:
    """Run every policy on the same scenario; results in the order of ``specs``, each built
    once (``built``: already built, one per spec). Unloadable models and a policy that needs
    run-time predictions it would not get (``evaluation.predictions.check_predictions``; a
    learned package without a predictor only with ``learned_need_predictions``) are refused
    before any simulation."""
    policies = (
        list(built) if built is not None else [make_scenario_policy(scenario, s) for s in specs]
    )
    check_predictions(
        specs, policies, scenario.predictor is not None, learned=learned_need_predictions
    )
    if workers <= 1 or len(specs) == 1:
        runs = []
        for spec, policy in zip(specs, policies, strict=True):
            runs.append(run_policy(scenario, spec, policy))
            if on_done:
                on_done(spec)
        return runs
    results: dict[int, PolicyRun] = {}
    with ProcessPoolExecutor(max_workers=min(workers, len(specs), os.cpu_count() or 1)) as pool:
        futures = {
            pool.submit(run_policy, scenario, spec, policy): i
            for i, (spec, policy) in enumerate(zip(specs, policies, strict=True))
        }
        for fut in as_completed(futures):
            results[futures[fut]] = fut.result()
            if on_done:
                on_done(specs[futures[fut]])
    return [results[i] for i in range(len(specs))]


def plot_jct_cdf(runs: Sequence[PolicyRun], path: Path, *, title: str = "") -> Path:
    """Save the JCT CDF of each policy (log time axis) as a PNG."""
    # matplotlib takes about half a second to import: only where a plot is drawn
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # after use("Agg"): drawn to a file, no display

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
