"""Records (decisions, audit rows, their outcomes) of the live loop.

They go to the DuckDB store, opened per batch so other writers (collection) can interleave;
when the store cannot be opened they are appended (and fsync'ed) to a JSONL spool and
replayed into the store later. A record that can be neither stored nor spooled is counted as
lost and logged; an audit row that cannot be persisted stops the action it describes
(``RecordError``).
"""

from __future__ import annotations

import json
import logging
import os
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

from linkwise.datasets.store import open_store as default_open_store
from linkwise.deployer.events import error_text, log_event

T = TypeVar("T")

DECISION_COLUMNS = (
    "decision_id",
    "run_id",
    "cycle_id",
    "ts",
    "mode",
    "cluster",
    "partition",
    "policy",
    "model_version",
    "obs_spec_version",
    "job_id",
    "action",
    "nodes",
    "gpus",
    "latency_ms",
    "n_pending",
    "note",
    "deviated",
    "explanation",
)
AUDIT_COLUMNS = (
    "audit_id",
    "ts",
    "run_id",
    "cycle_id",
    "actor",
    "job_id",
    "command",
    "model_version",
    "outcome",
)


class RecordError(RuntimeError):
    """A record (an audit row before its action) could be neither stored nor spooled."""


def new_id() -> str:
    """A fresh random identifier for a decision or audit row."""
    return uuid.uuid4().hex


class Recorder:
    """Writes decisions, audit rows and outcomes to the store, or to a spool when it cannot.

    ``db`` None means no store (everything goes to the spool). ``open_store`` is injectable
    for tests; by default ``linkwise.datasets.store.open_store``.
    """

    def __init__(
        self,
        db: str | None,
        spool: str | os.PathLike[str],
        *,
        logger: logging.Logger,
        on_lost: Callable[[int], None] | None = None,
        on_spooled: Callable[[int], None] | None = None,
        open_store: Callable[[str], Any] | None = None,
        on_audit_lost: Callable[[int], None] | None = None,
    ) -> None:
        self.db = db
        self.spool = Path(spool)
        self.log = logger
        self.on_lost = on_lost
        self.on_spooled = on_spooled
        self.on_audit_lost = on_audit_lost
        self._open = open_store if open_store is not None else default_open_store
        self.store_ok = True

    # -- public

    def write(
        self,
        *,
        decisions: Sequence[Mapping[str, Any]] = (),
        audits: Sequence[Mapping[str, Any]] = (),
        outcomes: Sequence[tuple[str, str, float]] = (),
        joins: Sequence[tuple[int, float, str]] = (),
        must_persist: bool = False,
    ) -> str:
        """Persist the records: ``"store"``, ``"spool"`` or ``"lost"``.

        ``joins`` are (job_id, actual_start, actual_nodes) for start decisions; they are
        applied only through the store (later cycles retry them). With ``must_persist`` a
        failure to store and to spool raises ``RecordError`` instead of returning ``"lost"``.
        """
        lines = [("decisions", dict(d)) for d in decisions] + [("audit", dict(a)) for a in audits]
        lines += [("outcome", {"audit_id": i, "outcome": o, "ts": t}) for i, o, t in outcomes]
        con = self._connect()
        if con is not None:
            try:
                self._replay_spool(con)
                _insert(con, lines)
                _join(con, joins)
                return "store"
            except Exception as exc:
                log_event(self.log, "store_write_failed", logging.WARNING, error=error_text(exc))
            finally:
                try:
                    con.close()
                except Exception as exc:
                    log_event(self.log, "store_close_failed", logging.WARNING, error=str(exc))
        if not lines:
            return "spool"
        try:
            self._append_spool(lines)
        except OSError as exc:
            log_event(
                self.log, "records_lost", logging.ERROR, count=len(lines), error=error_text(exc)
            )
            if self.on_lost is not None:
                self.on_lost(len(lines))
            lost_audits = [r for t, r in lines if t == "audit"]
            if lost_audits:  # on stderr at least: what was done, or about to be done
                log_event(self.log, "audit_unwritten", logging.ERROR, records=lost_audits)
                if self.on_audit_lost is not None:
                    self.on_audit_lost(len(lost_audits))
            if must_persist:
                raise RecordError(f"cannot store or spool {len(lines)} records: {exc}") from exc
            return "lost"
        return "spool"

    def spooled(self) -> int:
        """Records waiting in the spool."""
        try:
            with open(self.spool, "rb") as fh:
                return sum(1 for _ in fh)
        except OSError:
            return 0

    def query(self, sql: str, params: Sequence[object] = ()) -> list[tuple[Any, ...]] | None:
        """Rows of a read query against the store; None when the store cannot be opened."""
        con = self._connect()
        if con is None:
            return None
        try:
            rows: list[tuple[Any, ...]] = con.execute(sql, list(params)).fetchall()
            return rows
        except Exception as exc:
            log_event(self.log, "store_read_failed", logging.WARNING, error=str(exc)[:300])
            return None
        finally:
            con.close()

    def read(self, fn: Callable[[Any], T]) -> T | None:
        """``fn`` on a connection to the store, closed after; None when the store cannot be
        opened or ``fn`` fails (logged)."""
        con = self._connect()
        if con is None:
            return None
        try:
            return fn(con)
        except Exception as exc:
            log_event(self.log, "store_read_failed", logging.WARNING, error=str(exc)[:300])
            return None
        finally:
            con.close()

    # -- internals

    def _connect(self) -> Any:
        if self.db is None:
            return None
        try:
            con = self._open(self.db)
        except Exception as exc:
            if self.store_ok:
                log_event(
                    self.log,
                    "store_unavailable",
                    logging.WARNING,
                    db=self.db,
                    error=error_text(exc),
                    spool=str(self.spool),
                )
            self.store_ok = False
            return None
        if not self.store_ok:
            log_event(self.log, "store_available", db=self.db, spooled=self.spooled())
        self.store_ok = True
        return con

    def _append_spool(self, lines: Sequence[tuple[str, dict[str, Any]]]) -> None:
        self.spool.parent.mkdir(parents=True, exist_ok=True)
        data = "".join(json.dumps({"table": t, "row": r}, default=str) + "\n" for t, r in lines)
        fd = os.open(self.spool, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, data.encode("utf-8"))
            os.fsync(fd)
        finally:
            os.close(fd)
        if self.on_spooled is not None:
            self.on_spooled(self.spooled())

    def _replay_spool(self, con: Any) -> None:
        if not self.spool.exists():
            return
        taking = self.spool.with_name(self.spool.name + f".replay.{os.getpid()}")
        os.replace(self.spool, taking)
        lines: list[tuple[str, dict[str, Any]]] = []
        for raw in taking.read_text(encoding="utf-8").splitlines():
            try:
                doc = json.loads(raw)
                lines.append((str(doc["table"]), dict(doc["row"])))
            except (ValueError, KeyError, TypeError):
                log_event(self.log, "spool_line_unreadable", logging.ERROR, line=raw[:200])
        try:
            _insert(con, lines)
        except Exception:
            # put the lines back for a later try (prepended to whatever arrived meanwhile)
            rest = self.spool.read_bytes() if self.spool.exists() else b""
            self.spool.write_bytes(taking.read_bytes() + rest)
            taking.unlink(missing_ok=True)
            raise
        taking.unlink(missing_ok=True)
        log_event(self.log, "spool_replayed", records=len(lines))
        if self.on_spooled is not None:
            self.on_spooled(self.spooled())


def _insert(con: Any, lines: Sequence[tuple[str, Mapping[str, Any]]]) -> None:
    decisions = [tuple(r.get(c) for c in DECISION_COLUMNS) for t, r in lines if t == "decisions"]
    audits = [tuple(r.get(c) for c in AUDIT_COLUMNS) for t, r in lines if t == "audit"]
    outcomes = [(r["outcome"], r["ts"], r["audit_id"]) for t, r in lines if t == "outcome"]
    if not (decisions or audits or outcomes):
        return
    con.begin()
    try:
        if decisions:
            marks = ", ".join("?" * len(DECISION_COLUMNS))
            con.executemany(
                f"INSERT OR IGNORE INTO decisions ({', '.join(DECISION_COLUMNS)}) VALUES ({marks})",
                decisions,
            )
        if audits:
            marks = ", ".join("?" * len(AUDIT_COLUMNS))
            con.executemany(
                f"INSERT OR IGNORE INTO audit ({', '.join(AUDIT_COLUMNS)}) VALUES ({marks})",
                audits,
            )
        if outcomes:
            con.executemany(
                "UPDATE audit SET outcome = ?, outcome_ts = ? WHERE audit_id = ?", outcomes
            )
        con.commit()
    except BaseException as exc:
        try:
            con.rollback()
        except Exception as gone:  # e.g. a full disk ended the transaction: keep the cause
            exc.add_note(f"rollback: {gone}")
        raise


def _join(con: Any, joins: Sequence[tuple[int, float, str]]) -> None:
    if not joins:
        return
    now = time.time()
    con.executemany(
        "UPDATE decisions SET actual_start = ?, actual_nodes = ?, joined_at = ? "
        "WHERE job_id = ? AND action = 'start' AND actual_start IS NULL",
        [(start, nodes, now, job) for job, start, nodes in joins],
    )
