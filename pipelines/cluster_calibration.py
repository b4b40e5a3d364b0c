"""``linkwise calibrate --db``: the cluster's own calibration fitted on a store (issue 34 item 5).

``calibrate_store`` opens the store, builds the per-job telemetry the collection flows have
not built yet (``build_job_telemetry``, incremental), takes the topology given or the one the
store's ``nodes`` table describes (``topology_from_store``, as ``build-dataset`` and
``evaluate`` do), checks that the window holds enough telemetry to fit on (``MIN_FIT_RUNS``
runs with ``MIN_ACTIVITY_GPU_S`` of GPU activity alone or beside others; otherwise a
``ValueError`` saying how many are missing) and fits (``fit_cluster_calibration``).
"""

from __future__ import annotations

import math
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path

import polars as pl

from linkwise.cluster.domain import Topology
from linkwise.cluster.topology.load import load_topology
from linkwise.datasets.contention_fit.data import MIN_ACTIVITY_GPU_S
from linkwise.datasets.contention_fit.fit import fit_cluster_calibration
from linkwise.datasets.contention_fit.result import ClusterFit
from linkwise.datasets.job_telemetry import (
    JobTelemetryReport,
    build_job_telemetry,
    read_job_telemetry,
)
from linkwise.datasets.log_jobs import store_cluster, topology_from_store
from linkwise.datasets.store import open_store

__all__ = ["MIN_FIT_RUNS", "StoreCalibration", "calibrate_store", "usable_runs"]

# runs with enough activity a fit needs at least: with the default 60/40 split, 6 to fit
# and 4 to validate on
MIN_FIT_RUNS = 10


@dataclass(frozen=True)
class StoreCalibration:
    """A fit on a store: the fit, the Slurm cluster it is of, the topology it used (and where
    it came from), the job telemetry built for it."""

    fit: ClusterFit
    cluster: str
    db: str
    topology: Topology
    topology_source: str
    built: JobTelemetryReport


def usable_runs(
    telemetry: pl.DataFrame,
    since: float | None,
    until: float | None,
    min_gpu_s: float = MIN_ACTIVITY_GPU_S,
) -> int:
    """The summarized runs inside [since, until) with at least ``min_gpu_s`` GPU-seconds of
    activity alone or beside others (what ``fit_cluster_calibration`` can fit on)."""
    lo = -math.inf if since is None else since
    hi = math.inf if until is None else until
    inside = telemetry.filter((pl.col("start_time") >= lo) & (pl.col("end_time") <= hi))
    enough = (pl.col("activity_alone_gpu_s").fill_null(0.0) >= min_gpu_s) | (
        pl.col("activity_beside_gpu_s").fill_null(0.0) >= min_gpu_s
    )
    return inside.filter(enough).height


def calibrate_store(
    db: str | Path,
    *,
    slurm_cluster: str | None = None,
    topology: str | None = None,
    since: float | None = None,
    until: float | None = None,
    interval_s: float = 30.0,
    train_fraction: float = 0.6,
    min_runs: int = MIN_FIT_RUNS,
) -> StoreCalibration:
    """Build the store's job telemetry, then fit the cluster's calibration on [since, until)
    (module docstring). FileNotFoundError without a store; ValueError (one line) when the
    store has no cluster, no nodes and no ``topology`` is given, or too little telemetry."""
    path = Path(db)
    if not path.exists():
        raise FileNotFoundError(f"no store at {path}")
    with closing(open_store(path)) as con:
        cluster = store_cluster(con, slurm_cluster)
        if topology:
            topo, source = load_topology(topology), f"given ({topology})"
        else:
            try:
                topo = topology_from_store(con, cluster)
            except ValueError as exc:
                raise ValueError(
                    f"{path}: no topology: {exc}; collect the nodes (`linkwise collect "
                    "accounting`) or name the topology with --cluster"
                ) from None
            source = f"the store's nodes table (cluster {cluster})"
        built = build_job_telemetry(con, cluster=cluster, interval_s=interval_s)
        telemetry = read_job_telemetry(con, cluster=cluster)
        have = usable_runs(telemetry, since, until)
        if have < min_runs:
            why = (
                "the store holds no GPU activity telemetry (collect it: `linkwise collect "
                "telemetry`)"
                if built.horizon is None
                else f"{telemetry.height} runs have job telemetry, {have} of them inside the "
                f"window with at least {MIN_ACTIVITY_GPU_S:g} GPU-seconds of activity"
            )
            raise ValueError(
                f"{path}: too little telemetry to calibrate cluster {cluster}: {why}; the fit "
                f"needs {min_runs} such runs, {min_runs - have} missing"
            )
        fit = fit_cluster_calibration(
            con, topo, since, until, cluster=cluster, train_fraction=train_fraction
        )
    return StoreCalibration(fit, cluster, str(path), topo, source, built)
