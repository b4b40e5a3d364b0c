"""Whether the cluster's calibrated contention model still describes the cluster (issue 34
item 3): each running job's observed slowdown against the one the model predicts at its
current placement, exported by the live loop (``ServeMetrics.observe_drift``) for the alert
``LinkwiseContentionModelDrift`` (``ops/prometheus/rules.yml``).

Observed (``observe_slowdowns``), from the store the collection flows write (the accounting's
running runs, ``job_nodes``, dcgm-exporter's activity samples), attributed to runs as
``datasets.job_telemetry.ATTRIBUTION_RULE`` says: a run's activity when alone (mean over its
used instants at which no other run held any of its nodes, summed incrementally per run up
to a watermark ``settle_s`` behind the telemetry: ``AloneTally``) over its activity now (mean
over its used instants of the last ``window_s``, beside others or not). Predicted
(``predict_slowdowns``): the calibration's ``AnalyticModel`` at the placements Slurm shows
now: the job's iteration time beside every running ring over its time with no other ring
(each bounded below by its best time, as ``datasets.contention_fit`` predicts activity).
A job's profile is its learned one (``datasets.comm_profiles.lookup``: the profile book the
loop learned from earlier runs' telemetry, by name, else by user and GPUs) where the
calibration holds it (a cluster fit holds ``history:name=NAME``): the profile the live policy
gives it (``deployer.profiles``). The ratio observed / predicted is 1 where the model is right.

The calibration is the one the loop uses (``deployer.calibration``) unless that is the shipped
one, which describes other testbeds: then there is none, and every job says so.

Nothing is guessed: a job without what it needs gets no series and is counted by why
(``REASONS``): no calibration of the cluster, the store unreadable, the run not in the accounting
yet, no profile for its name, a ring sharing its links whose profile is unknown, too few
GPU-seconds alone (``min_alone_gpu_s``), too few used instants now (``min_recent``: a node
shared without ``hpc_job`` labels has none), or no activity now.

The alone baseline excludes other runs on the job's nodes, not rings elsewhere sharing a
switch uplink with it (none on a non-blocking fabric); the prediction's baseline is the job
with no other ring at all.
"""

from __future__ import annotations

import logging
import math
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import duckdb
import polars as pl

from linkwise.cluster.contention import AnalyticModel
from linkwise.cluster.domain import Job, Placement, Topology
from linkwise.cluster.profiles import Calibration
from linkwise.datasets.comm_profiles import ProfileBook, lookup
from linkwise.datasets.contention_fit.data import MIN_ACTIVITY_GPU_S
from linkwise.datasets.job_telemetry import KEY, activity_instants, telemetry_horizon
from linkwise.deployer.events import log_event

__all__ = [
    "REASONS",
    "AloneTally",
    "DriftMonitor",
    "DriftReport",
    "DriftSettings",
    "JobSlowdown",
    "LiveRun",
    "drift_report",
    "observe_slowdowns",
    "predict_slowdowns",
    "profile_of",
    "running_runs",
]

REASONS = (
    "no_calibration",
    "no_store",
    "not_in_store",
    "no_profile",
    "neighbour_unknown",
    "too_few_alone",
    "too_few_recent",
    "no_activity_now",
)
"""Why a running job has no slowdown series (``linkwise_serve_slowdown_unobserved_jobs``)."""

Key = tuple[str, int, float, int]


@dataclass(frozen=True, slots=True)
class DriftSettings:
    """How much data a job needs, and how often the loop looks."""

    window_s: float = 300.0  # "now": the activity of the last window_s
    min_recent: int = 3  # used activity instants the window needs
    min_alone_gpu_s: float = MIN_ACTIVITY_GPU_S  # GPU-seconds alone the baseline needs
    interval_s: float = 30.0  # the telemetry's scrape interval (a sample's GPU-seconds)
    settle_s: float = 600.0  # the alone tally stays this far behind the telemetry's horizon
    every_s: float = 60.0  # the loop computes the drift at most this often
    calibration_every_s: float = 600.0  # and looks for a newer calibration this often


@dataclass(frozen=True, slots=True)
class LiveRun:
    """A running job as the loop sees it: id, name, where it runs, its user."""

    job_id: int
    name: str
    placement: Placement
    user: str = ""


@dataclass(frozen=True, slots=True)
class JobSlowdown:
    """A running job's observed and predicted slowdown (1: as fast as alone)."""

    job_id: int
    observed: float
    predicted: float

    @property
    def ratio(self) -> float:
        return self.observed / self.predicted


@dataclass(frozen=True)
class DriftReport:
    """The jobs with both slowdowns, and the running jobs without, by reason."""

    jobs: tuple[JobSlowdown, ...]
    missing: Mapping[str, int]

    @property
    def median_ratio(self) -> float | None:
        return statistics.median(j.ratio for j in self.jobs) if self.jobs else None


@dataclass(frozen=True)
class AloneTally:
    """Per running run, its activity summed over the used instants at which it was alone
    before ``watermark`` (activity sum, GPUs), for an incremental baseline."""

    sums: Mapping[Key, tuple[float, float]] = field(default_factory=dict)
    watermark: float | None = None


# ------------------------------------------------------------------------ observed


def running_runs(
    con: duckdb.DuckDBPyConnection, job_ids: Sequence[int], cluster: str | None
) -> pl.DataFrame:
    """The accounting's running run (started, not ended; the latest start) of each of
    ``job_ids``: ``KEY`` and ``t0``."""
    frame: pl.DataFrame = con.sql(
        "SELECT cluster, job_id, submit_time, run_index, start_time AS t0 FROM jobs "
        "WHERE start_time IS NOT NULL AND end_time IS NULL AND list_contains($ids, job_id) "
        "AND (CAST($cluster AS VARCHAR) IS NULL OR cluster = $cluster) "
        "QUALIFY row_number() OVER (PARTITION BY job_id ORDER BY start_time DESC) = 1",
        params={"ids": [int(j) for j in job_ids], "cluster": cluster},
    ).pl()
    return frame


_BUSY = """
    SELECT t.cluster, t.job_id, t.submit_time, t.run_index,
           o.start_time AS b0, coalesce(o.end_time, CAST('inf' AS DOUBLE)) AS b1
    FROM targets AS t
    JOIN job_nodes AS tn USING (cluster, job_id, submit_time, run_index)
    JOIN job_nodes AS onn ON onn.cluster = tn.cluster AND onn.node = tn.node
    JOIN jobs AS o ON o.cluster = onn.cluster AND o.job_id = onn.job_id
        AND o.submit_time = onn.submit_time AND o.run_index = onn.run_index
    WHERE o.start_time IS NOT NULL AND o.start_time < $hi
      AND coalesce(o.end_time, CAST('inf' AS DOUBLE)) > $lo
      AND NOT (o.job_id = t.job_id AND o.submit_time = t.submit_time
               AND o.run_index = t.run_index)
"""
"""When another run held a node of each target run (between $lo and $hi)."""


def _alone_used(
    con: duckdb.DuckDBPyConnection, targets: pl.DataFrame, lo: float, hi: float
) -> pl.DataFrame:
    """The targets' used activity instants in [lo, hi) at which no other run held any of
    their nodes: ``KEY``, ts, s (activity summed), g (GPUs)."""
    used = activity_instants(con, targets, lo=lo, hi=hi).filter(pl.col("cat") == "used")
    con.register("targets", targets.select(KEY))
    try:
        busy = con.sql(_BUSY, params={"lo": lo, "hi": hi}).pl()
    finally:
        con.unregister("targets")
    covered = (
        used.select(*KEY, "ts")
        .unique()
        .join(busy, on=list(KEY), how="inner")
        .filter((pl.col("b0") <= pl.col("ts")) & (pl.col("ts") < pl.col("b1")))
        .select(*KEY, "ts")
        .unique()
    )
    return used.join(covered, on=[*KEY, "ts"], how="anti").select(*KEY, "ts", "s", "g")


def _key(row: Mapping[str, Any]) -> Key:
    return (
        str(row["cluster"]),
        int(row["job_id"]),
        float(row["submit_time"]),
        int(row["run_index"]),
    )


def tally_alone(
    con: duckdb.DuckDBPyConnection,
    tally: AloneTally,
    runs: pl.DataFrame,
    until: float,
) -> AloneTally:
    """``tally`` advanced to ``until`` for ``runs`` (``running_runs``): a run already in it
    adds its instants from the watermark on, a new one from its start; runs no longer
    given are dropped."""
    if runs.height == 0:
        return AloneTally({}, until)
    keys = [_key(r) for r in runs.iter_rows(named=True)]
    starts = {k: float(t0) for k, t0 in zip(keys, runs["t0"], strict=True)}
    mark = tally.watermark
    los = {k: (mark if k in tally.sums and mark is not None else starts[k]) for k in keys}
    lo = min(los.values())
    sums = {k: tally.sums.get(k, (0.0, 0.0)) for k in keys}
    if until > lo:
        rows = _alone_used(con, runs, lo, until)
        for r in rows.iter_rows(named=True):
            k = _key(r)
            if k in los and float(r["ts"]) >= los[k]:
                s, g = sums[k]
                sums[k] = (s + float(r["s"]), g + float(r["g"]))
    return AloneTally(sums, max(until, mark) if mark is not None else until)


def observe_slowdowns(
    con: duckdb.DuckDBPyConnection,
    job_ids: Sequence[int],
    tally: AloneTally,
    *,
    now: float,
    cluster: str | None,
    settings: DriftSettings,
) -> tuple[dict[int, float], dict[int, str], AloneTally]:
    """Per job of ``job_ids``: its observed slowdown (activity alone over activity now), or
    why there is none; and the alone tally advanced (module docstring)."""
    runs = running_runs(con, job_ids, cluster)
    missing = {j: "not_in_store" for j in job_ids if j not in set(runs["job_id"].to_list())}
    horizon = telemetry_horizon(con, cluster)
    cut = min(now, horizon if horizon is not None else -math.inf) - settings.settle_s
    tally = tally_alone(con, tally, runs, cut) if math.isfinite(cut) else tally
    recent = (
        activity_instants(con, runs, lo=now - settings.window_s, hi=now)
        .filter(pl.col("cat") == "used")
        .group_by(KEY)
        .agg(pl.col("s").sum(), pl.col("g").sum(), pl.col("ts").n_unique().alias("instants"))
        if runs.height
        else pl.DataFrame()
    )
    now_of = {_key(r): r for r in recent.iter_rows(named=True)}
    observed: dict[int, float] = {}
    for row in runs.iter_rows(named=True):
        k = _key(row)
        job = int(row["job_id"])
        s, g = tally.sums.get(k, (0.0, 0.0))
        if g * settings.interval_s < settings.min_alone_gpu_s or s <= 0:
            missing[job] = "too_few_alone"
            continue
        cur = now_of.get(k)
        if cur is None or int(cur["instants"]) < settings.min_recent:
            missing[job] = "too_few_recent"
            continue
        if float(cur["s"]) <= 0 or float(cur["g"]) <= 0:
            missing[job] = "no_activity_now"
            continue
        observed[job] = (s / g) / (float(cur["s"]) / float(cur["g"]))
    return observed, missing, tally


# ------------------------------------------------------------------------ predicted


def profile_of(calibration: Calibration, run: LiveRun, book: ProfileBook | None) -> str | None:
    """The job's learned profile where the calibration holds it (``comm_profiles.lookup``:
    the one rule the live policy's profiles follow too); None without a book."""
    if book is None:
        return None
    found = lookup(book, run.name, run.user, run.placement.num_gpus, calibration.profiles)
    return found.profile.name if found is not None else None


def predict_slowdowns(
    topology: Topology,
    model: AnalyticModel,
    live: Sequence[LiveRun],
    book: ProfileBook | None,
) -> tuple[dict[int, float], dict[int, str]]:
    """Per live job: its predicted slowdown at its placement beside every other running
    ring (module docstring), or why there is none (no learned profile the calibration
    holds, ``profile_of``; a split ring sharing one of its links whose profile is unknown)."""
    placed: list[tuple[Job, Placement]] = []
    unknown_links: set[int] = set()
    missing: dict[int, str] = {}
    for run in live:
        prof = profile_of(model.calibration, run, book)
        if prof is None:
            missing[run.job_id] = "no_profile"
            if len(run.placement.alloc) > 1:
                unknown_links.update(topology.ring_links(run.placement.nodes, run.job_id))
            continue
        job = Job(run.job_id, 0.0, run.placement.num_gpus, 1.0, profile=prof, name=run.name)
        placed.append((job, run.placement))
    if not placed:
        return {}, missing
    times = model.iteration_times(topology, placed)
    predicted: dict[int, float] = {}
    for (job, placement), t_now in zip(placed, times, strict=True):
        if len(placement.alloc) > 1 and unknown_links.intersection(
            topology.ring_links(placement.nodes, job.job_id)
        ):
            missing[job.job_id] = "neighbour_unknown"
            continue
        (t_alone,) = model.iteration_times(topology, [(job, placement)])
        best = model.best_time(topology, job)
        predicted[job.job_id] = max(t_now, best) / max(t_alone, best)
    return predicted, missing


# ------------------------------------------------------------------------ the loop's part


def drift_report(
    observed: Mapping[int, float],
    observed_missing: Mapping[int, str],
    predicted: Mapping[int, float],
    predicted_missing: Mapping[int, str],
    job_ids: Sequence[int],
) -> DriftReport:
    """Both slowdowns of the jobs that have them; every other job counted once, by the
    first reason in ``REASONS`` order."""
    jobs: list[JobSlowdown] = []
    missing = dict.fromkeys(REASONS, 0)
    for j in job_ids:
        why = [r for r in (observed_missing.get(j), predicted_missing.get(j)) if r is not None]
        if why:
            missing[min(why, key=REASONS.index)] += 1
        elif j in observed and j in predicted:
            jobs.append(JobSlowdown(j, observed[j], predicted[j]))
    return DriftReport(tuple(jobs), missing)


class DriftMonitor:
    """The live loop's drift state: the calibration (``calibration()``: the loop's, None
    when that is the shipped one; asked every ``calibration_every_s``), its model, the alone
    tally, and when it last looked (``due``)."""

    def __init__(
        self,
        topology: Topology,
        cluster: str | None,
        calibration: Callable[[], Calibration | None],
        settings: DriftSettings | None = None,
        *,
        logger: logging.Logger | None = None,
    ) -> None:
        self.topology = topology
        self.cluster = cluster
        self.find_calibration = calibration
        self.settings = settings or DriftSettings()
        self.log = logger or logging.getLogger("linkwise.serve")
        self.model: AnalyticModel | None = None
        self.looked_up = -math.inf
        self.last = -math.inf
        self.tally = AloneTally()

    def due(self, now: float) -> bool:
        return now - self.last >= self.settings.every_s

    def _model(self, now: float) -> AnalyticModel | None:
        if now - self.looked_up >= self.settings.calibration_every_s:
            self.looked_up = now
            try:
                cal = self.find_calibration()
            except Exception as exc:  # a registry that does not answer: keep the last one
                log_event(self.log, "calibration_lookup_failed", logging.WARNING, error=str(exc))
                return self.model
            if cal is None:
                self.model = None
            elif self.model is None or self.model.calibration != cal:
                self.model = AnalyticModel(cal)
        return self.model

    def update(
        self,
        live: Sequence[LiveRun],
        read: Callable[[Callable[[duckdb.DuckDBPyConnection], Any]], Any],
        now: float | None = None,
        book: Callable[[Calibration], ProfileBook | None] = lambda _cal: None,
    ) -> DriftReport:
        """The report for the running jobs ``live``; ``read(fn)`` runs ``fn`` on a store
        connection (None: the store could not be read); ``book(calibration)``: the profile
        book learned from the store (``deployer.profiles.LearnedBook``)."""
        t = time.time() if now is None else now
        self.last = t
        ids = [r.job_id for r in live]
        model = self._model(t)
        if model is None:
            return DriftReport((), {**dict.fromkeys(REASONS, 0), "no_calibration": len(ids)})
        predicted, p_missing = predict_slowdowns(
            self.topology, model, live, book(model.calibration)
        )

        def observe(con: duckdb.DuckDBPyConnection) -> Any:
            return observe_slowdowns(
                con, ids, self.tally, now=t, cluster=self.cluster, settings=self.settings
            )

        got = read(observe) if ids else ({}, {}, AloneTally({}, self.tally.watermark))
        if got is None:
            return DriftReport((), {**dict.fromkeys(REASONS, 0), "no_store": len(ids)})
        observed, o_missing, self.tally = got
        return drift_report(observed, o_missing, predicted, p_missing, ids)
