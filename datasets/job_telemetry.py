"""Per-job telemetry: link bytes and GPU activity attributed to the job runs that caused them.

Inputs are what the collectors store: ``link_load`` (NVLink and PCIe rates per GPU from the
DCGM exporter, InfiniBand/Ethernet rates per NIC port derived from node_exporter, sysfs or
``perfquery`` counters; ``datasets.telemetry``), the DCGM activity samples in
``telemetry_samples`` (``DCGM_FI_PROF_SM_ACTIVE``, a ratio, preferred; else
``DCGM_FI_DEV_GPU_UTIL``, a percentage; the ``hpc_job`` label in the ``job`` column when the
operator enables dcgm-exporter's HPC job mapping) and the accounting (``jobs`` x ``job_nodes``:
which run held how many GPUs of which node, from when to when). The accounting keeps no GPU
indices, so without the ``hpc_job`` label a GPU's samples are a job's only when the job is
alone on the node. ``ATTRIBUTION_RULE`` says it all; ``build_job_telemetry`` fills the
``job_telemetry`` table (migration 8) incrementally: every finished run not summarized yet
whose end the telemetry has passed (by ``settle_s``), in batches, each its own transaction;
building again adds nothing (``rebuild`` recomputes every row). Units: bytes, seconds,
activity as a ratio in [0, 1].
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

import duckdb
import polars as pl

from linkwise.datasets.store import run_sql, scalar

__all__ = [
    "ACTIVITY_METRICS",
    "ATTRIBUTION_RULE",
    "GPU_CLASSES",
    "KEY",
    "LINK_CLASSES",
    "NIC_CLASSES",
    "JobTelemetryReport",
    "activity_categories",
    "activity_instants",
    "build_job_telemetry",
    "categorize_instants",
    "grid_count",
    "link_categories",
    "read_job_telemetry",
    "summarize",
    "telemetry_horizon",
]

ATTRIBUTION_RULE = (
    "A link_load row covers [ts, ts + interval_s) of one device of one node; its occupants are "
    "the job runs holding GPUs of that node at any moment of it (a run still running holds "
    "them until now). NVLink and PCIe rows (per GPU) and GPU activity samples (instants) of a "
    "node whose exporter labels GPUs with hpc_job at that time belong to the run their label "
    "names; a GPU without the label there belongs to nobody. Every other row (InfiniBand and "
    "Ethernet rows always, GPU rows without labels) belongs to a run only when that run is "
    "the node's only occupant for the whole interval (for an activity sample: at its "
    "instant): it gets all of it, every GPU of the node (a GPU outside its allocation is idle: "
    "Slurm confines jobs to their GPUs), so its activity there is the node's summed activity "
    "over its own GPU count, and only when at least that many GPUs reported. A row with "
    "several occupants is shared and a row whose only occupant started or ended inside it is "
    "an edge: neither is attributed (nor split), both are counted. Activity outside [0, 1] "
    "(GPU_UTIL outside [0, 100]) is bad: counted, not used."
)
"""The attribution rule, as the reports and the README state it."""

KEY = ("cluster", "job_id", "submit_time", "run_index")
"""A run's key in ``jobs``, ``job_nodes`` and ``job_telemetry``."""
GPU_CLASSES = ("nvlink", "pcie")
"""Link classes measured per GPU (DCGM)."""
NIC_CLASSES = ("ib", "eth")
"""Link classes measured per NIC port (node_exporter, sysfs, perfquery)."""
LINK_CLASSES = (*GPU_CLASSES, *NIC_CLASSES)
ACTIVITY_METRICS: Mapping[str, float] = {
    "DCGM_FI_PROF_SM_ACTIVE": 1.0,
    "DCGM_FI_DEV_GPU_UTIL": 0.01,
}
"""GPU activity fields and the factor to a ratio; the first one present at an instant wins."""

_INF = "CAST('inf' AS DOUBLE)"
_RUNS = f"""
    runs AS (
        SELECT j.cluster, j.job_id, j.submit_time, j.run_index, n.node, n.gpus AS node_gpus,
               j.start_time AS t0, coalesce(j.end_time, {_INF}) AS t1
        FROM jobs AS j JOIN job_nodes AS n USING (cluster, job_id, submit_time, run_index)
        WHERE j.start_time IS NOT NULL AND coalesce(j.end_time, {_INF}) > j.start_time
          AND j.start_time < $hi AND coalesce(j.end_time, {_INF}) > $lo
    ),
    tgt AS (SELECT r.* FROM runs AS r JOIN targets USING (cluster, job_id, submit_time, run_index))
"""

# One row per (run, node, scrape interval, link class) on the run's nodes during its run:
# bytes attributed to it, the GPUs they came from, and whether the interval was used,
# shared or an edge for it. Whole-GPU rows win over per-link rows of the same GPU and tx/rx
# rows over a total of the same device, so nothing is counted twice.
_LINK_SLOTS = f"""
WITH {_RUNS},
lr AS (
    SELECT t.cluster, t.job_id, t.submit_time, t.run_index, t.node_gpus, t.t0, t.t1,
           l.node, l.device, l.link_class, l.direction, l.ts, l.interval_s,
           l.bytes_per_s * l.interval_s AS bytes,
           regexp_replace(l.device, ':link.*$', '') AS base_dev,
           contains(l.device, ':link') AS is_link
    FROM tgt AS t JOIN link_load AS l
      ON l.node = t.node AND (l.cluster = t.cluster OR l.cluster = '')
     AND l.ts < t.t1 AND l.ts + l.interval_s > t.t0
    WHERE l.ts >= $lo - $lookback AND l.ts < $hi
),
kept AS (
    SELECT * FROM (
        SELECT *,
            bool_or(NOT is_link) OVER (PARTITION BY cluster, job_id, submit_time, run_index,
                node, base_dev, link_class, direction, ts) AS whole,
            bool_or(direction <> 'total') OVER (PARTITION BY cluster, job_id, submit_time,
                run_index, node, base_dev, link_class, ts) AS directed
        FROM lr
    ) WHERE (NOT is_link OR NOT whole) AND (direction <> 'total' OR NOT directed)
),
slots AS (SELECT DISTINCT cluster, node, ts, interval_s FROM kept),
occ AS (
    SELECT s.cluster, s.node, s.ts, s.interval_s, count(*) AS n
    FROM slots AS s JOIN runs AS r
      ON r.cluster = s.cluster AND r.node = s.node AND r.t0 < s.ts + s.interval_s AND r.t1 > s.ts
    GROUP BY ALL
),
lab AS (
    SELECT host AS node, labels->>'gpu' AS gpu, ts, min(job) AS job
    FROM telemetry_samples
    WHERE job IS NOT NULL AND job <> '' AND starts_with(metric, 'DCGM_')
      AND ts >= $lo - $lookback AND ts < $hi
    GROUP BY ALL
),
labelled AS (SELECT DISTINCT node, ts FROM lab),
cat AS (
    SELECT k.*, o.n,
        k.link_class IN ('nvlink', 'pcie') AND ln.node IS NOT NULL AS by_label,
        CASE
            WHEN k.link_class IN ('nvlink', 'pcie') AND ln.node IS NOT NULL THEN
                CASE WHEN lb.job = CAST(k.job_id AS VARCHAR) THEN 'used' ELSE 'other' END
            WHEN o.n = 1 AND k.t0 <= k.ts AND k.ts + k.interval_s <= k.t1 THEN 'used'
            WHEN o.n = 1 THEN 'edge'
            ELSE 'shared'
        END AS cat
    FROM kept AS k JOIN occ AS o USING (cluster, node, ts, interval_s)
    LEFT JOIN labelled AS ln ON ln.node = k.node AND ln.ts = k.ts
    LEFT JOIN lab AS lb ON lb.node = k.node AND lb.ts = k.ts
        AND lb.gpu = regexp_extract(k.base_dev, '^gpu([^:]+)', 1)
)
SELECT cluster, job_id, submit_time, run_index, node, ts, link_class,
       any_value(interval_s) AS interval_s, any_value(node_gpus) AS node_gpus,
       any_value(t0) AS t0, any_value(t1) AS t1, bool_or(by_label) AS by_label,
       coalesce(sum(bytes) FILTER (WHERE cat = 'used'), 0.0) AS bytes,
       count(DISTINCT base_dev) FILTER (WHERE cat = 'used') AS devices,
       bool_or(cat = 'used') AS used, bool_or(cat = 'shared') AS shared,
       bool_or(cat = 'edge') AS edge
FROM cat WHERE cat <> 'other'
GROUP BY cluster, job_id, submit_time, run_index, node, ts, link_class
"""

# One row per (run, node, instant with activity samples) during the run: the samples of the
# GPUs labelled with the run's job, and of every GPU of the node, with their validity.
_ACTIVITY_INSTANTS = f"""
WITH {_RUNS},
act AS (
    SELECT host AS node, ts,
           concat(labels->>'gpu', coalesce(':mig' || (labels->>'GPU_I_ID'), '')) AS dev,
           max(job) AS job,
           arg_max(value * CASE metric WHEN 'DCGM_FI_PROF_SM_ACTIVE' THEN 1.0 ELSE 0.01 END,
                   CASE metric WHEN 'DCGM_FI_PROF_SM_ACTIVE' THEN 1 ELSE 0 END) AS ratio
    FROM telemetry_samples
    WHERE metric IN ('DCGM_FI_PROF_SM_ACTIVE', 'DCGM_FI_DEV_GPU_UTIL')
      AND ts >= $lo AND ts < $hi AND host IS NOT NULL
    GROUP BY host, ts, dev
),
inst AS (SELECT DISTINCT node, ts FROM act),
iocc AS (
    SELECT r.cluster, i.node, i.ts, count(*) AS n
    FROM inst AS i JOIN runs AS r ON r.node = i.node AND r.t0 <= i.ts AND i.ts < r.t1
    GROUP BY ALL
)
SELECT t.cluster, t.job_id, t.submit_time, t.run_index, t.node,
       any_value(t.node_gpus) AS node_gpus, any_value(t.t0) AS t0, any_value(t.t1) AS t1,
       a.ts, any_value(o.n) AS n,
       bool_or(a.job IS NOT NULL AND a.job <> '') AS labelled,
       count(*) FILTER (WHERE a.job = CAST(t.job_id AS VARCHAR)) AS mine,
       count(*) FILTER (WHERE a.job = CAST(t.job_id AS VARCHAR)
                        AND NOT (a.ratio BETWEEN 0 AND 1)) AS mine_bad,
       coalesce(sum(a.ratio) FILTER (WHERE a.job = CAST(t.job_id AS VARCHAR)
                                     AND a.ratio BETWEEN 0 AND 1), 0.0) AS mine_sum,
       count(*) AS all_n,
       count(*) FILTER (WHERE NOT (a.ratio BETWEEN 0 AND 1)) AS all_bad,
       coalesce(sum(a.ratio) FILTER (WHERE a.ratio BETWEEN 0 AND 1), 0.0) AS all_sum
FROM tgt AS t
JOIN act AS a ON a.node = t.node AND a.ts >= t.t0 AND a.ts < t.t1
JOIN iocc AS o ON o.cluster = t.cluster AND o.node = t.node AND o.ts = a.ts
GROUP BY t.cluster, t.job_id, t.submit_time, t.run_index, t.node, a.ts
"""

_SUMMARY_COLUMNS = (
    *KEY,
    "name",
    "user_name",
    "gpus",
    "nodes",
    "start_time",
    "end_time",
    "interval_s",
    *(f"{c}_{what}" for c in LINK_CLASSES for what in ("bytes", "gpu_s")),
    *(f"{c}_node_s" for c in NIC_CLASSES),
    *(f"{c}_bytes_per_gpu_s" for c in LINK_CLASSES),
    "activity_alone",
    "activity_alone_gpu_s",
    "activity_beside",
    "activity_beside_gpu_s",
    "link_used",
    "link_shared",
    "link_edge",
    "link_missing",
    "activity_used",
    "activity_shared",
    "activity_bad",
    "activity_missing",
    "built_at",
)
_COUNTS = (
    "link_used",
    "link_shared",
    "link_edge",
    "link_missing",
    "activity_used",
    "activity_shared",
    "activity_bad",
    "activity_missing",
)


@dataclass(frozen=True, slots=True)
class JobTelemetryReport:
    """What one build did: runs summarized (and how many of them had any attributed link or
    activity sample), runs left for a later build because the telemetry has not passed their
    end yet, the telemetry horizon, the samples by kind (``_COUNTS``, summed over the runs
    built) and the rule."""

    built: int
    with_telemetry: int
    waiting: int
    horizon: float | None
    counts: tuple[tuple[str, int], ...]
    seconds: float
    rule: str = ATTRIBUTION_RULE

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["counts"] = dict(self.counts)
        return d


def grid_count(phase: pl.Expr, lo: pl.Expr, hi: pl.Expr, step: float, *, open_lo: bool) -> pl.Expr:
    """How many scrape times ``phase + k x step`` (k any integer) lie in (lo, hi), or in
    [lo, hi) unless ``open_lo``."""
    first = ((lo - phase) / step).floor() + 1 if open_lo else ((lo - phase) / step).ceil()
    return (((hi - phase) / step).ceil() - first).clip(lower_bound=0).cast(pl.Int64)


def _family() -> pl.Expr:
    """Each exporter scrapes at its own times: GPU rows (DCGM) and NIC rows apart."""
    gpu = pl.col("link_class").is_in(list(GPU_CLASSES))
    return pl.when(gpu).then(pl.lit("gpu")).otherwise(pl.lit("nic"))


def link_categories(slots: pl.DataFrame, *, interval_s: float) -> tuple[pl.DataFrame, pl.DataFrame]:
    """From ``_LINK_SLOTS`` rows: per (run, link class) the bytes attributed, the GPU-seconds
    and node-seconds they cover; and per run the scrape intervals (of one node and one
    exporter family, GPU or NIC) used (some row attributed), shared (none attributed, some
    shared) and at an edge (only edge rows), with how many intervals the (node, family)
    pairs present should have had on their scrape grid (``link_expected``) and on how many
    nodes (``link_nodes``)."""
    g = pl.when(pl.col("by_label")).then(pl.col("devices")).otherwise(pl.col("node_gpus"))
    used = pl.col("used")
    per_class = slots.group_by(*KEY, "link_class").agg(
        pl.col("bytes").sum().alias("bytes"),
        (g * pl.col("interval_s")).filter(used).sum().alias("gpu_s"),
        pl.col("interval_s").filter(used).sum().alias("node_s"),
    )
    per_interval = (
        slots.with_columns(_family().alias("family"))
        .group_by(*KEY, "node", "family", "ts")
        .agg(
            pl.col("used").any(),
            pl.col("shared").any(),
            pl.col("edge").any(),
            pl.col("t0").first(),
            pl.col("t1").first(),
        )
    )
    grid = grid_count(
        pl.col("phase"), pl.col("t0") - interval_s, pl.col("t1"), interval_s, open_lo=True
    )
    expected = (
        per_interval.group_by(*KEY, "node", "family")
        .agg(pl.col("ts").min().alias("phase"), pl.col("t0").first(), pl.col("t1").first())
        .with_columns(grid.alias("expected"))
        .group_by(*KEY)
        .agg(
            pl.col("expected").sum().alias("link_expected"),
            pl.col("node").n_unique().alias("link_nodes"),
        )
    )
    counts = per_interval.group_by(*KEY).agg(
        pl.col("used").sum().alias("link_used"),
        (~pl.col("used") & pl.col("shared")).sum().alias("link_shared"),
        (~pl.col("used") & ~pl.col("shared") & pl.col("edge")).sum().alias("link_edge"),
    )
    return per_class, counts.join(expected, on=list(KEY), how="left")


def categorize_instants(instants: pl.DataFrame) -> pl.DataFrame:
    """``_ACTIVITY_INSTANTS`` rows with, per (run, node, instant), its category ``cat``
    (used, shared, bad, missing: ``ATTRIBUTION_RULE``), the GPUs it covers ``g`` and their
    summed activity ``s``."""
    lab = pl.col("labelled")
    bad = pl.when(lab).then(pl.col("mine_bad") > 0).otherwise(pl.col("all_bad") > 0)
    shared = ~lab & (pl.col("n") > 1)
    usable = pl.when(lab).then(pl.col("mine") > 0).otherwise(pl.col("all_n") >= pl.col("node_gpus"))
    cat = (
        pl.when(shared)
        .then(pl.lit("shared"))
        .when(bad)
        .then(pl.lit("bad"))
        .when(usable)
        .then(pl.lit("used"))
        .otherwise(pl.lit("missing"))
    )
    gpus = pl.when(lab).then(pl.col("mine")).otherwise(pl.col("node_gpus")).cast(pl.Float64)
    act_sum = pl.when(lab).then(pl.col("mine_sum")).otherwise(pl.col("all_sum"))
    return instants.with_columns(cat.alias("cat"), gpus.alias("g"), act_sum.alias("s"))


def activity_instants(
    con: duckdb.DuckDBPyConnection, targets: pl.DataFrame, *, lo: float, hi: float
) -> pl.DataFrame:
    """The categorized activity instants (``categorize_instants``) in [lo, hi) of the runs
    ``targets`` (``KEY`` columns) names, finished or still running (a running run holds its
    nodes until now); ``t1`` is inf for a running run."""
    con.register("targets", targets.select(KEY))
    try:
        instants = con.sql(_ACTIVITY_INSTANTS, params={"lo": lo, "hi": hi}).pl()
    finally:
        con.unregister("targets")
    return categorize_instants(instants)


def activity_categories(instants: pl.DataFrame, *, interval_s: float) -> pl.DataFrame:
    """From ``_ACTIVITY_INSTANTS`` rows: per run the instants used, shared and bad, and the
    GPU-weighted mean activity while alone on the node and beside other runs, with the GPUs
    they cover (summed over instants); and how many instants the nodes with samples should
    have had on their scrape grid (``activity_expected``, ``activity_nodes``). Labelled
    instants read the run's own GPUs (none of them reporting: missing); unlabelled ones need
    the run alone and every one of its GPUs' worth of samples (fewer: missing)."""
    df = categorize_instants(instants)
    is_used = pl.col("cat") == "used"
    alone = is_used & (pl.col("n") == 1)
    beside = is_used & (pl.col("n") > 1)
    grid = grid_count(pl.col("phase"), pl.col("t0"), pl.col("t1"), interval_s, open_lo=False)
    expected = (
        instants.group_by(*KEY, "node")
        .agg(pl.col("ts").min().alias("phase"), pl.col("t0").first(), pl.col("t1").first())
        .with_columns(grid.alias("expected"))
        .group_by(*KEY)
        .agg(
            pl.col("expected").sum().alias("activity_expected"),
            pl.col("node").n_unique().alias("activity_nodes"),
        )
    )
    per_run = df.group_by(*KEY).agg(
        is_used.sum().alias("activity_used"),
        (pl.col("cat") == "shared").sum().alias("activity_shared"),
        (pl.col("cat") == "bad").sum().alias("activity_bad"),
        pl.col("s").filter(alone).sum().alias("_alone_sum"),
        pl.col("g").filter(alone).sum().alias("_alone_g"),
        pl.col("s").filter(beside).sum().alias("_beside_sum"),
        pl.col("g").filter(beside).sum().alias("_beside_g"),
    )
    return per_run.join(expected, on=list(KEY), how="left")


def summarize(
    targets: pl.DataFrame,
    per_class: pl.DataFrame,
    link_counts: pl.DataFrame,
    activity: pl.DataFrame,
    *,
    interval_s: float,
    now: float,
) -> pl.DataFrame:
    """The ``job_telemetry`` rows of ``targets`` (``KEY``, name, user_name, gpus, nodes,
    start_time, end_time) from the attribution frames: bytes and coverage per link class,
    bytes per GPU-second (null without coverage), activity alone and beside others (null
    without a used instant), and every count: missing = the scrapes expected on the grid of
    each node's samples (``grid_count``; a node without any: its run's length in scrapes)
    less the others."""
    out = targets.with_columns(pl.lit(interval_s).alias("interval_s"))
    for c in LINK_CLASSES:
        part = per_class.filter(pl.col("link_class") == c).select(
            *KEY,
            pl.col("bytes").alias(f"{c}_bytes"),
            pl.col("gpu_s").alias(f"{c}_gpu_s"),
            pl.col("node_s").alias(f"{c}_node_s"),
        )
        out = out.join(part, on=list(KEY), how="left")
    out = out.join(link_counts, on=list(KEY), how="left").join(activity, on=list(KEY), how="left")
    zero = [
        *(f"{c}_{w}" for c in LINK_CLASSES for w in ("bytes", "gpu_s", "node_s")),
        "link_used",
        "link_shared",
        "link_edge",
        "link_expected",
        "link_nodes",
        "activity_used",
        "activity_shared",
        "activity_bad",
        "activity_expected",
        "activity_nodes",
        "_alone_sum",
        "_alone_g",
        "_beside_sum",
        "_beside_g",
    ]
    out = out.with_columns(pl.col(zero).fill_null(0))
    # a node without any sample of the kind: its run's length in scrapes (grid unknown)
    blind = ((pl.col("end_time") - pl.col("start_time")) / interval_s).ceil().cast(pl.Int64)
    link_expected = pl.col("link_expected") + (pl.col("nodes") - pl.col("link_nodes")) * blind
    act_expected = (
        pl.col("activity_expected") + (pl.col("nodes") - pl.col("activity_nodes")) * blind
    )
    seen_links = pl.col("link_used") + pl.col("link_shared") + pl.col("link_edge")
    seen_act = pl.col("activity_used") + pl.col("activity_shared") + pl.col("activity_bad")
    out = out.with_columns(
        *(
            pl.when(pl.col(f"{c}_gpu_s") > 0)
            .then(pl.col(f"{c}_bytes") / pl.col(f"{c}_gpu_s"))
            .alias(f"{c}_bytes_per_gpu_s")
            for c in LINK_CLASSES
        ),
        pl.when(pl.col("_alone_g") > 0)
        .then(pl.col("_alone_sum") / pl.col("_alone_g"))
        .alias("activity_alone"),
        (pl.col("_alone_g") * pl.col("interval_s")).alias("activity_alone_gpu_s"),
        pl.when(pl.col("_beside_g") > 0)
        .then(pl.col("_beside_sum") / pl.col("_beside_g"))
        .alias("activity_beside"),
        (pl.col("_beside_g") * pl.col("interval_s")).alias("activity_beside_gpu_s"),
        (link_expected - seen_links).clip(lower_bound=0).alias("link_missing"),
        (act_expected - seen_act).clip(lower_bound=0).alias("activity_missing"),
        pl.lit(now).alias("built_at"),
    )
    return out.select(_SUMMARY_COLUMNS).with_columns(pl.col(list(_COUNTS)).cast(pl.Int32))


def telemetry_horizon(con: duckdb.DuckDBPyConnection, cluster: str | None) -> float | None:
    """The newest time the store's telemetry reaches (link intervals' ends, samples' times)
    for ``cluster`` (telemetry collected without a cluster name counts for every cluster);
    None when there is none."""
    link = scalar(
        con,
        "SELECT max(ts + interval_s) FROM link_load "
        "WHERE CAST(? AS VARCHAR) IS NULL OR cluster = ? OR cluster = ''",
        [cluster, cluster],
    )
    samples = scalar(con, "SELECT max(ts) FROM telemetry_samples")
    known = [float(str(v)) for v in (link, samples) if v is not None]
    return max(known) if known else None


def _pending(
    con: duckdb.DuckDBPyConnection, cluster: str | None, until: float, rebuild: bool
) -> tuple[pl.DataFrame, int]:
    """Finished runs ending by ``until`` without a summary (every one with ``rebuild``), and
    how many finished runs end after it (waiting for telemetry)."""
    base = (
        "FROM jobs AS j WHERE j.start_time IS NOT NULL AND j.end_time IS NOT NULL "
        "AND j.end_time > j.start_time AND (CAST(? AS VARCHAR) IS NULL OR j.cluster = ?)"
    )
    fresh = (
        ""
        if rebuild
        else " AND NOT EXISTS (SELECT 1 FROM job_telemetry AS t WHERE t.cluster = j.cluster "
        "AND t.job_id = j.job_id AND t.submit_time = j.submit_time "
        "AND t.run_index = j.run_index)"
    )
    rows: pl.DataFrame = con.sql(
        "SELECT j.cluster, j.job_id, j.submit_time, j.run_index, j.name, j.user_name, j.gpus, "
        "(SELECT count(*) FROM job_nodes AS n WHERE n.cluster = j.cluster AND "
        "n.job_id = j.job_id AND n.submit_time = j.submit_time AND n.run_index = j.run_index) "
        f"AS nodes, j.start_time, j.end_time {base} AND j.end_time <= ?{fresh} "
        "ORDER BY j.end_time, j.cluster, j.job_id, j.submit_time, j.run_index",
        params=[cluster, cluster, until],
    ).pl()
    waiting = scalar(
        con, f"SELECT count(*) {base} AND j.end_time > ?{fresh}", [cluster, cluster, until]
    )
    return rows.cast({"nodes": pl.Int32, "gpus": pl.Int32, "run_index": pl.Int32}), int(
        str(waiting)
    )


def _attribute(
    con: duckdb.DuckDBPyConnection, targets: pl.DataFrame, *, interval_s: float, now: float
) -> pl.DataFrame:
    """The summaries of one batch of runs (queries over the store, then ``summarize``)."""
    lo = float(targets["start_time"].min())  # type: ignore[arg-type]
    hi = float(targets["end_time"].max())  # type: ignore[arg-type]
    params = {"lo": lo, "hi": hi, "lookback": 4.0 * interval_s}
    con.register("targets", targets.select(KEY))
    try:
        slots = con.sql(_LINK_SLOTS, params=params).pl()
        instants = con.sql(_ACTIVITY_INSTANTS, params={"lo": lo, "hi": hi}).pl()
    finally:
        con.unregister("targets")
    per_class, link_counts = link_categories(slots, interval_s=interval_s)
    activity = activity_categories(instants, interval_s=interval_s)
    return summarize(targets, per_class, link_counts, activity, interval_s=interval_s, now=now)


def _store(con: duckdb.DuckDBPyConnection, rows: pl.DataFrame) -> None:
    con.register("summary_batch", rows)
    try:
        cols = ", ".join(_SUMMARY_COLUMNS)
        run_sql(
            con,
            f"INSERT OR REPLACE INTO job_telemetry ({cols}) SELECT {cols} FROM summary_batch",
        )
    finally:
        con.unregister("summary_batch")


def build_job_telemetry(
    con: duckdb.DuckDBPyConnection,
    *,
    cluster: str | None = None,
    interval_s: float = 30.0,
    settle_s: float | None = None,
    rebuild: bool = False,
    batch: int = 200,
    now: float | None = None,
) -> JobTelemetryReport:
    """Summarize every finished run of ``cluster`` (None: all) not summarized yet whose end
    the telemetry has passed by ``settle_s`` (default three scrape intervals: InfiniBand
    rates are derived a scrape late), ``batch`` runs per transaction; ``rebuild``
    recomputes every such run. ``interval_s`` is the scrape interval the collection runs at
    (the expected samples). Nothing is built from a store without telemetry."""
    if not interval_s > 0:
        raise ValueError(f"interval_s must be positive, got {interval_s}")
    if batch < 1:
        raise ValueError(f"batch must be at least 1, got {batch}")
    t0 = time.perf_counter()
    stamp = time.time() if now is None else now
    horizon = telemetry_horizon(con, cluster)
    if horizon is None:
        return JobTelemetryReport(0, 0, 0, None, tuple((c, 0) for c in _COUNTS), 0.0)
    settle = 3.0 * interval_s if settle_s is None else settle_s
    targets, waiting = _pending(con, cluster, horizon - settle, rebuild)
    totals = dict.fromkeys(_COUNTS, 0)
    with_telemetry = 0
    for start in range(0, targets.height, batch):
        part = targets.slice(start, batch)
        rows = _attribute(con, part, interval_s=interval_s, now=stamp)
        con.begin()
        try:
            _store(con, rows)
            con.commit()
        except BaseException:
            con.rollback()
            raise
        for c in _COUNTS:
            totals[c] += int(rows[c].sum())
        with_telemetry += rows.filter((pl.col("link_used") + pl.col("activity_used")) > 0).height
    return JobTelemetryReport(
        built=targets.height,
        with_telemetry=with_telemetry,
        waiting=waiting,
        horizon=horizon,
        counts=tuple(totals.items()),
        seconds=time.perf_counter() - t0,
    )


def read_job_telemetry(
    con: duckdb.DuckDBPyConnection, *, cluster: str | None = None, until: float | None = None
) -> pl.DataFrame:
    """The ``job_telemetry`` rows of ``cluster`` (None: all) of runs ended before ``until``
    (None: all), oldest end first."""
    frame: pl.DataFrame = con.sql(
        "SELECT * FROM job_telemetry WHERE (CAST(? AS VARCHAR) IS NULL OR cluster = ?) "
        "AND (CAST(? AS DOUBLE) IS NULL OR end_time < ?) "
        "ORDER BY end_time, cluster, job_id, submit_time, run_index",
        params=[cluster, cluster, until, until],
    ).pl()
    return frame
