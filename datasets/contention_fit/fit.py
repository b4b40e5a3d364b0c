"""The contention fit on the cluster's own telemetry, end to end
(``fit_cluster_calibration``): the data, the split into training and later runs, two solves
(the second in the time unit that pins the overhead best), the parameter report as
``cluster.calibration`` reports it, the validation, and the fitted ``Calibration``."""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import duckdb
import numpy as np
import polars as pl

from linkwise.cluster.calibration.bounds import ALPHA_BOUNDS, OVERHEAD_BOUNDS, PROFILE_BOUNDS
from linkwise.cluster.calibration.report import parameter_entry
from linkwise.cluster.domain import Topology
from linkwise.cluster.profiles import Calibration, CommProfile, load_calibration
from linkwise.datasets.comm_profiles import PROFILE_PREFIX
from linkwise.datasets.contention_fit.data import (
    MIN_ACTIVITY_GPU_S,
    FitData,
    FloatArray,
    IntArray,
    load_fit_data,
)
from linkwise.datasets.contention_fit.result import ClusterFit
from linkwise.datasets.contention_fit.solve import (
    BOOTSTRAP,
    PRIOR_WEIGHT,
    RHO_BOUNDS,
    Profiles,
    Solution,
    best_reference,
    fit_profiles,
    observations,
    parameter_status,
    solve,
)
from linkwise.datasets.contention_fit.terms import ContentionTerms, contention_terms
from linkwise.datasets.contention_fit.validation import Validation, validate

__all__ = ["FitProblem", "fit_cluster_calibration"]

ParameterReport = dict[str, dict[str, dict[str, Any]]]


@dataclass(frozen=True)
class FitProblem:
    """The window's runs ready to fit: the split into training and later runs, the profiles
    learned from the training part, each run's profile, the model terms over every run, and
    the training observations."""

    data: FitData
    runs: pl.DataFrame  # ``data.runs`` with ``_profiled``: the run's name has a profile
    split_time: float  # runs ending by then are the training part
    prof: Profiles
    run_profile: tuple[int, ...]  # per run, its profile index
    terms: ContentionTerms
    obs: tuple[IntArray, FloatArray, IntArray, FloatArray]  # training means alone, beside
    multi_of: tuple[bool, ...]  # per profile, whether a run of it spanned several nodes

    @property
    def is_train(self) -> pl.Expr:
        return pl.col("t1") <= self.split_time

    @property
    def n_obs(self) -> int:
        return len(self.obs[0]) + len(self.obs[2])


@dataclass(frozen=True)
class FittedValues:
    """The solution's values: alpha, overhead and per profile its compute time, gradient
    and gradient per compute second, with the reference's compute time as the unit."""

    alpha: float
    overhead_s: float
    compute_s: FloatArray
    grad_gb: FloatArray
    rho: FloatArray
    unit: str  # how the report names the time unit


def fit_cluster_calibration(
    con: duckdb.DuckDBPyConnection,
    topology: Topology,
    since: float | None = None,
    until: float | None = None,
    *,
    cluster: str | None = None,
    shipped: Calibration | None = None,
    train_fraction: float = 0.6,
    min_gpu_s: float = MIN_ACTIVITY_GPU_S,
) -> ClusterFit:
    """Fit ``alpha``, ``overhead_s`` and the job names' profiles on the store's telemetry of
    [since, until) (the package docstring says how; ``job_telemetry`` must be built first:
    ``build_job_telemetry``), validated on the later runs. ``shipped``: the calibration
    whose alpha and overhead start the fit and are scored beside it (default: the shipped
    one). Raises ``ValueError`` when no run has enough activity to fit on."""
    from_t = time.perf_counter()
    if not 0 < train_fraction <= 1:
        raise ValueError(f"train_fraction must be in (0, 1], got {train_fraction}")
    if shipped is None:
        shipped = load_calibration()
    data = load_fit_data(con, topology, since=since, until=until, cluster=cluster)
    split_time = _split_time(data.runs, train_fraction, min_gpu_s)
    problem = fit_problem(data, topology, split_time, min_gpu_s)
    first = solve(problem.terms, problem.prof, 0, problem.obs, shipped, None)
    ref = best_reference(first, problem.prof, problem.multi_of)
    sol = solve(problem.terms, problem.prof, ref, problem.obs, shipped, first, BOOTSTRAP)
    values = _values(problem.prof, sol)
    fitted_runs = problem.runs.filter(
        problem.is_train & pl.col("_profiled") & pl.col("summarized")
    ).height
    params = _parameters(problem, sol, values, shipped, fitted_runs)
    validation = validate(
        problem.runs,
        problem.terms,
        sol.layout,
        problem.prof,
        sol.x,
        shipped,
        split_time,
        min_gpu_s,
        problem.obs,
    )
    data_info = _data_info(problem, sol, fitted_runs, min_gpu_s)
    cal = _calibration(problem.prof, sol, values, params, data_info, validation, shipped)
    return ClusterFit(cal, problem.prof.names[ref], time.perf_counter() - from_t)


def _split_time(runs: pl.DataFrame, train_fraction: float, min_gpu_s: float) -> float:
    """The end time up to which runs are the training part: ``train_fraction`` of the
    summarized runs with enough activity, by end time (inf: all of them)."""
    usable = runs.filter(
        pl.col("summarized")
        & (
            (pl.col("activity_alone_gpu_s") >= min_gpu_s)
            | (pl.col("activity_beside_gpu_s") >= min_gpu_s)
        )
    )
    if usable.is_empty():
        raise ValueError(
            "no run in the window has enough activity alone or beside others to fit on"
        )
    ends = usable["t1"].sort()
    cut = max(1, math.ceil(train_fraction * usable.height))
    return float(ends[cut - 1]) if cut < usable.height else math.inf


def fit_problem(
    data: FitData, topology: Topology, split_time: float, min_gpu_s: float
) -> FitProblem:
    """The profiles learned from the runs that ended by ``split_time``, the model terms over
    every run of ``data`` and the training observations."""
    runs = data.runs
    is_train = pl.col("t1") <= split_time
    train_rows = runs.filter(is_train & pl.col("summarized"))
    prof = fit_profiles(
        train_rows, data.telemetry.filter(pl.col("end_time") <= split_time), min_gpu_s
    )
    index = {n: i for i, n in enumerate(prof.names)}
    run_profile = [index.get(str(n), prof.fallback) for n in runs["name"]]
    terms = contention_terms(
        topology,
        runs["job_id"].to_list(),
        data.placements,
        runs["t0"].to_list(),
        runs["t1"].to_list(),
        run_profile,
        since=data.since,
        until=data.until,
        instants=data.instants,
    )
    has_profile = pl.Series([p != prof.fallback for p in run_profile], dtype=pl.Boolean)
    runs_p = runs.with_columns(has_profile.alias("_profiled"))
    obs = observations(runs_p, is_train & pl.col("_profiled"), min_gpu_s)
    multi_of = [False] * len(prof.names)
    for placement, i in zip(data.placements, run_profile, strict=True):
        if i < len(prof.names) and len(placement.alloc) > 1:
            multi_of[i] = True
    return FitProblem(
        data, runs_p, split_time, prof, tuple(run_profile), terms, obs, tuple(multi_of)
    )


def _values(prof: Profiles, sol: Solution) -> FittedValues:
    alpha, over, comp, grad = sol.layout.unpack(sol.x, prof)
    ref = sol.layout.ref
    c_ref = float(prof.compute0[ref])
    unit = f"in units of {prof.names[ref]}'s isolated iteration (compute_s {c_ref:.4g})"
    return FittedValues(alpha, over, comp, grad, grad / comp, unit)


def _parameters(
    problem: FitProblem,
    sol: Solution,
    values: FittedValues,
    shipped: Calibration,
    fitted_runs: int,
) -> ParameterReport:
    """``fit["parameters"]``: alpha and the overhead (``shared``), then per job name its
    compute time, gradient and gradient per compute second, each with its status."""
    note_all = f"{problem.n_obs} activity means of {fitted_runs} runs"
    st, basis = parameter_status(
        float(sol.se[0]),
        f"held at its start, the shipped calibration's {shipped.alpha:.4g} (no split rings "
        "sharing a link that the data see)",
        note_all,
    )
    so, basis_o = parameter_status(
        float(sol.se[1]),
        "the reference job's multi-node runs alone set it, and they do not",
        note_all,
    )
    params: ParameterReport = {
        "shared": {
            "alpha": parameter_entry(values.alpha, ALPHA_BOUNDS, st, basis),
            "overhead_s": parameter_entry(
                values.overhead_s, OVERHEAD_BOUNDS, so, f"{basis_o}; {values.unit}"
            ),
        }
    }
    for i, name in enumerate(problem.prof.names):
        params[f"{PROFILE_PREFIX}name={name}"] = _profile_entries(problem, sol, values, i)
    return params


def _profile_entries(
    problem: FitProblem, sol: Solution, values: FittedValues, i: int
) -> dict[str, dict[str, Any]]:
    """The report of profile ``i``: its compute time (the time unit for the reference), its
    gradient per compute second (from ``comm_profiles``' bytes, or fitted) and its gradient."""
    prof, layout, se = problem.prof, sol.layout, sol.se
    name = prof.names[i]
    multi = problem.multi_of[i]
    runs_note = f"{prof.runs[i]} training runs of {name}"
    prior = f"held near its start by a weak prior (weight {PRIOR_WEIGHT:g})"
    c_se = r_se = 0.0
    if i == layout.ref:
        cs, cb = (
            "constrained",
            (
                "the time unit: telemetry holds ratios only, so the reference job name keeps "
                f"its comm_profiles compute time (its median activity alone); {values.unit}"
            ),
        )
    else:
        c_se = float(se[2 + layout.compute.index(i)])
        why = (
            "no run of it spanned several nodes, and only against the overhead of those "
            "is a compute time seen"
            if not multi
            else "a compute time is only seen against the overhead"
        )
        cs, cb = parameter_status(c_se, f"{prior}; {why}", runs_note)
        cb = f"{cb}; {values.unit}"
    if prof.rho_known[i]:
        learned = prof.book.by_name[name]
        rs, rb = (
            "determined",
            (
                f"by the bytes of {learned.runs} runs alone (comm_profiles; spread "
                f"{learned.rho_spread:.1%})"
            ),
        )
    else:
        r_se = float(se[2 + len(layout.compute) + layout.rho.index(i)])
        rs, rb = parameter_status(
            r_se, prior, f"the activity of {runs_note} (comm_profiles had no bytes alone)"
        )
    if i == layout.ref:
        gs, gb = rs, f"its gradient per compute second in the time unit ({rb})"
    else:
        gs, gb = parameter_status(
            math.hypot(c_se, r_se),
            "its compute time is (gradient = compute time x gradient per compute second)",
            runs_note,
        )
    return {
        "compute_s": parameter_entry(float(values.compute_s[i]), PROFILE_BOUNDS, cs, cb),
        "grad_gb": parameter_entry(float(values.grad_gb[i]), PROFILE_BOUNDS, gs, gb),
        "gb_per_compute_s": parameter_entry(float(values.rho[i]), RHO_BOUNDS, rs, rb),
        "runs": {"value": prof.runs[i], "multi_node": multi},
    }


def _data_info(
    problem: FitProblem, sol: Solution, fitted_runs: int, min_gpu_s: float
) -> dict[str, Any]:
    """``fit["data"]``: the window, the runs in it and how many were used, the samples."""
    data, runs = problem.data, problem.runs
    counts = {
        c: int(runs.filter(pl.col("summarized"))[c].sum())
        for c in ("activity_used", "activity_shared", "activity_bad", "activity_missing")
    }
    summarized = runs.filter(pl.col("summarized"))
    return {
        "since": data.since,
        "until": data.until,
        "hours": (data.until - data.since) / 3600.0,
        "runs_in_window": runs.height,
        "runs_summarized": summarized.height,
        "runs_without_activity": summarized.filter(
            (pl.col("activity_alone_gpu_s").fill_null(0) < min_gpu_s)
            & (pl.col("activity_beside_gpu_s").fill_null(0) < min_gpu_s)
        ).height,
        "runs_fitted": fitted_runs,
        "observations": problem.n_obs,
        "job_hours": float(
            (summarized["t1"] - summarized["t0"]).sum() / 3600.0  # type: ignore[operator]
        ),
        "runs_split": int(np.count_nonzero(problem.terms.split)),
        "runs_unknown_nodes": data.unknown_nodes,
        "runs_label_corrected": data.label_corrected,
        "runs_fallback_profile": int(sum(p == problem.prof.fallback for p in problem.run_profile)),
        "samples": counts,
        "min_gpu_s": min_gpu_s,
        "rms_log_residual": sol.rms,
    }


def _calibration(
    prof: Profiles,
    sol: Solution,
    values: FittedValues,
    params: ParameterReport,
    data_info: Mapping[str, Any],
    validation: Validation,
    shipped: Calibration,
) -> Calibration:
    """The fitted ``Calibration``: a ``history:name=...`` profile per job name, the mix of
    the training runs, and ``fit`` holding the report."""
    profiles = {
        f"{PROFILE_PREFIX}name={name}": CommProfile(
            f"{PROFILE_PREFIX}name={name}",
            float(values.compute_s[i]),
            float(values.grad_gb[i]),
            f"fitted on the cluster's telemetry ({prof.runs[i]} runs)",
        )
        for i, name in enumerate(prof.names)
    }
    total = sum(prof.runs[: len(prof.names)])
    mix = {f"{PROFILE_PREFIX}name={n}": prof.runs[i] / total for i, n in enumerate(prof.names)}
    return Calibration(
        profiles=profiles,
        alpha=values.alpha,
        overhead_s=values.overhead_s,
        mix=mix,
        source=f"fitted on the cluster's own telemetry ({data_info['runs_summarized']} runs, "
        f"{data_info['hours']:.1f} h)",
        fit={
            "sharing": "duty",
            "reference": prof.names[sol.layout.ref],
            "parameters": params,
            "data": dict(data_info),
            "validation": validation.to_dict(),
            "shipped": {
                "alpha": shipped.alpha,
                "overhead_s": shipped.overhead_s,
                "source": shipped.source,
            },
        },
    )
