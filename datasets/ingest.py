"""Accounting ingest: typed JobRun records into the DuckDB store, idempotently.

A batch becomes one Polars frame, is validated column-wise (each bad record goes to
``rejected_rows`` with its job id, the field at fault and the reason, and the others are
stored: missing or ill-typed values, values out of range, negative times, absurd GPU counts,
and, given the cluster's ``ClusterLimits``, more GPUs or nodes than the cluster has),
deduplicated by key, and merged into ``jobs`` and
``job_nodes`` with DuckDB SQL inside ONE transaction: a failure anywhere leaves the store as
it was. A settled record replaces an unsettled one; an unsettled one never replaces a
settled one; re-ingesting identical records changes nothing. A run is keyed by cluster, job
id, submit time and run index: Slurm reuses ids (after its state is cleared, or across a
slurmdbd purge), and two jobs with one id and different submit times are both kept.

A rejected record is kept once per (source, job id, field, reason, raw): read again while
open, it counts (``seen``, ``last_seen``); a later ingest that stores a run of its job
resolves it (``resolved_at``; a job id Slurm reused resolves it too). ``open_rejects``
gives when each open reject was first seen, ``count_open_rejects`` how many are open.

Incremental collection: ``windows(since, until, step, overlap)`` cuts a time range into
overlapping windows, and ``get_watermark``/``set_watermark`` keep where the last collection
ended (``ingest_job_runs(..., watermark=...)`` sets it in the same transaction).
"""

from __future__ import annotations

import json
import math
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, fields
from itertools import accumulate, chain
from operator import attrgetter

import duckdb
import polars as pl
import pyarrow as pa  # type: ignore[import-untyped]

from linkwise.cluster.domain import MAX_JOB_GPUS
from linkwise.cluster.slurm.records import JobRun, NodeInfo, RejectedRecord
from linkwise.datasets.store import run_sql, scalar

_FIELDS: tuple[str, ...] = tuple(f.name for f in fields(JobRun))
_RENAME = {"user": "user_name", "partition": "partition_name"}
# a run: Slurm's id, its submit time (ids restart when Slurm's state is cleared, so two jobs
# may share an id) and its index among the requeued runs of that job
_KEY = ("cluster", "job_id", "submit_time", "run_index")
_SCHEMA: dict[str, pl.DataType] = {
    "cluster": pl.String(),
    "job_id": pl.Int64(),
    "run_index": pl.Int32(),
    "name": pl.String(),
    "user_name": pl.String(),
    "account": pl.String(),
    "partition_name": pl.String(),
    "state": pl.String(),
    "exit_code": pl.Int32(),
    "signal": pl.Int32(),
    "submit_time": pl.Float64(),
    "start_time": pl.Float64(),
    "end_time": pl.Float64(),
    "time_limit_s": pl.Float64(),
    "nodes": pl.List(pl.String()),
    "gpus": pl.Int32(),
    "gpus_per_node": pl.List(pl.Int32()),
    "allocation_nodes": pl.Int32(),
    "settled": pl.Boolean(),
    "array_job_id": pl.Int64(),
    "array_task_id": pl.Int32(),
    "comment": pl.String(),
}
_JOB_COLS = tuple(_SCHEMA)  # column order of the jobs table (then source, ingested_at)
_NULLABLE = frozenset(
    {"exit_code", "signal", "start_time", "end_time", "time_limit_s"}
    | {"array_job_id", "array_task_id"}
)
_NUMERIC = (pl.Int64(), pl.Int32(), pl.Float64())
_MAX_RAW = 64 * 1024  # characters of a rejected record kept


@dataclass(frozen=True, slots=True)
class ClusterLimits:
    """What the cluster has: a record asking for more GPUs or naming more nodes is refused.
    A zero means unknown (no check)."""

    nodes: int
    gpus: int


def limits_of(nodes: Sequence[NodeInfo]) -> ClusterLimits | None:
    """The limits of a cluster from its nodes (None when no node is known)."""
    if not nodes:
        return None
    return ClusterLimits(nodes=len({n.name for n in nodes}), gpus=sum(n.gpus_total for n in nodes))


@dataclass(frozen=True, slots=True)
class IngestReport:
    """What one ingest call did. ``kept_settled``: unsettled records ignored because the
    store already holds the settled run; ``duplicates``: records superseded inside the batch."""

    source: str
    received: int
    inserted: int
    updated: int
    unchanged: int
    kept_settled: int
    duplicates: int
    rejected: int
    rejected_reasons: tuple[tuple[str, int], ...]
    job_node_rows: int
    seconds: float
    new_rejects: int = 0  # rejects not stored open before (the others counted as seen again)
    resolved: int = 0  # open rejects of jobs this ingest stored a run of

    @property
    def jobs_per_s(self) -> float:
        """Records handled per second of wall time."""
        return self.received / self.seconds if self.seconds > 0 else math.inf


def runs_frame(runs: Sequence[JobRun]) -> pl.DataFrame:
    """The runs as one Polars frame (columns named as in the ``jobs`` table).

    Column-wise: one pass to transpose, the two list columns built from flat values and
    offsets through Arrow (per-row list construction in Polars is far slower).
    """
    if runs:
        columns = list(zip(*map(attrgetter(*_FIELDS), runs), strict=True))
    else:
        columns = [() for _ in _FIELDS]
    data: dict[str, pl.Series] = {}
    for f, col in zip(_FIELDS, columns, strict=True):
        name = _RENAME.get(f, f)
        dtype = _SCHEMA[name]
        if isinstance(dtype, pl.List):
            data[name] = _list_series(name, col, pl.String() if name == "nodes" else pl.Int32())
        else:
            data[name] = pl.Series(name, col, dtype=dtype, strict=False)
        if name in _NULLABLE:  # a value given but lost in the cast does not fit the column
            given = pl.Series(f"_given_{name}", [v is not None for v in col], dtype=pl.Boolean())
            data[given.name] = given
    return pl.DataFrame(data)


def _list_series(name: str, rows: Sequence[Sequence[object]], inner: pl.DataType) -> pl.Series:
    """A list column from a sequence of tuples, via flat values and offsets."""
    offsets = pa.array(list(accumulate(map(len, rows), initial=0)), type=pa.int64())
    flat = pl.Series(name, list(chain.from_iterable(rows)), dtype=inner, strict=False)
    arr = pa.LargeListArray.from_arrays(offsets, flat.to_arrow())
    series = pl.from_arrow(arr)
    assert isinstance(series, pl.Series)
    return series.alias(name).cast(pl.List(inner))


def _checks(limits: ClusterLimits | None) -> list[tuple[pl.Expr, str, str]]:
    """(condition, field, reason) of every way a record is unfit to store, in order."""
    checks: list[tuple[pl.Expr, str, str]] = []
    for name, dtype in _SCHEMA.items():
        col = pl.col(name)
        if name in _NULLABLE:
            checks.append((col.is_null() & pl.col(f"_given_{name}"), name, f"{name} out of range"))
        elif dtype in _NUMERIC:
            checks.append((col.is_null(), name, f"{name} out of range"))
        else:
            checks.append((col.is_null(), name, f"{name} missing or of the wrong type"))
    n_nodes = pl.col("nodes").list.len()
    checks += [
        (pl.col("nodes").list.eval(pl.element().is_null()).list.any(), "nodes", "nodes not text"),
        (pl.col("cluster").str.len_chars() == 0, "cluster", "empty cluster"),
        (pl.col("job_id") <= 0, "job_id", "job_id <= 0"),
        (pl.col("run_index") < 0, "run_index", "negative run_index"),
        (pl.col("submit_time").is_nan(), "submit_time", "submit_time is NaN"),
        (pl.col("submit_time") < 0, "submit_time", "negative submit_time"),
        (pl.col("start_time") < 0, "start_time", "negative start_time"),
        (pl.col("end_time") < 0, "end_time", "negative end_time"),
        (pl.col("end_time") < pl.col("start_time"), "end_time", "end_time before start_time"),
        (pl.col("gpus") < 0, "gpus", "negative gpus"),
        (pl.col("gpus") > MAX_JOB_GPUS, "gpus", "absurd GPU count"),
        (n_nodes != pl.col("gpus_per_node").list.len(), "gpus_per_node",
         "nodes and gpus_per_node differ in length"),
        (pl.col("gpus_per_node").list.min().fill_null(0) < 0, "gpus_per_node",
         "negative gpus_per_node"),
        (pl.col("allocation_nodes") < 0, "allocation_nodes", "negative allocation_nodes"),
    ]  # fmt: skip
    if limits is not None and limits.gpus > 0:
        checks.append((pl.col("gpus") > limits.gpus, "gpus", "more GPUs than the cluster has"))
    if limits is not None and limits.nodes > 0:
        checks.append((n_nodes > limits.nodes, "nodes", "more nodes than the cluster has"))
    return checks


def _verdicts(df: pl.DataFrame, limits: ClusterLimits | None) -> pl.DataFrame:
    """``_field`` and ``_reason`` of the first check each record fails (null when fit)."""
    checks = _checks(limits)
    first = pl.coalesce(
        [pl.when(cond.fill_null(False)).then(pl.lit(i)) for i, (cond, _, _) in enumerate(checks)]
    )
    fields = {i: f for i, (_, f, _) in enumerate(checks)}
    reasons = {i: r for i, (_, _, r) in enumerate(checks)}
    return df.with_columns(first.alias("_check")).with_columns(
        pl.col("_check").replace_strict(fields, default=None, return_dtype=pl.String())
        .alias("_field"),
        pl.col("_check").replace_strict(reasons, default=None, return_dtype=pl.String())
        .alias("_reason"),
    ).drop("_check", *[c for c in df.columns if c.startswith("_given_")])  # fmt: skip


def _dedupe(df: pl.DataFrame) -> tuple[pl.DataFrame, int]:
    """Keep one record per key: a settled one over an unsettled one, then the last given."""
    if df.is_empty():
        return df, 0
    kept = (
        df.with_row_index("_order")
        .sort([*_KEY, "settled", "_order"])
        .unique(subset=list(_KEY), keep="last", maintain_order=True)
        .sort("_order")
        .drop("_order")
    )
    return kept, df.height - kept.height


def _classify(con: duckdb.DuckDBPyConnection, stage: pl.DataFrame) -> pl.DataFrame:
    """Add ``_action`` (insert/update/unchanged/kept_settled) by comparing with ``jobs``."""
    same = " AND ".join(f"s.{c} IS NOT DISTINCT FROM j.{c}" for c in _JOB_COLS if c not in _KEY)
    query = f"""
        SELECT s.*, CASE
            WHEN j.job_id IS NULL THEN 'insert'
            WHEN j.settled AND NOT s.settled THEN 'kept_settled'
            WHEN {same} THEN 'unchanged'
            ELSE 'update' END AS _action
        FROM stage AS s LEFT JOIN jobs AS j
          ON j.cluster = s.cluster AND j.job_id = s.job_id
         AND j.submit_time = s.submit_time AND j.run_index = s.run_index
    """
    classified: pl.DataFrame = con.sql(query).pl()
    return classified


def _write_jobs(
    con: duckdb.DuckDBPyConnection, changed: pl.DataFrame, *, source: str, now: float
) -> None:
    """Replace the changed runs' ``jobs`` rows (delete + insert, inside the caller's txn)."""
    cols = ", ".join(_JOB_COLS)
    con.register("changed_jobs", changed)
    try:
        run_sql(
            con,
            "DELETE FROM jobs AS j USING changed_jobs AS c WHERE j.cluster = c.cluster "
            "AND j.job_id = c.job_id AND j.submit_time = c.submit_time "
            "AND j.run_index = c.run_index",
        )
        run_sql(
            con,
            f"INSERT INTO jobs ({cols}, source, ingested_at) SELECT {cols}, ?, ? FROM changed_jobs",
            [source, now],
        )
    finally:
        con.unregister("changed_jobs")


def _replace_job_nodes(con: duckdb.DuckDBPyConnection, changed: pl.DataFrame) -> int:
    """Replace the ``job_nodes`` rows of the changed runs; return the rows written."""
    per_node = (
        changed.select(*_KEY, "nodes", "gpus_per_node")
        .explode(["nodes", "gpus_per_node"])
        .drop_nulls("nodes")
        .group_by([*_KEY, "nodes"], maintain_order=True)
        .agg(pl.col("gpus_per_node").sum().alias("gpus"))
        .rename({"nodes": "node"})
    )
    keys = changed.select(_KEY)
    con.register("changed_keys", keys)
    con.register("changed_nodes", per_node)
    try:
        run_sql(
            con,
            "DELETE FROM job_nodes AS n USING changed_keys AS c WHERE n.cluster = c.cluster "
            "AND n.job_id = c.job_id AND n.submit_time = c.submit_time "
            "AND n.run_index = c.run_index",
        )
        run_sql(
            con,
            "INSERT INTO job_nodes (cluster, job_id, submit_time, run_index, node, gpus) "
            "SELECT cluster, job_id, submit_time, run_index, node, gpus FROM changed_nodes",
        )
    finally:
        con.unregister("changed_keys")
        con.unregister("changed_nodes")
    return per_node.height


# an open reject of the source with the same job id, field, reason and raw text as ``b``'s
_SAME_REJECT = (
    "r.source = ? AND r.resolved_at IS NULL AND r.job_id IS NOT DISTINCT FROM b.job_id "
    "AND r.field IS NOT DISTINCT FROM b.field AND r.reason = b.reason AND r.raw = b.raw"
)


def reject_key(r: RejectedRecord) -> tuple[str | None, str, str, str]:
    """What makes a reject the same one: job id, field, reason and the record's text."""
    return (r.job_id, r.field, r.reason, r.raw)


def _rejects_frame(rows: Sequence[RejectedRecord]) -> pl.DataFrame:
    """One row per distinct reject with ``n``, how often the batch holds it."""
    counts = Counter(reject_key(r) for r in rows)
    return pl.DataFrame(
        [(*k, n) for k, n in counts.items()],
        schema={
            "job_id": pl.String(),
            "field": pl.String(),
            "reason": pl.String(),
            "raw": pl.String(),
            "n": pl.Int32(),
        },
        orient="row",
    )


def open_rejects(
    con: duckdb.DuckDBPyConnection, source: str, rows: Sequence[RejectedRecord]
) -> dict[tuple[str | None, str, str, str], float]:
    """When each of ``rows`` that is stored open was first rejected (by ``reject_key``)."""
    if not rows:
        return {}
    con.register("reject_batch", _rejects_frame(rows))
    try:
        found = con.execute(
            "SELECT b.job_id, b.field, b.reason, b.raw, min(r.rejected_at) "
            f"FROM reject_batch AS b JOIN rejected_rows AS r ON {_SAME_REJECT} "
            "GROUP BY ALL",
            [source],
        ).fetchall()
    finally:
        con.unregister("reject_batch")
    return {(j, str(f), str(r), str(raw)): float(t) for j, f, r, raw, t in found}


def count_open_rejects(con: duckdb.DuckDBPyConnection, source: str) -> int:
    """How many rejects of ``source`` are open (no later read stored their job)."""
    value = scalar(
        con,
        "SELECT count(*) FROM rejected_rows WHERE source = ? AND resolved_at IS NULL",
        [source],
    )
    return int(str(value))


def _reject(
    con: duckdb.DuckDBPyConnection,
    rows: Sequence[RejectedRecord],
    *,
    source: str,
    now: float,
) -> int:
    """Keep rejected records (job id, field, reason, the record as JSON) in
    ``rejected_rows``, each once: one stored open already is counted as seen again. Returns
    how many were new."""
    con.register("reject_batch", _rejects_frame(rows))
    try:
        new = scalar(
            con,
            "SELECT count(*) FROM reject_batch AS b WHERE NOT EXISTS "
            f"(SELECT 1 FROM rejected_rows AS r WHERE {_SAME_REJECT})",
            [source],
        )
        run_sql(
            con,
            "UPDATE rejected_rows AS r SET seen = coalesce(r.seen, 1) + b.n, last_seen = ? "
            f"FROM reject_batch AS b WHERE {_SAME_REJECT}",
            [now, source],
        )
        run_sql(
            con,
            "INSERT INTO rejected_rows "
            "(source, raw, reason, rejected_at, job_id, field, seen, last_seen) "
            "SELECT ?, b.raw, b.reason, ?, b.job_id, b.field, b.n, ? FROM reject_batch AS b "
            f"WHERE NOT EXISTS (SELECT 1 FROM rejected_rows AS r WHERE {_SAME_REJECT})",
            [source, now, now, source],
        )
    finally:
        con.unregister("reject_batch")
    return int(str(new))


def _resolve(con: duckdb.DuckDBPyConnection, good: pl.DataFrame, *, source: str, now: float) -> int:
    """Resolve the source's open rejects of jobs ``good`` holds a run of, unless rejected
    again by this very ingest (another run of the job); returns how many."""
    ids = good.select(pl.col("job_id").cast(pl.String()).unique())
    if ids.is_empty():
        return 0
    con.register("stored_ids", ids)
    try:
        rows = con.execute(
            "UPDATE rejected_rows SET resolved_at = ? WHERE source = ? AND resolved_at IS NULL "
            "AND coalesce(last_seen, rejected_at) < ? "
            "AND job_id IN (SELECT job_id FROM stored_ids)",
            [now, source, now],
        ).fetchall()
    finally:
        con.unregister("stored_ids")
    return int(rows[0][0]) if rows else 0


def _rejected_runs(runs: Sequence[JobRun], bad: pl.DataFrame) -> list[RejectedRecord]:
    """The runs that failed a check, as rejected records."""
    out: list[RejectedRecord] = []
    for i, field, reason in bad.select("_row", "_field", "_reason").iter_rows():
        run = runs[i]
        raw = json.dumps(asdict(run), default=repr, ensure_ascii=False)[:_MAX_RAW]
        out.append(RejectedRecord(str(run.job_id), str(field), str(reason), raw))
    return out


def ingest_job_runs(
    con: duckdb.DuckDBPyConnection,
    runs: Sequence[JobRun],
    *,
    source: str,
    watermark: float | None = None,
    rejected: Sequence[RejectedRecord] = (),
    limits: ClusterLimits | None = None,
) -> IngestReport:
    """Upsert ``runs`` into ``jobs``/``job_nodes`` in one transaction; report what happened.

    Records unfit to store (see ``_checks``; ``limits`` adds the cluster's size) go to
    ``rejected_rows`` with the records already ``rejected`` while parsing, each kept once
    (``new_rejects``: not open before), the others are stored; open rejects of the jobs
    stored are resolved (``resolved``). With ``watermark``, the source's watermark is set in
    the same transaction. The connection must not be inside a transaction already.
    """
    t0 = time.perf_counter()
    now = time.time()
    df = _verdicts(runs_frame(runs).with_row_index("_row"), limits)
    bad = df.filter(pl.col("_reason").is_not_null()).select("_row", "_field", "_reason")
    refused = [*rejected, *_rejected_runs(runs, bad)]
    good, duplicates = _dedupe(
        df.filter(pl.col("_reason").is_null()).drop("_row", "_field", "_reason")
    )
    con.begin()
    try:
        con.register("stage", good)
        try:
            classified = _classify(con, good)
        finally:
            con.unregister("stage")
        actions = classified["_action"]
        changed = classified.filter(actions.is_in(["insert", "update"])).drop("_action")
        node_rows = 0
        if changed.height:
            _write_jobs(con, changed, source=source, now=now)
            node_rows = _replace_job_nodes(con, changed)
        new_rejects = _reject(con, refused, source=source, now=now) if refused else 0
        resolved = _resolve(con, good, source=source, now=now)
        if watermark is not None:
            set_watermark(con, source, watermark)
        con.commit()
    except BaseException:
        con.rollback()
        raise
    counts = actions.value_counts().rows()
    by_action = {str(a): int(n) for a, n in counts}
    reasons = sorted(Counter(r.reason for r in refused).items())
    return IngestReport(
        source=source,
        received=len(runs) + len(rejected),
        inserted=by_action.get("insert", 0),
        updated=by_action.get("update", 0),
        unchanged=by_action.get("unchanged", 0),
        kept_settled=by_action.get("kept_settled", 0),
        duplicates=duplicates,
        rejected=len(refused),
        rejected_reasons=tuple(reasons),
        job_node_rows=node_rows,
        seconds=time.perf_counter() - t0,
        new_rejects=new_rejects,
        resolved=resolved,
    )


def ingest_nodes(con: duckdb.DuckDBPyConnection, cluster: str, nodes: Sequence[NodeInfo]) -> int:
    """Upsert the cluster's nodes (as sinfo/slurmrestd describe them); return the count."""
    frame = pl.DataFrame(
        {
            "cluster": [cluster] * len(nodes),
            "node": [n.name for n in nodes],
            "state": [n.state for n in nodes],
            "partitions": [list(n.partitions) for n in nodes],
            "cpus": [n.cpus for n in nodes],
            "gpus_total": [n.gpus_total for n in nodes],
            "gpus_used": [n.gpus_used for n in nodes],
            "updated_at": [time.time()] * len(nodes),
        },
        schema={
            "cluster": pl.String(),
            "node": pl.String(),
            "state": pl.String(),
            "partitions": pl.List(pl.String()),
            "cpus": pl.Int32(),
            "gpus_total": pl.Int32(),
            "gpus_used": pl.Int32(),
            "updated_at": pl.Float64(),
        },
    ).unique(subset=["cluster", "node"], keep="last", maintain_order=True)
    con.register("node_batch", frame)
    try:
        run_sql(
            con,
            "INSERT INTO nodes SELECT * FROM node_batch ON CONFLICT (cluster, node) DO UPDATE "
            "SET state = excluded.state, partitions = excluded.partitions, cpus = excluded.cpus, "
            "gpus_total = excluded.gpus_total, gpus_used = excluded.gpus_used, "
            "updated_at = excluded.updated_at",
        )
    finally:
        con.unregister("node_batch")
    return frame.height


def get_watermark(con: duckdb.DuckDBPyConnection, source: str) -> float | None:
    """The source's watermark (epoch seconds), or None before its first collection."""
    value = scalar(con, "SELECT watermark FROM ingest_state WHERE source = ?", [source])
    return None if value is None else float(str(value))


def set_watermark(con: duckdb.DuckDBPyConnection, source: str, watermark: float) -> None:
    """Set the source's watermark (it may move back: collection windows overlap)."""
    run_sql(
        con,
        "INSERT INTO ingest_state (source, watermark, updated_at) VALUES (?, ?, ?) "
        "ON CONFLICT (source) DO UPDATE SET watermark = excluded.watermark, "
        "updated_at = excluded.updated_at",
        [source, watermark, time.time()],
    )


def windows(
    since: float, until: float, step: float, overlap: float
) -> tuple[tuple[float, float], ...]:
    """Cut [since, until) into windows of ``step`` seconds, each starting ``overlap`` seconds
    before the previous one ended, so records that settle late are collected again."""
    if step <= 0 or overlap < 0 or overlap >= step:
        raise ValueError(f"need step > 0 and 0 <= overlap < step (step={step}, overlap={overlap})")
    out: list[tuple[float, float]] = []
    start = since
    while start < until:
        end = min(start + step, until)
        out.append((start, end))
        if end >= until:
            break
        start = end - overlap
    return tuple(out)


def next_window_start(watermark: float | None, overlap: float, default: float) -> float:
    """Where the next collection starts: ``overlap`` before the watermark, or ``default``."""
    return default if watermark is None else watermark - overlap
