"""The data of the contention fit: every run that held nodes in the window, with its
placement on the topology (GPUs per node corrected by dcgm-exporter's ``hpc_job`` labels where
present), the ``job_telemetry`` observations, and each node's activity sample instants."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import duckdb
import numpy as np
import numpy.typing as npt
import polars as pl

from linkwise.cluster.domain import Placement, Topology
from linkwise.datasets.job_telemetry import KEY, read_job_telemetry

__all__ = ["MIN_ACTIVITY_GPU_S", "FitData", "FloatArray", "IntArray", "load_fit_data"]

MIN_ACTIVITY_GPU_S = 300.0
"""GPU-seconds of activity of one kind (alone, beside) a run needs for its mean to count."""

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]


@dataclass(frozen=True)
class FitData:
    """Every run that held nodes in the window, with its placement on the topology, and the
    observations of the runs ``job_telemetry`` summarized."""

    runs: pl.DataFrame  # KEY, name, user_name, gpus, t0, t1, observed columns
    telemetry: pl.DataFrame  # the job_telemetry rows of the runs inside the window
    placements: tuple[Placement, ...]  # aligned with ``runs``
    instants: Mapping[int, FloatArray]  # per node index, its activity sample times
    since: float
    until: float
    unknown_nodes: int  # runs on a node the topology does not have (left out)
    label_corrected: int  # runs whose GPUs per node came from hpc_job labels


_RUNS_SQL = """
    SELECT j.cluster, j.job_id, j.submit_time, j.run_index, j.name, j.user_name, j.gpus,
           j.start_time AS t0, coalesce(j.end_time, CAST('inf' AS DOUBLE)) AS t1,
           list(n.node ORDER BY n.node) AS nodes, list(n.gpus ORDER BY n.node) AS node_gpus
    FROM jobs AS j JOIN job_nodes AS n USING (cluster, job_id, submit_time, run_index)
    WHERE j.start_time IS NOT NULL
      AND coalesce(j.end_time, CAST('inf' AS DOUBLE)) > j.start_time
      AND j.start_time < $until AND coalesce(j.end_time, CAST('inf' AS DOUBLE)) > $since
      AND (CAST($cluster AS VARCHAR) IS NULL OR j.cluster = $cluster)
    GROUP BY ALL
    ORDER BY t0, j.cluster, j.job_id, j.run_index
"""
"""Every run holding nodes in [$since, $until), with its nodes and GPUs on each."""


def _labelled_gpus(
    con: duckdb.DuckDBPyConnection, since: float, until: float
) -> dict[tuple[str, str], int]:
    """(job label, node) -> GPUs dcgm-exporter labelled with that job there."""
    rows = con.sql(
        """
        SELECT job, host, count(DISTINCT labels->>'gpu') AS gpus FROM telemetry_samples
        WHERE metric IN ('DCGM_FI_PROF_SM_ACTIVE', 'DCGM_FI_DEV_GPU_UTIL')
          AND job IS NOT NULL AND job <> '' AND host IS NOT NULL AND ts >= $since AND ts < $until
        GROUP BY job, host
        """,
        params={"since": since, "until": until},
    ).fetchall()
    return {(str(job), str(host)): int(g) for job, host, g in rows}


def load_fit_data(
    con: duckdb.DuckDBPyConnection,
    topology: Topology,
    *,
    since: float | None = None,
    until: float | None = None,
    cluster: str | None = None,
) -> FitData:
    """The runs holding nodes in [since, until) (None: the store's whole span), their
    placements, and the ``job_telemetry`` rows of those that ran entirely inside it."""
    lo = -math.inf if since is None else since
    hi = math.inf if until is None else until
    runs = con.sql(_RUNS_SQL, params={"since": lo, "until": hi, "cluster": cluster}).pl()
    if since is None:
        lo = float(runs["t0"].min()) if runs.height else 0.0
    if until is None:
        finite = runs["t1"].filter(runs["t1"].is_finite())
        hi = float(finite.max()) if finite.len() else lo
    labels = _labelled_gpus(con, lo, hi)
    index = topology.node_index
    placements: list[Placement] = []
    keep: list[bool] = []
    unknown = corrected = 0
    for job_id, nodes, gpus in zip(runs["job_id"], runs["nodes"], runs["node_gpus"], strict=True):
        if any(n not in index for n in nodes):
            unknown += 1
            keep.append(False)
            continue
        seen = [labels.get((str(job_id), n)) for n in nodes]
        if all(s is not None for s in seen) and sum(s or 0 for s in seen) == sum(gpus):
            corrected += list(seen) != list(gpus)
            gpus = seen
        placements.append(
            Placement.of([(index[n], int(g)) for n, g in zip(nodes, gpus, strict=True)])
        )
        keep.append(True)
    runs = runs.filter(pl.Series(keep, dtype=pl.Boolean)) if runs.height else runs
    observed = read_job_telemetry(con, cluster=cluster)
    cols = [
        "activity_alone",
        "activity_alone_gpu_s",
        "activity_beside",
        "activity_beside_gpu_s",
        "activity_used",
        "activity_shared",
        "activity_bad",
        "activity_missing",
    ]
    runs = runs.join(observed.select(*KEY, *cols), on=list(KEY), how="left")
    inside = (pl.col("t0") >= lo) & (pl.col("t1") <= hi)
    runs = runs.with_columns(
        (inside & pl.col("activity_used").is_not_null()).alias("summarized"),
    )
    inner = observed.filter((pl.col("start_time") >= lo) & (pl.col("end_time") <= hi))
    times = con.sql(
        """
        SELECT DISTINCT host, ts FROM telemetry_samples
        WHERE metric IN ('DCGM_FI_PROF_SM_ACTIVE', 'DCGM_FI_DEV_GPU_UTIL')
          AND host IS NOT NULL AND ts >= $since AND ts < $until ORDER BY host, ts
        """,
        params={"since": lo, "until": hi},
    ).pl()
    instants = {
        index[str(host)]: group["ts"].to_numpy().astype(np.float64)
        for (host,), group in times.group_by("host", maintain_order=True)
        if str(host) in index
    }
    return FitData(runs, inner, tuple(placements), instants, lo, hi, unknown, corrected)


# ------------------------------------------------------------------------ the model terms
