"""Collection: Slurm accounting and interconnect telemetry into the DuckDB store.

Plain functions do the work; the Prefect flows are thin wrappers that add retries on the
reads only.

- ``collect_accounting(client, store_path, cluster=...)``: incremental by time window.
  The first window starts ``overlap_s`` before the stored watermark (or at ``since``),
  every window starts ``overlap_s`` before the previous one ended, and each window's
  records are upserted together with the new watermark in ONE transaction. Re-running
  never duplicates a row (runs are keyed by cluster, job id and run index), records that
  settle late are read again by the overlap and replace their unsettled version, and a
  failure while reading or writing a window leaves the store as it was before that window
  (earlier windows stay committed; the error names the window). The watermark only moves
  forward, and it is held back to the earliest unsettled record of a window, so such a
  record is read again next time. No silent loss (``hold_of``): a window whose records the
  parser rejected holds the watermark at its start, so the next run reads it again and
  stores them once the parser accepts them, without ``--since``. A reject holds only while
  it has been open for less than ``reject_hold_s`` (one corrupt record among good ones
  blocks collection for a day at most; it stays open in ``rejected_rows`` and a warning
  names the window to collect again with ``--since`` after a fix), except in a schema
  fault: a run that stored no record but rejected some holds whatever its rejects' age,
  until a run accepts records again. Each reject is kept once (``ingest.open_rejects``);
  the value checks' rejects (e.g. more GPUs than the cluster has) are kept too but never
  hold.
- ``collect_telemetry(store_path, endpoints=[...], sysfs_roots=[...])``: scrape exporter
  endpoints (HTTP GET with a timeout) and read ``/sys/class/infiniband`` trees, store each
  source in its own transaction, then derive InfiniBand ``link_load`` rates from the raw
  counters. A source that fails is reported and the others are still stored.

Retries in the flows: the Slurm reads (``sacct``/``sinfo`` or slurmrestd), the HTTP scrapes
and the sysfs reads are pure reads, so they are Prefect tasks with retries. The DuckDB
writes are not retried inside a run: each is one idempotent transaction, so a retry would be
safe, but what makes a write fail (disk full, a schema newer than this code) does not go
away in seconds; the failed window is rolled back and the next scheduled run starts again
from the watermark. Only opening a store that another process holds is retried, for
``lock_wait_s`` seconds (DuckDB lets one process write a file), then refused with
``StoreLockedError``.
"""

from __future__ import annotations

import logging
import socket
import time
import urllib.parse
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

import duckdb
import polars as pl
from prefect import flow, get_run_logger, task
from prefect.cache_policies import NO_CACHE

from linkwise.cluster.slurm.client import SlurmClient, read_env_file
from linkwise.cluster.slurm.errors import SlurmError
from linkwise.cluster.slurm.records import AccountingBatch, JobRun, NodeInfo
from linkwise.datasets.ingest import (
    count_open_rejects,
    get_watermark,
    ingest_job_runs,
    ingest_nodes,
    limits_of,
    next_window_start,
    open_rejects,
    reject_key,
    set_watermark,
    windows,
)
from linkwise.datasets.store import open_store
from linkwise.datasets.telemetry.counters import RateReport
from linkwise.datasets.telemetry.scrape import Scrape, ScrapeError, scrape_http
from linkwise.datasets.telemetry.store import derive_ib_link_load, ingest_prometheus, ingest_samples
from linkwise.datasets.telemetry.sysfs import SysfsReading, read_sysfs

__all__ = [
    "DEFAULT_LOCK_WAIT_S",
    "DEFAULT_LOOKBACK_S",
    "DEFAULT_OVERLAP_S",
    "DEFAULT_REJECT_HOLD_S",
    "DEFAULT_WINDOW_S",
    "AccountingReport",
    "AccountingSource",
    "CollectError",
    "Hold",
    "SourceReport",
    "TelemetryCollectReport",
    "WindowRejects",
    "WindowReport",
    "accounting_source_name",
    "collect_accounting",
    "collect_accounting_flow",
    "collect_telemetry",
    "collect_telemetry_flow",
    "hold_of",
    "let_go",
    "parsed_window",
]

DEFAULT_WINDOW_S = 6 * 3600.0
DEFAULT_OVERLAP_S = 600.0
DEFAULT_LOOKBACK_S = 86400.0
"""The first collection of a cluster (no watermark, no ``since``) reads this far back."""
DEFAULT_LOCK_WAIT_S = 10.0
DEFAULT_REJECT_HOLD_S = 86400.0
"""How long a parse reject holds the watermark (a schema fault holds whatever its age)."""
"""How long a collection waits for a store another process holds before it gives up."""

_module_log = logging.getLogger(__name__)


class Log(Protocol):
    """The part of a logger the collectors use (a ``logging.Logger`` or Prefect's)."""

    def info(self, msg: str, /, *args: Any) -> None: ...
    def warning(self, msg: str, /, *args: Any) -> None: ...


class AccountingSource(Protocol):
    """What accounting collection reads (``SlurmClient`` is one)."""

    def accounting(self, since: float, until: float | None = None) -> AccountingBatch: ...
    def nodes(self) -> list[NodeInfo]: ...


class CollectError(RuntimeError):
    """A collection stopped part-way; ``report`` holds what was committed before it."""

    def __init__(self, message: str, report: AccountingReport | TelemetryCollectReport) -> None:
        super().__init__(message)
        self.report = report


# ---------------------------------------------------------------- accounting


@dataclass(frozen=True, slots=True)
class WindowReport:
    """One committed window: its bounds, what its records did, and the watermark set."""

    start: float
    end: float
    received: int
    inserted: int
    updated: int
    unchanged: int
    kept_settled: int
    duplicates: int
    unsettled: int
    rejected: int
    rejected_reasons: tuple[tuple[str, int], ...]
    job_node_rows: int
    watermark: float
    seconds: float
    new_rejects: int = 0
    resolved: int = 0


@dataclass(frozen=True, slots=True)
class WindowRejects:
    """What the parser made of one window: records accepted and rejected, and how long the
    youngest of its rejects has been open (inf when none)."""

    start: float
    end: float
    accepted: int
    rejected: int
    youngest_open_s: float


@dataclass(frozen=True, slots=True)
class Hold:
    """Where rejected records hold the watermark, and why."""

    at: float
    reason: str


def _holds(w: WindowRejects, reject_hold_s: float) -> bool:
    """A window with a parse reject open for less than ``reject_hold_s`` holds."""
    return w.rejected > 0 and w.youngest_open_s < reject_hold_s


def _schema_fault(ws: Sequence[WindowRejects]) -> bool:
    """No record accepted in the whole run, and some rejected."""
    return sum(w.accepted for w in ws) == 0 and sum(w.rejected for w in ws) > 0


def hold_of(
    ws: Sequence[WindowRejects], previous: float | None, reject_hold_s: float
) -> Hold | None:
    """Where the run's parse rejects hold the watermark (never before ``previous``): at the
    start of the first window with a reject open for less than ``reject_hold_s``, or, in a
    schema fault, of the first window with a reject whatever its age. None: no hold."""
    fault = _schema_fault(ws)
    first = next((w for w in ws if (w.rejected > 0 if fault else _holds(w, reject_hold_s))), None)
    if first is None:
        return None
    at = first.start if previous is None else max(previous, first.start)
    span = f"window [{_iso(first.start)}, {_iso(first.end)})"
    if fault:
        reason = (
            f"schema fault: all {first.rejected} record(s) of {span} rejected and none "
            "accepted in this run; held until a run accepts records"
        )
    else:
        reason = (
            f"{first.rejected} record(s) of {span} rejected by the parser, open for less "
            f"than {reject_hold_s:g} s"
        )
    return Hold(at, reason)


def let_go(ws: Sequence[WindowRejects], reject_hold_s: float) -> tuple[WindowRejects, ...]:
    """Windows whose parse rejects no longer hold: open for ``reject_hold_s`` or longer, and
    no schema fault."""
    if _schema_fault(ws):
        return ()
    return tuple(w for w in ws if w.rejected > 0 and not _holds(w, reject_hold_s))


@dataclass(frozen=True, slots=True)
class AccountingReport:
    """What ``collect_accounting`` did: nodes stored, each committed window, totals."""

    cluster: str
    source: str
    since: float
    until: float
    nodes: int
    windows: tuple[WindowReport, ...]
    watermark: float | None
    seconds: float
    previous_watermark: float | None = None
    held_at: float | None = None  # where parse rejects hold the watermark (None: no hold)
    held_reason: str = ""
    open_rejects: int = 0  # rejects of this source no read has stored the job of

    @property
    def watermark_held(self) -> bool:
        """Whether parse rejects held the watermark."""
        return self.held_at is not None

    def total(self, name: str) -> int:
        """Sum of an integer ``WindowReport`` field over the windows."""
        return sum(int(getattr(w, name)) for w in self.windows)

    @property
    def rejected_reasons(self) -> tuple[tuple[str, int], ...]:
        """Rejected records by reason, over all windows."""
        out: dict[str, int] = {}
        for w in self.windows:
            for reason, n in w.rejected_reasons:
                out[reason] = out.get(reason, 0) + n
        return tuple(sorted(out.items()))

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready summary (totals, reasons and every window)."""
        keys: tuple[str, ...] = ("received", "inserted", "updated", "unchanged")
        keys += ("kept_settled", "duplicates", "unsettled", "rejected", "job_node_rows")
        keys += ("new_rejects", "resolved")
        return {
            "cluster": self.cluster,
            "source": self.source,
            "since": self.since,
            "until": self.until,
            "nodes": self.nodes,
            **{k: self.total(k) for k in keys},
            "rejected_reasons": dict(self.rejected_reasons),
            "open_rejects": self.open_rejects,
            "watermark": self.watermark,
            "previous_watermark": self.previous_watermark,
            "watermark_held": self.watermark_held,
            "held_at": self.held_at,
            "held_reason": self.held_reason,
            "seconds": round(self.seconds, 3),
            "windows": [
                {
                    "start": w.start,
                    "end": w.end,
                    **{k: getattr(w, k) for k in keys},
                    "watermark": w.watermark,
                }
                for w in self.windows
            ],
        }


def accounting_source_name(cluster: str) -> str:
    """The ``source`` (jobs rows, watermark) of a cluster's accounting collection."""
    return f"slurm-accounting:{cluster}"


def _unsettled_since(runs: Sequence[JobRun]) -> float:
    """The last event of the earliest unsettled run (inf when all are settled)."""
    return min(
        (r.end_time or r.start_time or r.submit_time for r in runs if not r.settled),
        default=float("inf"),
    )


def _keep_known_exit_codes(con: duckdb.DuckDBPyConnection, runs: list[JobRun]) -> list[JobRun]:
    """Fill a missing exit code from the store (an exit code once known is not forgotten).

    slurmrestd 22.05 knows the exit code of a FAILED run only while the controller holds the
    job (MinJobAge); a later read through it would otherwise replace 3 with NULL.
    """
    missing = [
        (r.cluster, r.job_id, float(r.submit_time), r.run_index)
        for r in runs
        if r.exit_code is None
    ]
    if not missing:
        return runs
    frame = pl.DataFrame(
        missing,
        schema={
            "cluster": pl.String(),
            "job_id": pl.Int64(),
            "submit_time": pl.Float64(),
            "run_index": pl.Int32(),
        },
        orient="row",
    )
    con.register("missing_codes", frame)
    try:
        known = con.execute(
            "SELECT j.cluster, j.job_id, j.submit_time, j.run_index, j.exit_code, j.signal "
            "FROM jobs AS j JOIN missing_codes AS m "
            "USING (cluster, job_id, submit_time, run_index) "
            "WHERE j.exit_code IS NOT NULL"
        ).fetchall()
    finally:
        con.unregister("missing_codes")
    if not known:
        return runs
    codes = {(c, int(j), float(t), int(i)): (int(e), s) for c, j, t, i, e, s in known}
    out = []
    for r in runs:
        key = (r.cluster, r.job_id, float(r.submit_time), r.run_index)
        code = codes.get(key) if r.exit_code is None else None
        out.append(r if code is None else replace(r, exit_code=code[0], signal=r.signal or code[1]))
    return out


def collect_accounting(
    client: AccountingSource,
    store_path: str | Path,
    *,
    cluster: str,
    since: float | None = None,
    until: float | None = None,
    window_s: float = DEFAULT_WINDOW_S,
    overlap_s: float = DEFAULT_OVERLAP_S,
    source: str | None = None,
    lookback_s: float = DEFAULT_LOOKBACK_S,
    lock_wait_s: float = DEFAULT_LOCK_WAIT_S,
    reject_hold_s: float = DEFAULT_REJECT_HOLD_S,
    logger: Log | None = None,
) -> AccountingReport:
    """Collect the cluster's nodes and accounting records in ``[since, until)`` into the store.

    ``since`` defaults to ``overlap_s`` before the stored watermark (or ``lookback_s`` ago on
    the first collection), ``until`` to now. Each window is read, then written with its
    watermark in one transaction; parse rejects hold the watermark (``hold_of``; for
    ``reject_hold_s`` unless the whole run was rejected). Raises ``CollectError`` (its
    ``report`` lists the windows already committed) when Slurm fails part-way;
    ``ValueError`` on bad arguments; ``StoreLockedError`` when another process holds the
    store for longer than ``lock_wait_s``.
    """
    log = logger or _module_log
    t0 = time.perf_counter()
    now = time.time()
    src = source or accounting_source_name(cluster)
    end = now if until is None else float(until)
    con = open_store(store_path, lock_wait_s=lock_wait_s)
    done: list[WindowReport] = []
    try:
        previous = get_watermark(con, src)
        start = (
            float(since)
            if since is not None
            else next_window_start(previous, overlap_s, now - lookback_s)
        )
        if start >= end:
            raise ValueError(f"since ({start:.0f}) is not before until ({end:.0f})")
        plan = windows(start, end, window_s, overlap_s)

        def report(watermark: float | None, hold: Hold | None = None) -> AccountingReport:
            return AccountingReport(
                cluster=cluster,
                source=src,
                since=start,
                until=end,
                nodes=n_nodes,
                windows=tuple(done),
                watermark=watermark,
                seconds=time.perf_counter() - t0,
                previous_watermark=previous,
                held_at=None if hold is None else hold.at,
                held_reason="" if hold is None else hold.reason,
                open_rejects=count_open_rejects(con, src),
            )

        n_nodes = 0
        try:
            nodes = client.nodes()
        except SlurmError as exc:
            raise CollectError(f"reading nodes: {exc}", report(previous)) from exc
        n_nodes = ingest_nodes(con, cluster, nodes)
        limits = limits_of(nodes)
        log.info("stored %d nodes of cluster %s", n_nodes, cluster)
        watermark = previous
        hold = float("inf")  # unsettled records and held rejects keep the watermark behind
        parsed: list[WindowRejects] = []
        for i, (w_start, w_end) in enumerate(plan, 1):
            tw = time.perf_counter()
            try:
                batch = client.accounting(w_start, w_end)
            except SlurmError as exc:
                raise CollectError(
                    f"window {i}/{len(plan)} [{_iso(w_start)}, {_iso(w_end)}): {exc}; "
                    f"{len(done)} earlier window(s) stored, this one left unchanged",
                    report(watermark),
                ) from exc
            runs = _keep_known_exit_codes(con, list(batch.runs))
            first_seen = open_rejects(con, src, batch.rejected)
            seen = parsed_window(w_start, w_end, batch, first_seen, time.time())
            rejects_at = w_start if _holds(seen, reject_hold_s) else float("inf")
            hold = min(hold, _unsettled_since(runs), rejects_at)
            candidate = min(w_end, hold)
            watermark = candidate if watermark is None else max(watermark, candidate)
            ing = ingest_job_runs(
                con,
                runs,
                source=src,
                watermark=watermark,
                rejected=batch.rejected,
                limits=limits,
            )
            window = WindowReport(
                start=w_start,
                end=w_end,
                received=ing.received,
                inserted=ing.inserted,
                updated=ing.updated,
                unchanged=ing.unchanged,
                kept_settled=ing.kept_settled,
                duplicates=ing.duplicates,
                unsettled=sum(1 for r in runs if not r.settled),
                rejected=ing.rejected,
                rejected_reasons=ing.rejected_reasons,
                job_node_rows=ing.job_node_rows,
                watermark=watermark,
                seconds=time.perf_counter() - tw,
                new_rejects=ing.new_rejects,
                resolved=ing.resolved,
            )
            done.append(window)
            parsed.append(replace(seen, accepted=ing.received - ing.rejected))
            log.info(
                "window %d/%d [%s, %s): %d records, %d new, %d updated, %d unchanged, %d rejected",
                i,
                len(plan),
                _iso(w_start),
                _iso(w_end),
                window.received,
                window.inserted,
                window.updated,
                window.unchanged,
                window.rejected,
            )
            for reason, n in window.rejected_reasons:
                log.warning("rejected %d record(s): %s", n, reason)
        held = hold_of(parsed, previous, reject_hold_s)
        if held is not None and watermark is not None and watermark > held.at:
            set_watermark(con, src, held.at)  # a schema fault: found once the run is read
            watermark = held.at
        if held is not None:
            log.warning("watermark held at %s: %s", _iso(held.at), held.reason)
        for w in let_go(parsed, reject_hold_s):
            log.warning(
                "%d rejected record(s) of window [%s, %s) open for %g s or more no longer hold "
                "the watermark (they stay open in rejected_rows); after fixing the parser, "
                "collect again with --since %.0f (%s)",
                w.rejected,
                _iso(w.start),
                _iso(w.end),
                reject_hold_s,
                w.start,
                _iso(w.start),
            )
        return report(watermark, held)
    finally:
        con.close()


def parsed_window(
    start: float,
    end: float,
    batch: AccountingBatch,
    first_seen: dict[tuple[str | None, str, str, str], float],
    now: float,
) -> WindowRejects:
    """A window's parse rejects: how many, and how long the youngest has been open (a
    reject not stored open yet: 0 s); ``accepted`` counts the parser's runs (the caller
    replaces it with those ingest stored)."""
    ages = [now - first_seen.get(reject_key(r), now) for r in batch.rejected]
    return WindowRejects(
        start=start,
        end=end,
        accepted=len(batch.runs),
        rejected=len(batch.rejected),
        youngest_open_s=min(ages, default=float("inf")),
    )


def _iso(epoch: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(epoch))


# ---------------------------------------------------------------- telemetry


@dataclass(frozen=True, slots=True)
class SourceReport:
    """One telemetry source: stored samples, dropped values and rejected lines by reason."""

    source: str
    kind: str  # "prometheus" or "sysfs"
    samples: int = 0
    link_load_rows: int = 0
    malformed: int = 0
    sentinels: tuple[tuple[str, int], ...] = ()
    unsupported: int = 0
    negative_rates_dropped: int = 0
    rejected_reasons: tuple[tuple[str, int], ...] = ()
    error: str | None = None
    # hosts its samples were stored under that are no node of the cluster's ``nodes`` table
    # (with their sample counts; empty when the store knows no nodes yet)
    unknown_hosts: tuple[tuple[str, int], ...] = ()


@dataclass(frozen=True, slots=True)
class TelemetryCollectReport:
    """What ``collect_telemetry`` stored per source, and the InfiniBand rates derived."""

    sources: tuple[SourceReport, ...]
    ib_link_load_rows: int
    rates: RateReport | None
    seconds: float
    errors: tuple[tuple[str, str], ...] = field(default=())

    @property
    def samples(self) -> int:
        """Samples stored over all sources."""
        return sum(s.samples for s in self.sources)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready summary."""
        return {
            "samples": self.samples,
            "link_load_rows": self.ib_link_load_rows + sum(s.link_load_rows for s in self.sources),
            "ib_link_load_rows": self.ib_link_load_rows,
            "rates": None if self.rates is None else _rate_dict(self.rates),
            "sources": [
                {
                    "source": s.source,
                    "kind": s.kind,
                    "samples": s.samples,
                    "link_load_rows": s.link_load_rows,
                    "malformed": s.malformed,
                    "sentinels": dict(s.sentinels),
                    "unsupported": s.unsupported,
                    "negative_rates_dropped": s.negative_rates_dropped,
                    "rejected_reasons": dict(s.rejected_reasons),
                    "unknown_hosts": dict(s.unknown_hosts),
                    "error": s.error,
                }
                for s in self.sources
            ],
            "errors": dict(self.errors),
            "seconds": round(self.seconds, 3),
        }


def _rate_dict(r: RateReport) -> dict[str, Any]:
    names = ("intervals", "rates", "first_samples", "gaps", "resets", "wraps", "saturated")
    names2: tuple[str, ...] = ("non_increasing_time", "capped", "port_directions")
    names2 += ("ports_without_rate", "non_finite", "invalid_rates")
    counts = {n: int(getattr(r, n)) for n in (*names, *names2)}
    return {**counts, "without_rate": dict(r.without_rate)}


def _url_host(url: str) -> str:
    return urllib.parse.urlsplit(url).hostname or url


def collect_telemetry(
    store_path: str | Path,
    *,
    endpoints: Sequence[str] = (),
    sysfs_roots: Sequence[str | Path] = (),
    host: str | None = None,
    cluster: str = "",
    timeout: float = 5.0,
    interval_s: float = 30.0,
    scrape: Callable[[str, float], Scrape] = scrape_http,
    read: Callable[[str | Path, str], SysfsReading] | None = None,
    lock_wait_s: float = DEFAULT_LOCK_WAIT_S,
    logger: Log | None = None,
) -> TelemetryCollectReport:
    """Scrape ``endpoints`` and read ``sysfs_roots`` into the store, then derive IB rates.

    Each source is stored in its own transaction; one that cannot be read is reported in
    ``errors`` (and its ``SourceReport.error``) while the others are stored. ``host`` names
    the node for samples without a host label (default: the endpoint's host name, or this
    machine for sysfs). ``scrape``/``read`` replace the readers (the flows pass retrying
    tasks). Raises ``ValueError`` when there is no source at all, ``StoreLockedError`` when
    another process holds the store for longer than ``lock_wait_s``.
    """
    if not endpoints and not sysfs_roots:
        raise ValueError("no telemetry source: give at least one endpoint or sysfs root")
    log = logger or _module_log
    reader = read or _read_sysfs_now
    t0 = time.perf_counter()
    first_ts = time.time()
    # read every source first, then open the store: a slow source must not hold the store's
    # lock (a concurrent accounting collection waits for it)
    reports: list[SourceReport] = []
    scraped: list[tuple[str, str, Scrape]] = []
    for url in endpoints:
        source = f"prometheus:{url}"
        try:
            scraped.append((url, source, scrape(url, timeout)))
        except ScrapeError as exc:
            log.warning("%s", exc)
            reports.append(SourceReport(source, "prometheus", error=str(exc)))
    readings: list[tuple[str | Path, str, SysfsReading]] = []
    for root in sysfs_roots:
        source = f"sysfs:{root}"
        try:
            readings.append((root, source, reader(root, host or socket.gethostname())))
        except ScrapeError as exc:
            log.warning("%s", exc)
            reports.append(SourceReport(source, "sysfs", error=str(exc)))
    con = open_store(store_path, lock_wait_s=lock_wait_s)
    try:
        for url, source, got in scraped:
            before = time.time()
            rep = ingest_prometheus(
                con,
                got.text,
                source=source,
                ts=got.fetched_at,
                host=host or _url_host(url),
                cluster=cluster,
                interval_s=interval_s,
            )
            reasons = _rejected_since(con, source, before)
            unknown = unknown_hosts(con, source, got.fetched_at, cluster)
            reports.append(
                SourceReport(
                    source,
                    "prometheus",
                    samples=rep.samples,
                    link_load_rows=rep.link_load_rows,
                    malformed=rep.malformed,
                    sentinels=rep.sentinels,
                    negative_rates_dropped=rep.negative_rates_dropped,
                    rejected_reasons=reasons,
                    unknown_hosts=unknown,
                )
            )
            for name, n in unknown:
                log.warning(
                    "%s: %d sample(s) stored under host %r, which is no node of cluster %r "
                    "(the nodes table): they will match no job; set the exporter's hostname "
                    "label or collect with --host",
                    url,
                    n,
                    name,
                    cluster,
                )
            log.info(
                "%s: %d samples, %d link_load rows, %d malformed lines, %d DCGM blanks",
                url,
                rep.samples,
                rep.link_load_rows,
                rep.malformed,
                sum(n for _, n in rep.sentinels),
            )
            for reason, n in reasons:
                log.warning("%s: rejected %d line(s): %s", url, n, reason)
        for root, source, reading in readings:
            rep = ingest_samples(
                con, reading.samples, source=source, unsupported=reading.unsupported
            )
            reports.append(
                SourceReport(source, "sysfs", samples=rep.samples, unsupported=rep.unsupported)
            )
            log.info(
                "%s: %d counters of %d ports, %d unsupported",
                root,
                rep.samples,
                reading.ports,
                rep.unsupported,
            )
        ib_rows, rates = 0, None
        if any(r.error is None for r in reports):
            # intervals start at the previous sample (up to gap_factor intervals back)
            ib_rows, rates = derive_ib_link_load(
                con,
                since=first_ts - 3.0 * interval_s,
                until=time.time() + 1.0,
                expected_interval_s=interval_s,
                cluster=cluster,
            )
            log.info(
                "derived %d InfiniBand link_load rows; %d of %d port directions without a rate",
                ib_rows,
                rates.ports_without_rate,
                rates.port_directions,
            )
            for reason, n in rates.without_rate:
                log.warning("%d InfiniBand port direction(s) without a rate: %s", n, reason)
    finally:
        con.close()
    order = [f"prometheus:{u}" for u in endpoints] + [f"sysfs:{r}" for r in sysfs_roots]
    reports.sort(key=lambda r: order.index(r.source))  # the order sources were given in
    return TelemetryCollectReport(
        sources=tuple(reports),
        ib_link_load_rows=ib_rows,
        rates=rates,
        seconds=time.perf_counter() - t0,
        errors=tuple((r.source, r.error) for r in reports if r.error is not None),
    )


def _read_sysfs_now(root: str | Path, host: str) -> SysfsReading:
    return read_sysfs(root, host=host)


def unknown_hosts(con: Any, source: str, since: float, cluster: str) -> tuple[tuple[str, int], ...]:
    """Hosts of ``source``'s samples stored since ``since`` that the ``nodes`` table does not
    name for ``cluster`` (any cluster when it is ""), with their counts; () while the store
    holds no nodes (nothing to check against)."""
    scope = "" if not cluster else " WHERE cluster = ?"
    params: list[Any] = [] if not cluster else [cluster]
    ((known,),) = con.execute(f"SELECT count(*) FROM nodes{scope}", params).fetchall()
    if not known:
        return ()
    rows = con.execute(
        "SELECT coalesce(host, ''), count(*) FROM telemetry_samples WHERE source = ? AND "
        f"ts >= ? AND coalesce(host, '') NOT IN (SELECT node FROM nodes{scope}) "
        "GROUP BY 1 ORDER BY 1",
        [source, since, *params],
    ).fetchall()
    return tuple((str(h), int(n)) for h, n in rows)


def _rejected_since(con: Any, source: str, since: float) -> tuple[tuple[str, int], ...]:
    rows = con.execute(
        "SELECT reason, count(*) FROM rejected_rows WHERE source = ? AND rejected_at >= ? "
        "GROUP BY reason ORDER BY reason",
        [source, since],
    ).fetchall()
    return tuple((str(r), int(n)) for r, n in rows)


# ---------------------------------------------------------------- Prefect flows


@task(retries=2, retry_delay_seconds=2, cache_policy=NO_CACHE)
def read_accounting(client: AccountingSource, since: float, until: float | None) -> AccountingBatch:
    """Slurm accounting records of a window, and those rejected (a pure read: retried)."""
    return client.accounting(since, until)


@task(retries=2, retry_delay_seconds=2, cache_policy=NO_CACHE)
def read_nodes(client: AccountingSource) -> list[NodeInfo]:
    """The cluster's nodes (a pure read: retried)."""
    return client.nodes()


@task(retries=2, retry_delay_seconds=1, cache_policy=NO_CACHE)
def scrape_endpoint(url: str, timeout: float) -> Scrape:
    """GET one exporter endpoint (a pure read: retried)."""
    return scrape_http(url, timeout)


@task(retries=1, retry_delay_seconds=1, cache_policy=NO_CACHE)
def read_sysfs_tree(root: str | Path, host: str) -> SysfsReading:
    """Read one sysfs InfiniBand tree (a pure read: retried)."""
    return read_sysfs(root, host=host)


@dataclass(frozen=True, slots=True)
class _TaskReads:
    """An AccountingSource whose reads run as retrying Prefect tasks."""

    client: AccountingSource

    def accounting(self, since: float, until: float | None = None) -> AccountingBatch:
        return read_accounting(self.client, since, until)

    def nodes(self) -> list[NodeInfo]:
        return read_nodes(self.client)


@flow(name="collect-accounting", log_prints=False)
def collect_accounting_flow(
    db: str,
    slurm_env: str,
    transport: str = "cli",
    cluster: str | None = None,
    since: float | None = None,
    until: float | None = None,
    window_s: float = DEFAULT_WINDOW_S,
    overlap_s: float = DEFAULT_OVERLAP_S,
    reject_hold_s: float = DEFAULT_REJECT_HOLD_S,
) -> dict[str, Any]:
    """Collect a Slurm cluster's accounting into the DuckDB store at ``db``.

    ``slurm_env`` is an env file (``SLURM_CONF``, ``LINKWISE_SLURM_REST_URL``,
    ``LINKWISE_SLURM_CLUSTER``); ``transport`` is ``cli`` or ``rest``. Returns the report as
    a dict (``AccountingReport.to_dict``).
    """

    if transport not in ("cli", "rest"):
        raise ValueError(f"unknown transport {transport!r} (cli or rest)")
    env = read_env_file(slurm_env)
    client = SlurmClient.from_env(env, "cli" if transport == "cli" else "rest")
    name = cluster or env.get("LINKWISE_SLURM_CLUSTER") or "default"
    report = collect_accounting(
        _TaskReads(client),
        db,
        cluster=name,
        since=since,
        until=until,
        window_s=window_s,
        overlap_s=overlap_s,
        reject_hold_s=reject_hold_s,
        logger=get_run_logger(),
    )
    return report.to_dict()


@flow(name="collect-telemetry", log_prints=False)
def collect_telemetry_flow(
    db: str,
    endpoints: list[str] | None = None,
    sysfs_roots: list[str] | None = None,
    host: str | None = None,
    cluster: str = "",
    timeout: float = 5.0,
    interval_s: float = 30.0,
) -> dict[str, Any]:
    """Scrape exporter endpoints and sysfs trees into the DuckDB store at ``db``.

    Returns the report as a dict (``TelemetryCollectReport.to_dict``); raises
    ``CollectError`` (after storing the other sources) when a source could not be read.
    """
    report = collect_telemetry(
        db,
        endpoints=endpoints or [],
        sysfs_roots=sysfs_roots or [],
        host=host,
        cluster=cluster,
        timeout=timeout,
        interval_s=interval_s,
        scrape=lambda url, t: scrape_endpoint(url, t),
        read=lambda root, h: read_sysfs_tree(root, h),
        logger=get_run_logger(),
    )
    if report.errors:
        failed = "; ".join(f"{s}: {e}" for s, e in report.errors)
        raise CollectError(f"telemetry sources failed (others stored): {failed}", report)
    return report.to_dict()
