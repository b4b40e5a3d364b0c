"""The simulator benchmark: policies x evaluation windows x seeds, in parallel.

An evaluation *case* is one window of a workload (``datasets.rollouts.Window``) resampled
with a seed (the same seeded block bootstrap as the rollouts, ``block_s <= 0`` replays the
window as it was) and given contention profiles drawn with that seed: every policy runs on
exactly the same jobs for a case, so results are paired by (window, seed) and by job.
A case may be warm-started from a ``datasets.backlog.Backlog``, the history's state at the
window's start: its running jobs hold their GPUs (and contend) from the start but are not
measured; its pending jobs arrive at the start and are measured like the window's own.

Per run (policy x case) the benchmark keeps the metrics of ``linkwise simulate``
(``cluster.metrics.summarize``), every job's JCT, run time and isolated run time, and:

- **Lower bound.** A job's isolated run time at its best placement (``Job.duration``: no
  queueing, no contention) bounds its JCT from below. ``lower_bound_s`` is their mean, the
  floor of the average JCT; ``lower_bound_p99_s`` their 99th percentile, the floor of the p99
  JCT (JCT_i >= iso_i for every job implies the same for every quantile). Ratios to them
  (``avg_jct_over_lb``, ``p99_jct_over_lb``) read as "how far from the limit".
- **Queueing-aware lower bound.** ``lower_bound_queue_s``: the larger of the isolated bound
  and preemptive SRPT of every job's GPU-seconds on the cluster's pooled GPUs with release
  times (``cluster.bounds``, argued in ``docs/LOWER_BOUNDS.md``), per job; the backlog's
  running jobs are left out, which keeps it a bound. ``avg_jct_over_queue_lb`` is the
  average JCT's ratio to it: the headroom no policy can go below.
- **Queueing and contention apart.** ``avg_queue_s`` (time without GPUs) and
  ``avg_runtime_inflation`` (mean run time / mean isolated run time - 1), so that
  ``avg_jct_s = avg_queue_s + lower_bound_isolated_s * (1 + avg_runtime_inflation)``;
  ``avg_contention_slowdown`` (per-job mean of run time / isolated run time) and
  ``avg_multinode_slowdown`` (the same over jobs spanning several nodes; nan when none did).
  ``lower_bound_isolated_s`` is ``lower_bound_s`` under the name ``linkwise compare`` uses
  (``evaluation.compare.job_metrics`` computes them all, for both).
- **Oracles and predictions.** ``Benchmark.summary`` marks oracle ceilings (``oracle``);
  ``EvalCase.predictor`` annotates the case's jobs, backlog included, with run-time
  predictions, except for a learned policy whose package carries its own predictor.
- **Restart cost.** ``EvalCase.restart`` (default ``RestartModel.sia()``: Sia's measured
  checkpoint plus restore per profile, a 30 s grace; ``cluster/restart.py``); every run's
  ``preemptions_per_job``, ``migrations`` and ``restart_s_per_job`` (seconds lost to
  restarts per job), ``restart`` (the model's name) and ``free_preemption``.
- **Per-job slowdown.** ``JCT / isolated run time``, bounded as usual (Feitelson: isolated
  times below ``BOUNDED_SLOWDOWN_FLOOR_S`` = 10 s count as 10 s; never below 1).
- **Fairness.** ``unfair_share``: the share of jobs whose bounded slowdown exceeds
  ``UNFAIR_SLOWDOWN`` (5): jobs that waited or were slowed to more than five times what they
  would have taken alone. ``p95_slowdown`` is given beside it.
- **Decision latency.** Wall milliseconds per ``decide`` call (one decision point, all the
  starts chosen there), p50, p99 and max.
- **Masked actions.** For step policies (an ``act(obs, mask)``, a ``spec`` and a ``model``,
  e.g. ``LearnedPolicy``) every chosen action is checked against the mask; a masked choice is
  counted and replaced by "wait" so the run completes and the gate can refuse it. None for
  policies that decide directly (heuristics: the simulator refuses impossible starts).

A run in which the policy fails (it stalls the simulator, waiting on an idle cluster with jobs
pending, or asks for an impossible start) is recorded as a ``CaseFailure`` and the benchmark
goes on; a policy with any failed case is left out of the comparison (``Benchmark.policies``)
and listed with its failures, so one bad policy never aborts the others.

``run_benchmark`` maps ``run_task`` over every (policy, case) with
``linkwise.parallel.map_tasks``: in this process (``"serial"``), a process pool
(``"local[:N]"``), threads (``"threads[:N]"``) or Dask (``"dask"``, ``"dask://HOST:PORT"``),
as Prefect task runs only where a Prefect API is configured or inside a flow run; results in
task order whatever the executor.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from linkwise.cluster.bounds import queue_bound
from linkwise.cluster.contention import AnalyticModel
from linkwise.cluster.domain import ClusterState, Decision, Job, Placement, Policy, Topology
from linkwise.cluster.mdp import MdpPolicy
from linkwise.cluster.metrics import summarize
from linkwise.cluster.profiles import Calibration, load_calibration
from linkwise.cluster.restart import RestartModel
from linkwise.cluster.simulator.config import SimConfig
from linkwise.cluster.simulator.errors import InvalidDecision, NoProgress, SimulationStalled
from linkwise.cluster.simulator.run import simulate
from linkwise.datasets.backlog import Backlog
from linkwise.datasets.prediction import ensure_predicted
from linkwise.datasets.predictor import RuntimePredictor
from linkwise.datasets.rollouts import Window, window_workload
from linkwise.evaluation.compare import UNFAIR_SLOWDOWN, Scenario, bounded_slowdown, job_metrics
from linkwise.evaluation.predictions import check_predictions, package_predictor
from linkwise.models.build import build_policy
from linkwise.parallel import map_tasks
from linkwise.policies.spec import PolicySpec

__all__ = [
    "UNFAIR_SLOWDOWN",
    "BenchTask",
    "Benchmark",
    "CaseFailure",
    "CaseResult",
    "EvalCase",
    "PolicyRef",
    "bounded_slowdown",
    "case_jobs",
    "case_running",
    "load_benchmark",
    "make_bench_policy",
    "make_cases",
    "run_benchmark",
    "run_task",
    "save_benchmark",
]


@dataclass(frozen=True)
class PolicyRef:
    """A policy as the benchmark shows it (``label``) and runs it (``spec``, parsed: e.g. a
    heuristic ``name[:k=v]``, ``model:ALIAS``, ``model:PATH`` or a pinned
    ``model:models:/NAME/VERSION``)."""

    label: str
    spec: PolicySpec

    @staticmethod
    def of(policy: PolicySpec | PolicyRef) -> PolicyRef:
        return policy if isinstance(policy, PolicyRef) else PolicyRef(policy.label, policy)


@dataclass(frozen=True)
class EvalCase:
    """One evaluation workload: a window resampled with a seed, on a cluster (picklable).

    ``topology`` and ``calibration`` are resolved values (parsed once, where the run
    starts); ``block_s`` the bootstrap block (<= 0: replay
    the window as it was); ``tick_s`` periodic decision points (None: events only);
    ``backlog`` the history's state at the window's start (a warm start: its running jobs hold
    their GPUs from the start, its pending jobs arrive at the start and are scheduled and
    measured like the window's own; None: an empty cluster); ``predictor`` annotates every
    job of the case, the backlog's included, with run-time predictions (fit on the history
    before the evaluated windows; None: no predictions); ``restart`` what a preemption or a
    migration costs (default: Sia's measured costs, ``cluster/restart.py``)."""

    window: Window
    seed: int
    topology: Topology
    calibration: Calibration = field(default_factory=load_calibration)
    contention: str = "analytic"
    block_s: float = 1800.0
    tick_s: float | None = None
    data_dir: str | None = None
    backlog: Backlog | None = None
    predictor: RuntimePredictor | None = None
    restart: RestartModel = field(default_factory=RestartModel.sia)

    @property
    def case_id(self) -> str:
        return f"w{self.window.window_id}/s{self.seed}"


@dataclass(frozen=True)
class BenchTask:
    """One run: a policy on a case; ``tracking_uri`` is where ``model:models:/...`` specs are
    loaded from (None: ``MLFLOW_TRACKING_URI`` or the default store)."""

    policy: PolicyRef
    case: EvalCase
    tracking_uri: str | None = None


@dataclass(frozen=True)
class CaseResult:
    """One policy on one case: the summary metrics and every job's times (by job id)."""

    policy: str
    spec: str
    window_id: int
    seed: int
    metrics: dict[str, Any]
    job_ids: tuple[int, ...]
    jct_s: tuple[float, ...]
    run_s: tuple[float, ...]
    isolated_s: tuple[float, ...]
    decisions: int
    latency_ms: dict[str, float]
    masked_actions: int | None
    # a learned policy's guard: the waits it overrode on this case (None: no guard)
    guard_overrides: int | None = None
    # a residual's or a search policy's deviations from its base per 1,000 decision points
    deviations_per_1000: float | None = None

    @property
    def case_id(self) -> str:
        return f"w{self.window_id}/s{self.seed}"

    def row(self) -> dict[str, Any]:
        """The flat summary row (metrics, lower bounds, fairness, latency)."""
        return {
            "policy": self.policy,
            "spec": self.spec,
            "window_id": self.window_id,
            "seed": self.seed,
            **self.metrics,
            "decisions": self.decisions,
            **{f"latency_ms_{k}": v for k, v in self.latency_ms.items()},
            "masked_actions": self.masked_actions,
            "guard_overrides": self.guard_overrides,
            "deviations_per_1000": self.deviations_per_1000,
        }


@dataclass(frozen=True)
class CaseFailure:
    """A policy that could not finish a case, and why (the exception's type and message)."""

    policy: str
    spec: str
    window_id: int
    seed: int
    error: str

    @property
    def case_id(self) -> str:
        return f"w{self.window_id}/s{self.seed}"


# ------------------------------------------------------------------------ one run


def case_jobs(case: EvalCase) -> tuple[Job, ...]:
    """The jobs a case measures: the window resampled with the case's seed plus the
    backlog's pending jobs (at the window's start), profiles drawn with the seed, jobs larger
    than the cluster left out."""
    return _case_workload(case)[0]


def case_running(case: EvalCase) -> tuple[tuple[Job, Placement], ...]:
    """The backlog's running jobs of a case on their placements (empty without a backlog);
    they hold GPUs and contend, but are not measured (no policy placed them)."""
    return _case_workload(case)[1]


def _case_workload(
    case: EvalCase, predictor: RuntimePredictor | None = None
) -> tuple[tuple[Job, ...], tuple[tuple[Job, Placement], ...]]:
    """The case's jobs and backlog, annotated by ``predictor`` (default: the case's) where
    they have no predictions yet (a backlog built with the predictor keeps its own: a running
    job's are shifted by the time it has run)."""
    jobs, running = window_workload(
        case.window,
        case.seed,
        case.block_s,
        case.calibration,
        case.topology.total_gpus,
        case.backlog,
    )
    pred = predictor if predictor is not None else case.predictor
    if pred is None:
        return jobs, running
    held = ensure_predicted((j for j, _ in running), pred)
    return ensure_predicted(jobs, pred), tuple(
        (j, p) for j, (_, p) in zip(held, running, strict=True)
    )


def _scenario(case: EvalCase, jobs: tuple[Job, ...] | None = None) -> Any:

    return Scenario(
        topology=case.topology,
        jobs=case_jobs(case) if jobs is None else jobs,
        calibration=case.calibration,
        contention=case.contention,
        config=SimConfig(tick_s=case.tick_s, restart=case.restart),
        data_dir=case.data_dir,
    )


def make_bench_policy(scenario: Any, spec: PolicySpec, tracking_uri: str | None = None) -> Policy:
    """The policy a spec names on a scenario (``models.build.build_policy``): a learned
    policy's encoder uses the scenario's calibrated analytic model; registry models are
    looked up at ``tracking_uri`` (default: the environment's)."""
    return build_policy(spec, AnalyticModel(scenario.calibration), tracking_uri=tracking_uri)


@dataclass
class _Probe:
    """Wraps a policy: times every ``decide``; for step policies checks every action."""

    inner: Policy
    name: str
    latencies: list[float] = field(default_factory=list)
    masked: int | None = None
    _step: Any = None

    def __post_init__(self) -> None:
        inner: Any = self.inner
        if all(hasattr(inner, a) for a in ("act", "spec", "model")) and callable(inner.act):
            self.masked = 0
            wait = int(inner.spec.config.wait_action)

            def checked(obs: Any, mask: Any) -> int:
                a = int(inner.act(obs, mask))
                if not (0 <= a < len(mask) and bool(mask[a])):
                    self.masked = (self.masked or 0) + 1
                    return wait
                return a

            self._step = MdpPolicy(act=checked, spec=inner.spec, model=inner.model, name=self.name)

    def decide(self, state: ClusterState) -> Decision:
        t = time.perf_counter()
        d: Decision = (self._step or self.inner).decide(state)
        self.latencies.append((time.perf_counter() - t) * 1000.0)
        return d


def run_task(task: BenchTask) -> CaseResult:
    """Simulate one policy on one case (deterministic but for the latencies); a learned
    policy whose package carries a run-time predictor sees that one's predictions."""
    policy = make_bench_policy(_scenario(task.case, ()), task.policy.spec, task.tracking_uri)
    jobs, running = _case_workload(task.case, package_predictor(policy))
    scenario = _scenario(task.case, jobs)
    if not scenario.jobs:
        raise ValueError(f"case {task.case.case_id} has no jobs (pick busier windows)")
    probe = _Probe(policy, task.policy.label)
    result = simulate(
        scenario.topology,
        scenario.jobs,
        scenario.model(),
        probe,
        scenario.config,
        running=running,
    )
    held = {j.job_id for j, _ in running}
    recs = sorted(
        (r for r in result.records if r.job.job_id not in held), key=lambda r: r.job.job_id
    )
    metrics = summarize(
        recs,
        total_gpus=scenario.topology.total_gpus,
        events=result.events,
        wall_s=result.wall_s,
        policy=task.policy.label,
    ).to_dict()
    jct = np.array([r.jct for r in recs])
    run = np.array([r.run_s for r in recs])
    iso = np.array([r.job.duration for r in recs])
    nodes = np.array([r.nodes for r in recs])
    # the backlog's running jobs are left out of the bound: dropping work keeps it a bound
    queue_lb = queue_bound([r.job for r in recs], scenario.topology.total_gpus) / len(recs)
    metrics.update(job_metrics(jct, run, iso, queue_lb, nodes))
    metrics["restart"] = task.case.restart.name
    metrics["free_preemption"] = task.case.restart.is_free
    lat = np.asarray(probe.latencies) if probe.latencies else np.zeros(1)
    return CaseResult(
        policy=task.policy.label,
        spec=task.policy.spec.label,
        window_id=task.case.window.window_id,
        seed=task.case.seed,
        metrics=metrics,
        job_ids=tuple(r.job.job_id for r in recs),
        jct_s=tuple(float(x) for x in jct),
        run_s=tuple(float(x) for x in run),
        isolated_s=tuple(float(x) for x in iso),
        decisions=len(probe.latencies),
        latency_ms={
            "p50": float(np.percentile(lat, 50)),
            "p99": float(np.percentile(lat, 99)),
            "max": float(lat.max()),
        },
        masked_actions=probe.masked,
        guard_overrides=_overrides(policy),
        deviations_per_1000=_deviations(policy),
    )


def _overrides(policy: Policy) -> int | None:
    """The waits a learned policy's guard overrode (``LearnedPolicy.wait_overrides``)."""
    count = getattr(policy, "wait_overrides", None)
    return None if count is None else int(count)


def _deviations(policy: Policy) -> float | None:
    """Deviations from the base per 1,000 decision points (``stats()`` of a residual,
    ``models.residual``, or a lookahead); None for other policies."""
    stats = getattr(policy, "stats", None)
    value = stats().get("deviations_per_1000") if callable(stats) else None
    return None if value is None else float(value)


def try_task(task: BenchTask) -> CaseResult | CaseFailure:
    """``run_task``, with a policy's failure (a stall, a livelock, an impossible start) as a
    value naming the policy and the case."""

    try:
        return run_task(task)
    except (SimulationStalled, NoProgress, InvalidDecision) as exc:
        return CaseFailure(
            policy=task.policy.label,
            spec=task.policy.spec.label,
            window_id=task.case.window.window_id,
            seed=task.case.seed,
            error=f"{type(exc).__name__}: {exc}",
        )


# ------------------------------------------------------------------------ the grid


def make_cases(
    windows: Sequence[Window],
    seeds: Sequence[int],
    topology: Topology,
    *,
    calibration: Calibration | None = None,
    contention: str = "analytic",
    block_s: float = 1800.0,
    tick_s: float | None = None,
    data_dir: str | None = None,
    backlogs: Mapping[int, Backlog] | None = None,
    predictor: RuntimePredictor | None = None,
    restart: RestartModel | None = None,
) -> list[EvalCase]:
    """Every window x seed, in that nesting order; ``backlogs`` (window id -> the history's
    state at its start) warm-starts the windows it names; ``calibration`` None is the
    shipped one; ``predictor`` annotates every case's jobs with run-time predictions;
    ``restart`` None is the honest default (``RestartModel.sia()``)."""
    cal = calibration if calibration is not None else load_calibration()
    return [
        EvalCase(
            window=w,
            seed=int(s),
            topology=topology,
            calibration=cal,
            contention=contention,
            block_s=block_s,
            tick_s=tick_s,
            data_dir=data_dir,
            backlog=(backlogs or {}).get(w.window_id),
            predictor=predictor,
            restart=restart if restart is not None else RestartModel.sia(),
        )
        for w in windows
        for s in seeds
    ]


def _mean(values: Sequence[float]) -> float:
    """The mean of the finite values (nan when none is: e.g. no multi-node job in any case)."""
    finite = [v for v in values if math.isfinite(v)]
    return float(np.mean(finite)) if finite else math.nan


@dataclass(frozen=True)
class Benchmark:
    """All runs of a benchmark, and the policies and cases in their order; ``policies`` are
    those that finished every case, ``failures`` the failed runs of the others."""

    results: tuple[CaseResult, ...]
    policies: tuple[str, ...]
    cases: tuple[str, ...]
    specs: dict[str, str] = field(default_factory=dict)  # label -> the spec it ran
    failures: tuple[CaseFailure, ...] = ()
    kinds: dict[str, str] = field(default_factory=dict)  # label -> ``PolicySpec.kind``
    oracles: frozenset[str] = frozenset()  # the labels of oracle ceilings

    def heuristics(self) -> list[str]:
        """The policies that may be a reference (a baseline, a gate's best heuristic): the
        heuristics and compositions that are no oracle ceiling, in order."""
        return [
            p for p in self.policies if self.kinds.get(p) == "heuristic" and p not in self.oracles
        ]

    def failed(self) -> dict[str, list[CaseFailure]]:
        """Policy -> its failed runs (only policies with failures)."""
        out: dict[str, list[CaseFailure]] = {}
        for f in self.failures:
            out.setdefault(f.policy, []).append(f)
        return out

    def runs(self, policy: str) -> list[CaseResult]:
        """One policy's runs in case order."""
        order = {c: i for i, c in enumerate(self.cases)}
        found = sorted(
            (r for r in self.results if r.policy == policy), key=lambda r: order[r.case_id]
        )
        if not found:
            raise KeyError(f"no runs of policy {policy!r} (have {', '.join(self.policies)})")
        return found

    def summary(self) -> list[dict[str, Any]]:
        """Per policy, the mean over cases of every numeric metric (of the cases where it is
        defined), plus totals of masked actions and guard overrides, the worst p99 decision
        latency and whether
        it is an oracle ceiling (``oracle``)."""
        out: list[dict[str, Any]] = []
        for p in self.policies:
            rows = [r.row() for r in self.runs(p)]
            keys = [
                k
                for k, v in rows[0].items()
                if isinstance(v, int | float)
                and not isinstance(v, bool)
                and k not in ("window_id", "seed", "masked_actions", "guard_overrides")
            ]
            spec = self.specs.get(p, p)
            agg: dict[str, Any] = {"policy": p, "spec": spec, "cases": len(rows)}
            agg.update({k: _mean([float(r[k]) for r in rows]) for k in keys})
            agg["oracle"] = p in self.oracles
            if "free_preemption" in rows[0]:
                agg["restart"] = rows[0]["restart"]
                agg["free_preemption"] = all(bool(r["free_preemption"]) for r in rows)
            masked = [r["masked_actions"] for r in rows]
            agg["masked_actions"] = None if any(m is None for m in masked) else int(sum(masked))
            guard = [r["guard_overrides"] for r in rows]
            agg["guard_overrides"] = None if any(g is None for g in guard) else int(sum(guard))
            agg["latency_ms_p99"] = float(max(r["latency_ms_p99"] for r in rows))
            agg["latency_ms_max"] = float(max(r["latency_ms_max"] for r in rows))
            out.append(agg)
        return out

    def jobs_frame(self) -> pl.DataFrame:
        """One row per (policy, case, job): JCT, run time, isolated run time."""
        parts = [
            pl.DataFrame(
                {
                    "policy": [r.policy] * len(r.job_ids),
                    "window_id": [r.window_id] * len(r.job_ids),
                    "seed": [r.seed] * len(r.job_ids),
                    "job_id": list(r.job_ids),
                    "jct_s": list(r.jct_s),
                    "run_s": list(r.run_s),
                    "isolated_s": list(r.isolated_s),
                },
                schema={
                    "policy": pl.String,
                    "window_id": pl.Int64,
                    "seed": pl.Int64,
                    "job_id": pl.Int64,
                    "jct_s": pl.Float64,
                    "run_s": pl.Float64,
                    "isolated_s": pl.Float64,
                },
            )
            for r in self.results
        ]
        return pl.concat(parts, how="vertical")


def run_benchmark(
    policies: Sequence[PolicySpec | PolicyRef],
    cases: Sequence[EvalCase],
    *,
    executor: str = "serial",
    tracking_uri: str | None = None,
    batch: int = 1,
    on_done: Callable[[CaseResult], None] | None = None,
    learned_need_predictions: bool = False,
) -> Benchmark:
    """Every policy on every case; policies fail fast (unknown names, unloadable models, a
    policy that needs run-time predictions the cases do not carry: ``qssf``, and with
    ``learned_need_predictions`` a learned package without its own predictor) before any
    simulation."""
    refs = [PolicyRef.of(p) for p in policies]
    labels = [r.label for r in refs]
    if len(set(labels)) != len(labels):
        raise ValueError(f"duplicate policy labels: {labels}")
    if not cases:
        raise ValueError("no evaluation cases")
    probe_scenario = _scenario(cases[0])  # every spec loads, before any simulation
    built = [make_bench_policy(probe_scenario, ref.spec, tracking_uri) for ref in refs]
    check_predictions(
        [r.spec for r in refs],
        built,
        cases[0].predictor is not None,
        learned=learned_need_predictions,
    )
    tasks = [BenchTask(ref, case, tracking_uri) for ref in refs for case in cases]

    def done(outcome: CaseResult | CaseFailure) -> None:
        if on_done is not None and isinstance(outcome, CaseResult):
            on_done(outcome)

    outcomes = map_tasks(
        try_task, tasks, executor, batch=batch, name="benchmark", label=_task_label, on_result=done
    )
    failures = tuple(r for r in outcomes if isinstance(r, CaseFailure))
    failed = {f.policy for f in failures}
    return Benchmark(
        results=tuple(r for r in outcomes if isinstance(r, CaseResult) and r.policy not in failed),
        policies=tuple(x for x in labels if x not in failed),
        cases=tuple(c.case_id for c in cases),
        specs={r.label: r.spec.label for r in refs},
        failures=failures,
        kinds={r.label: r.spec.kind for r in refs},
        oracles=frozenset(r.label for r in refs if r.spec.is_oracle),
    )


def _task_label(task: BenchTask) -> str:
    return f"{task.policy.label} {task.case.case_id}"


# ------------------------------------------------------------------------ on disk


def save_benchmark(bench: Benchmark, out_dir: str | Path) -> dict[str, Path]:
    """``runs.json`` (every run's metrics) and ``jobs.parquet`` (every job) in ``out_dir``."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    runs = {
        "policies": list(bench.policies),
        "cases": list(bench.cases),
        "specs": bench.specs,
        "kinds": bench.kinds,
        "oracles": sorted(bench.oracles),
        "failures": [asdict(f) for f in bench.failures],
        "runs": [
            {
                k: v
                for k, v in asdict(r).items()
                if k not in ("job_ids", "jct_s", "run_s", "isolated_s")
            }
            for r in bench.results
        ],
    }
    runs_path = out / "runs.json"
    runs_path.write_text(json.dumps(runs, indent=1, default=float) + "\n")
    jobs_path = out / "jobs.parquet"
    bench.jobs_frame().write_parquet(jobs_path)
    return {"runs": runs_path, "jobs": jobs_path}


def load_benchmark(out_dir: str | Path) -> Benchmark:
    """A benchmark written by ``save_benchmark``."""
    d = Path(out_dir)
    runs = json.loads((d / "runs.json").read_text())
    jobs = pl.read_parquet(d / "jobs.parquet")
    results: list[CaseResult] = []
    for r in runs["runs"]:
        part = jobs.filter(
            (pl.col("policy") == r["policy"])
            & (pl.col("window_id") == r["window_id"])
            & (pl.col("seed") == r["seed"])
        ).sort("job_id")
        results.append(
            CaseResult(
                **r,
                job_ids=tuple(part["job_id"].to_list()),
                jct_s=tuple(part["jct_s"].to_list()),
                run_s=tuple(part["run_s"].to_list()),
                isolated_s=tuple(part["isolated_s"].to_list()),
            )
        )
    return Benchmark(
        results=tuple(results),
        policies=tuple(runs["policies"]),
        cases=tuple(runs["cases"]),
        specs=dict(runs["specs"]),
        failures=tuple(CaseFailure(**f) for f in runs.get("failures", [])),
        kinds=dict(runs.get("kinds", {})),
        oracles=frozenset(runs.get("oracles", ())),
    )
