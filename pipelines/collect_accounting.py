"""Collecting Slurm accounting into the DuckDB store (``collect_accounting``).

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

Writes are not retried inside a run: each window is one idempotent transaction, and what
makes a write fail (disk full, a schema newer than this code) does not go away in seconds;
the failed window is rolled back and the next run starts again from the watermark. The
Prefect flow with retrying reads is ``pipelines.collect``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

import duckdb
import polars as pl

from linkwise.cluster.slurm.errors import SlurmError
from linkwise.cluster.slurm.records import AccountingBatch, JobRun, NodeInfo
from linkwise.datasets.ingest import (
    ClusterLimits,
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
from linkwise.pipelines.collect_common import DEFAULT_LOCK_WAIT_S, CollectError, Log

__all__ = [
    "DEFAULT_LOOKBACK_S",
    "DEFAULT_OVERLAP_S",
    "DEFAULT_REJECT_HOLD_S",
    "DEFAULT_WINDOW_S",
    "AccountingReport",
    "AccountingSource",
    "Hold",
    "WindowRejects",
    "WindowReport",
    "accounting_source_name",
    "collect_accounting",
    "hold_of",
    "let_go",
    "parsed_window",
]

DEFAULT_WINDOW_S = 6 * 3600.0
DEFAULT_OVERLAP_S = 600.0
DEFAULT_LOOKBACK_S = 86400.0
"""The first collection of a cluster (no watermark, no ``since``) reads this far back."""
DEFAULT_REJECT_HOLD_S = 86400.0
"""How long a parse reject holds the watermark (a schema fault holds whatever its age)."""

_module_log = logging.getLogger(__name__)


class AccountingSource(Protocol):
    """What accounting collection reads (``SlurmClient`` is one)."""

    def accounting(self, since: float, until: float | None = None) -> AccountingBatch: ...
    def nodes(self) -> list[NodeInfo]: ...


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
        run = _Run(con, cluster, src, start, end, t0, previous, watermark=previous)
        try:
            nodes = client.nodes()
        except SlurmError as exc:
            raise CollectError(f"reading nodes: {exc}", run.report(previous)) from exc
        run.nodes = ingest_nodes(con, cluster, nodes)
        limits = limits_of(nodes)
        log.info("stored %d nodes of cluster %s", run.nodes, cluster)
        for i, (w_start, w_end) in enumerate(plan, 1):
            try:
                batch = client.accounting(w_start, w_end)
            except SlurmError as exc:
                raise CollectError(
                    f"window {i}/{len(plan)} [{_iso(w_start)}, {_iso(w_end)}): {exc}; "
                    f"{len(run.done)} earlier window(s) stored, this one left unchanged",
                    run.report(run.watermark),
                ) from exc
            window = _store_window(run, batch, (w_start, w_end), limits, reject_hold_s)
            _log_window(log, i, len(plan), window)
        held = _hold_watermark(run, reject_hold_s, log)
        return run.report(run.watermark, held)
    finally:
        con.close()


@dataclass
class _Run:
    """One collection under way: where it reads, and what its committed windows left (the
    watermark, how far unsettled records and held rejects keep it back, each window)."""

    con: duckdb.DuckDBPyConnection
    cluster: str
    source: str
    since: float
    until: float
    t0: float  # perf_counter at the start
    previous: float | None  # the watermark before the run
    watermark: float | None
    nodes: int = 0
    hold: float = float("inf")  # unsettled records and held rejects keep the watermark behind
    done: list[WindowReport] = field(default_factory=list)
    parsed: list[WindowRejects] = field(default_factory=list)

    def report(self, watermark: float | None, hold: Hold | None = None) -> AccountingReport:
        """What the run did so far."""
        return AccountingReport(
            cluster=self.cluster,
            source=self.source,
            since=self.since,
            until=self.until,
            nodes=self.nodes,
            windows=tuple(self.done),
            watermark=watermark,
            seconds=time.perf_counter() - self.t0,
            previous_watermark=self.previous,
            held_at=None if hold is None else hold.at,
            held_reason="" if hold is None else hold.reason,
            open_rejects=count_open_rejects(self.con, self.source),
        )


def _store_window(
    run: _Run,
    batch: AccountingBatch,
    span: tuple[float, float],
    limits: ClusterLimits | None,
    reject_hold_s: float,
) -> WindowReport:
    """Store one window's records with its watermark (one transaction) and note it in
    ``run``."""
    w_start, w_end = span
    tw = time.perf_counter()
    con, src = run.con, run.source
    runs = _keep_known_exit_codes(con, list(batch.runs))
    first_seen = open_rejects(con, src, batch.rejected)
    seen = parsed_window(w_start, w_end, batch, first_seen, time.time())
    rejects_at = w_start if _holds(seen, reject_hold_s) else float("inf")
    run.hold = min(run.hold, _unsettled_since(runs), rejects_at)
    candidate = min(w_end, run.hold)
    watermark = candidate if run.watermark is None else max(run.watermark, candidate)
    run.watermark = watermark
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
    run.done.append(window)
    run.parsed.append(replace(seen, accepted=ing.received - ing.rejected))
    return window


def _log_window(log: Log, i: int, n: int, window: WindowReport) -> None:
    log.info(
        "window %d/%d [%s, %s): %d records, %d new, %d updated, %d unchanged, %d rejected",
        i,
        n,
        _iso(window.start),
        _iso(window.end),
        window.received,
        window.inserted,
        window.updated,
        window.unchanged,
        window.rejected,
    )
    for reason, k in window.rejected_reasons:
        log.warning("rejected %d record(s): %s", k, reason)


def _hold_watermark(run: _Run, reject_hold_s: float, log: Log) -> Hold | None:
    """Where the run's parse rejects hold the watermark (set back in the store in a schema
    fault, found once the run is read); the rejects that no longer hold named."""
    held = hold_of(run.parsed, run.previous, reject_hold_s)
    if held is not None and run.watermark is not None and run.watermark > held.at:
        set_watermark(run.con, run.source, held.at)  # a schema fault: found once the run is read
        run.watermark = held.at
    if held is not None:
        log.warning("watermark held at %s: %s", _iso(held.at), held.reason)
    for w in let_go(run.parsed, reject_hold_s):
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
    return held


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
