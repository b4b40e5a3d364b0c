"""Collecting interconnect telemetry into the DuckDB store (``collect_telemetry``).

- ``collect_telemetry(store_path, endpoints=[...], sysfs_roots=[...])``: scrape exporter
  endpoints (HTTP GET with a timeout) and read ``/sys/class/infiniband`` trees, store each
  source in its own transaction, then derive InfiniBand ``link_load`` rates from the raw
  counters. A source that fails is reported and the others are still stored.

Every source is read before the store is opened, so a slow source does not hold the store's
lock. The Prefect flow with retrying reads is ``pipelines.collect``.
"""

from __future__ import annotations

import logging
import socket
import time
import urllib.parse
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from linkwise.datasets.store import open_store
from linkwise.datasets.telemetry.counters import RateReport
from linkwise.datasets.telemetry.scrape import Scrape, ScrapeError, scrape_http
from linkwise.datasets.telemetry.store import derive_ib_link_load, ingest_prometheus, ingest_samples
from linkwise.datasets.telemetry.sysfs import SysfsReading, read_sysfs
from linkwise.pipelines.collect_common import DEFAULT_LOCK_WAIT_S, Log

__all__ = ["SourceReport", "TelemetryCollectReport", "collect_telemetry", "unknown_hosts"]

_module_log = logging.getLogger(__name__)


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
            where = (host or _url_host(url), cluster, interval_s)
            reports.append(_store_scrape(con, url, source, got, where, log))
        for root, source, reading in readings:
            reports.append(_store_sysfs(con, root, source, reading, log))
        ib_rows, rates = 0, None
        if any(r.error is None for r in reports):
            ib_rows, rates = _derive_rates(con, first_ts, interval_s, cluster, log)
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


def _store_scrape(
    con: Any, url: str, source: str, got: Scrape, where: tuple[str, str, float], log: Log
) -> SourceReport:
    """Store one endpoint's scrape (``where``: the host of unlabelled samples, the cluster,
    the scrape interval); what was stored, dropped and rejected, hosts no node named."""
    host, cluster, interval_s = where
    before = time.time()
    rep = ingest_prometheus(
        con,
        got.text,
        source=source,
        ts=got.fetched_at,
        host=host,
        cluster=cluster,
        interval_s=interval_s,
    )
    reasons = _rejected_since(con, source, before)
    unknown = unknown_hosts(con, source, got.fetched_at, cluster)
    report = SourceReport(
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
    return report


def _store_sysfs(
    con: Any, root: str | Path, source: str, reading: SysfsReading, log: Log
) -> SourceReport:
    """Store one sysfs tree's counters."""
    rep = ingest_samples(con, reading.samples, source=source, unsupported=reading.unsupported)
    log.info(
        "%s: %d counters of %d ports, %d unsupported",
        root,
        rep.samples,
        reading.ports,
        rep.unsupported,
    )
    return SourceReport(source, "sysfs", samples=rep.samples, unsupported=rep.unsupported)


def _derive_rates(
    con: Any, first_ts: float, interval_s: float, cluster: str, log: Log
) -> tuple[int, RateReport]:
    """InfiniBand ``link_load`` rows from the counters stored since the run began."""
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
    return ib_rows, rates


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
