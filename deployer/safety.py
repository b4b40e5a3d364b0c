"""Safety of the live loop: the lease, the records (store or spool) and the release of held jobs.

The lease is a small JSON file the loop rewrites every cycle: who holds it (pid and its
start time), until when, which partitions it manages, which jobs it holds and which held
jobs it refuses (requests that can never fit, left as their user made them). The watchdog
(``python -m linkwise.deployer.watchdog``, a separate process in its own session) and the
shipped ``job_submit.lua`` both read it: once it expires or its owner is gone, the watchdog
releases every held job of the managed partitions unchanged, and job_submit.lua stops
holding new jobs, so Slurm's own scheduler takes over even after ``kill -9`` of the loop.

Records (decisions, audit rows, their outcomes) go to the DuckDB store, opened per batch so
other writers (collection) can interleave; when the store cannot be opened they are appended
(and fsync'ed) to a JSONL spool beside the lease and replayed into the store later. A record
that can be neither stored nor spooled is counted as lost and logged; an audit row that
cannot be persisted stops the action it describes (``RecordError``).
"""

from __future__ import annotations

import json
import logging
import os
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from linkwise.cluster.slurm.client import SlurmClient
from linkwise.cluster.slurm.errors import SlurmError
from linkwise.cluster.slurm.records import QueuedJob

__all__ = [
    "AUDIT_COLUMNS",
    "DECISION_COLUMNS",
    "Lease",
    "RecordError",
    "Recorder",
    "lease_expired",
    "log_event",
    "pid_alive",
    "pid_start_time",
    "read_lease",
    "release_held",
    "write_lease",
]

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


def log_event(logger: logging.Logger, event: str, level: int = logging.INFO, **fields: Any) -> None:
    """One structured log line: a JSON object with ``event``, ``ts`` and ``fields``."""
    if logger.isEnabledFor(level):
        line = {"ts": round(time.time(), 3), "event": event, **fields}
        logger.log(level, json.dumps(line, default=str, sort_keys=False))


# ------------------------------------------------------------------------ the lease


def pid_start_time(pid: int) -> int | None:
    """The start time (clock ticks since boot) of process ``pid``; None if it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rfind(")") + 2 :].split()
    if fields and fields[0] in ("Z", "X"):
        return None
    return int(fields[19]) if len(fields) > 19 else None


def pid_alive(pid: int, start_time: int | None = None) -> bool:
    """Whether ``pid`` runs (not a zombie) and, if given, started at ``start_time``."""
    now = pid_start_time(pid)
    return now is not None and (start_time is None or now == start_time)


@dataclass(frozen=True)
class Lease:
    """What the loop holds and until when (the watchdog's and job_submit.lua's input)."""

    owner_pid: int
    owner_start: int | None
    expires_at: float
    partitions: tuple[str, ...]
    slurm_conf: str | None
    db: str | None
    run_id: str
    held: tuple[int, ...] = ()
    refused: tuple[int, ...] = ()  # held by their users and never startable: left alone
    released: bool = False  # set on a clean shutdown once everything was released
    renewed_at: float = field(default_factory=time.time)


def write_lease(path: str | os.PathLike[str], lease: Lease) -> None:
    """Atomically (write, fsync, rename) write the lease file; also ``<path>.expires``, one
    integer line (epoch seconds, 0 once released) for ``job_submit.lua``."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    _atomic_write(target, json.dumps(asdict(lease)))
    expiry = 0 if lease.released else int(lease.expires_at)
    parts = ",".join(lease.partitions)
    _atomic_write(target.with_name(target.name + ".expires"), f"{expiry}\n{parts}\n")


def _atomic_write(target: Path, text: str) -> None:
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, target)


def read_lease(path: str | os.PathLike[str]) -> Lease | None:
    """The lease in ``path``; None if there is none (or it cannot be parsed)."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    try:
        return Lease(
            owner_pid=int(data["owner_pid"]),
            owner_start=data.get("owner_start"),
            expires_at=float(data["expires_at"]),
            partitions=tuple(data.get("partitions") or ()),
            slurm_conf=data.get("slurm_conf"),
            db=data.get("db"),
            run_id=str(data.get("run_id", "")),
            held=tuple(int(x) for x in data.get("held") or ()),
            refused=tuple(int(x) for x in data.get("refused") or ()),
            released=bool(data.get("released", False)),
            renewed_at=float(data.get("renewed_at", 0.0)),
        )
    except (KeyError, TypeError, ValueError):
        return None


def lease_expired(lease: Lease, now: float) -> bool:
    """True once the lease ran out or its owner process is gone (not after a clean release)."""
    if lease.released:
        return False
    return now >= lease.expires_at or not pid_alive(lease.owner_pid, lease.owner_start)


def renewed(lease: Lease, now: float, lease_s: float, **changes: Any) -> Lease:
    """The lease extended to ``now + lease_s`` with ``changes`` applied."""
    return replace(lease, expires_at=now + lease_s, renewed_at=now, **changes)


# ------------------------------------------------------------------------ records


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
    ) -> None:
        self.db = db
        self.spool = Path(spool)
        self.log = logger
        self.on_lost = on_lost
        self.on_spooled = on_spooled
        if open_store is None:
            from linkwise.datasets.store import open_store as default_open

            open_store = default_open
        self._open = open_store
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
                log_event(self.log, "store_write_failed", logging.WARNING, error=str(exc)[:300])
            finally:
                con.close()
        if not lines:
            return "spool"
        try:
            self._append_spool(lines)
        except OSError as exc:
            log_event(
                self.log, "records_lost", logging.ERROR, count=len(lines), error=str(exc)[:300]
            )
            if self.on_lost is not None:
                self.on_lost(len(lines))
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
                    error=str(exc)[:300],
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
    except BaseException:
        con.rollback()
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


# ------------------------------------------------------------------------ releasing


def release_command(job_id: int) -> list[str]:
    """The argument list that releases a held job."""
    return ["scontrol", "release", str(int(job_id))]


def release_held(
    client: SlurmClient,
    jobs: Iterable[QueuedJob],
    *,
    recorder: Recorder,
    run_id: str,
    cycle_id: int,
    actor: str,
    model_version: str,
    logger: logging.Logger,
) -> list[int]:
    """Release ``jobs`` unchanged (each audited first); returns the ids released.

    A job that is no longer held (a race with its user or the loop) counts as released.
    """
    targets = [j for j in jobs if j.held]
    if not targets:
        return []
    now = time.time()
    audits = [
        {
            "audit_id": new_id(),
            "ts": now,
            "run_id": run_id,
            "cycle_id": cycle_id,
            "actor": actor,
            "job_id": j.job_id,
            "command": json.dumps(release_command(j.job_id)),
            "model_version": model_version,
            "outcome": "pending",
        }
        for j in targets
    ]
    try:
        recorder.write(audits=audits, must_persist=True)
    except RecordError as exc:
        # releasing hands jobs back to Slurm: safer to do it unaudited than to strand them
        log_event(logger, "audit_unavailable_releasing_anyway", logging.ERROR, error=str(exc))
    done: list[int] = []
    outcomes: list[tuple[str, str, float]] = []
    for job, row in zip(targets, audits, strict=True):
        try:
            client.release(job.job_id)
            outcome = "ok"
            done.append(job.job_id)
        except SlurmError as exc:
            outcome = f"error: {str(exc)[:200]}"
        outcomes.append((str(row["audit_id"]), outcome, time.time()))
        log_event(logger, "released", job_id=job.job_id, actor=actor, outcome=outcome)
    recorder.write(outcomes=outcomes)
    return done
