"""Telemetry into DuckDB: samples, malformed lines and ``link_load`` rows, each ingest in one
transaction; ``derive_ib_link_load`` turns stored InfiniBand counters into rates."""

from __future__ import annotations

import time
from dataclasses import dataclass

import duckdb
import polars as pl

from linkwise.datasets.store import run_sql, scalar
from linkwise.datasets.telemetry.counters import (
    IB_COUNTERS,
    IB_RATE_METRICS,
    RateReport,
    counter_rates,
    counter_spec_frame,
)
from linkwise.datasets.telemetry.dcgm import dcgm_link_load
from linkwise.datasets.telemetry.prometheus import parse_prometheus


@dataclass(frozen=True, slots=True)
class TelemetryReport:
    """What one telemetry ingest stored and dropped."""

    source: str
    samples: int
    malformed: int
    sentinels: tuple[tuple[str, int], ...]
    unsupported: int
    link_load_rows: int
    negative_rates_dropped: int
    seconds: float

    @property
    def samples_per_s(self) -> float:
        """Samples stored per second of wall time."""
        return self.samples / self.seconds if self.seconds > 0 else float("inf")


def store_samples(con: duckdb.DuckDBPyConnection, samples: pl.DataFrame, *, source: str) -> int:
    """Append a sample frame (``SAMPLE_SCHEMA``) to ``telemetry_samples``; return the rows."""
    con.register("sample_batch", samples)
    try:
        run_sql(
            con,
            "INSERT INTO telemetry_samples (ts, host, source, metric, labels, value, job) "
            "SELECT ts, host, ?, metric, labels, value, job FROM sample_batch",
            [source],
        )
    finally:
        con.unregister("sample_batch")
    return samples.height


def _store_link_load(
    con: duckdb.DuckDBPyConnection, rows: pl.DataFrame, *, cluster: str, source: str
) -> int:
    """Insert link_load rows, keeping existing ones for the same key (idempotent). The last
    guard: a rate or interval that is not a finite non-negative number is never stored."""
    valid = (
        pl.col("bytes_per_s").is_finite()
        & (pl.col("bytes_per_s") >= 0)
        & pl.col("interval_s").is_finite()
        & pl.col("ts").is_finite()
    )
    rows = rows.filter(valid.fill_null(False))
    if rows.is_empty():
        return 0
    before = _count(con, "link_load")
    lo, hi = rows.select(pl.col("ts").min().alias("lo"), pl.col("ts").max().alias("hi")).row(0)
    con.register("load_batch", rows)
    try:
        run_sql(
            con,
            # the anti-join drops the rows already stored (their ts range only) cheaply;
            # ON CONFLICT still guards the key against duplicates within the batch
            "INSERT INTO link_load (ts, interval_s, cluster, node, device, link_class, "
            "direction, bytes_per_s, source) SELECT b.ts, b.interval_s, ?, b.node, "
            "b.device, b.link_class, b.direction, b.bytes_per_s, ? FROM load_batch b "
            "ANTI JOIN (SELECT node, device, link_class, direction, ts FROM link_load "
            "WHERE cluster = ? AND ts BETWEEN ? AND ?) l "
            "USING (node, device, link_class, direction, ts) ON CONFLICT DO NOTHING",
            [cluster, source, cluster, lo, hi],
        )
    finally:
        con.unregister("load_batch")
    return _count(con, "link_load") - before


def _count(con: duckdb.DuckDBPyConnection, table: str) -> int:
    return int(str(scalar(con, f"SELECT count(*) FROM {table}")))


def ingest_prometheus(
    con: duckdb.DuckDBPyConnection,
    text: str,
    *,
    source: str,
    ts: float | None = None,
    host: str | None = None,
    cluster: str = "",
    interval_s: float = 30.0,
) -> TelemetryReport:
    """Parse an exposition and store it in one transaction: samples, malformed lines (to
    ``rejected_rows``) and the DCGM rate gauges as ``link_load``."""
    t0 = time.perf_counter()
    parsed = parse_prometheus(text, ts=ts, host=host)
    load, negative = dcgm_link_load(parsed.samples, interval_s=interval_s)
    con.begin()
    try:
        stored = store_samples(con, parsed.samples, source=source)
        load_rows = _store_link_load(con, load, cluster=cluster, source=source)
        _store_malformed(con, parsed.malformed, source=source)
        con.commit()
    except BaseException:
        con.rollback()
        raise
    return TelemetryReport(
        source=source,
        samples=stored,
        malformed=parsed.malformed.height,
        sentinels=parsed.sentinels,
        unsupported=0,
        link_load_rows=load_rows,
        negative_rates_dropped=negative,
        seconds=time.perf_counter() - t0,
    )


def ingest_samples(
    con: duckdb.DuckDBPyConnection, samples: pl.DataFrame, *, source: str, unsupported: int = 0
) -> TelemetryReport:
    """Store samples read by ``read_sysfs``/``parse_perfquery`` (one transaction)."""
    t0 = time.perf_counter()
    con.begin()
    try:
        stored = store_samples(con, samples, source=source)
        con.commit()
    except BaseException:
        con.rollback()
        raise
    return TelemetryReport(
        source=source,
        samples=stored,
        malformed=0,
        sentinels=(),
        unsupported=unsupported,
        link_load_rows=0,
        negative_rates_dropped=0,
        seconds=time.perf_counter() - t0,
    )


def _store_malformed(
    con: duckdb.DuckDBPyConnection, malformed: pl.DataFrame, *, source: str
) -> None:
    if malformed.is_empty():
        return
    con.register("bad_lines", malformed)
    try:
        run_sql(
            con,
            "INSERT INTO rejected_rows (source, raw, reason, rejected_at) "
            "SELECT ?, raw, reason, ? FROM bad_lines",
            [source, time.time()],
        )
    finally:
        con.unregister("bad_lines")


def derive_ib_link_load(
    con: duckdb.DuckDBPyConnection,
    *,
    since: float,
    until: float,
    expected_interval_s: float,
    gap_factor: float = 3.0,
    cluster: str = "",
    source: str = "derived:ib",
) -> tuple[int, RateReport]:
    """Derive InfiniBand ``link_load`` rows for intervals starting in [since, until) from the
    raw counters in ``telemetry_samples`` (any of the three sources; one per port, the
    preferred counter wins). Returns the rows added and the counter report."""
    lookback = since - gap_factor * expected_interval_s
    raw = con.sql(
        """
        SELECT ts, coalesce(host, '') AS node, metric, value,
               coalesce(labels->>'device', 'lid' || (labels->>'lid')) AS dev,
               labels->>'port' AS port,
               CASE WHEN labels->>'link_layer' = 'Ethernet' THEN 'eth' ELSE 'ib' END AS link_class
        FROM telemetry_samples
        WHERE ts >= $lookback AND ts < $until AND (metric IN $counters OR metric IN $rates)
          AND json_valid(labels)
        """,
        params={
            "lookback": lookback,
            "until": until,
            "counters": list(IB_COUNTERS),
            "rates": list(IB_RATE_METRICS),
        },
    ).pl()
    raw = raw.with_columns(
        pl.concat_str(pl.col("dev"), pl.lit("/"), pl.col("port").fill_null("?")).alias("device")
    )
    line = (
        raw.filter(pl.col("metric").is_in(list(IB_RATE_METRICS)))
        .group_by("node", "device")
        .agg(pl.col("value").sort_by("ts").last().alias("max_bytes_per_s"))
    )
    counters = raw.join(counter_spec_frame(), on="metric", how="inner")
    best = counters.group_by("node", "device", "direction").agg(
        pl.col("priority").min().alias("best")
    )
    counters = (
        counters.join(best, on=["node", "device", "direction"])
        .filter(pl.col("priority") == pl.col("best"))
        .join(line, on=["node", "device"], how="left")
        .unique(subset=["node", "device", "direction", "ts"], keep="first")
    )
    rates, report = counter_rates(
        counters, expected_interval_s=expected_interval_s, gap_factor=gap_factor
    )
    rates = rates.filter((pl.col("ts") >= since) & (pl.col("ts") < until))
    con.begin()
    try:
        added = _store_link_load(con, rates, cluster=cluster, source=source)
        con.commit()
    except BaseException:
        con.rollback()
        raise
    return added, report
