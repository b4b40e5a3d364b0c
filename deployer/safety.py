"""Safety of the live loop: whose holds are whose, the lease, the records (store or spool) and
handing held jobs back to Slurm.

Ownership: the loop manages only jobs held for it, recognisable in Slurm itself: held
(priority 0, reason ``JobHeldUser``) with the administrator comment ``linkwise:held``, which
the shipped ``job_submit.lua`` sets when it holds a job (users cannot set or change an admin
comment). A job held by an administrator (``JobHeldAdmin``), a user's own hold and every
untagged job are left alone by the loop, its clean shutdown and the watchdog.

The lease: one per (cluster, sorted partition set), in a directory derived from slurm.conf
(ClusterName, SlurmctldHost, SlurmctldPort) under a lease root, never from ``--state-dir``.
Each partition has an OS lock (``flock``) there: a second loop on any overlapping partition
is refused (``LeaseTaken``). The lease JSON (who holds it: pid, its start time, host; until
when; its state) is the watchdog's input; ``<partition>.expires`` files (expiry, owner pid,
start time, host) are ``job_submit.lua``'s: it holds new jobs only while the lease is
active, unexpired and its owner process still runs.

Handing back (clean shutdown, or the watchdog once the owner is gone): mark the lease
``releasing`` first (the plugin holds nothing new), release every job held for the loop,
wait, release again (a submission that read the lease just before), mark it ``released``.

Records (decisions, audit rows, their outcomes) go to the DuckDB store, opened per batch so
other writers (collection) can interleave; when the store cannot be opened they are appended
(and fsync'ed) to a JSONL spool and replayed into the store later. A record that can be
neither stored nor spooled is counted as lost and logged; an audit row that cannot be
persisted stops the action it describes (``RecordError``).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import logging
import os
import re
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from linkwise.cluster.slurm.client import SlurmClient
from linkwise.cluster.slurm.errors import SlurmError
from linkwise.cluster.slurm.records import QueuedJob
from linkwise.datasets.store import open_store as default_open_store

__all__ = [
    "AUDIT_COLUMNS",
    "DECISION_COLUMNS",
    "HOLD_TAG",
    "RELEASED_TAG",
    "STRANDED_REASONS",
    "WATCHDOG_HOLDER",
    "Lease",
    "LeaseTaken",
    "PartitionLocks",
    "RecordError",
    "Recorder",
    "bypassed",
    "clear_nodes_command",
    "error_text",
    "hand_back",
    "held_for_loop",
    "in_partitions",
    "lease_dir_for",
    "lease_expired",
    "lease_live",
    "lock_partitions",
    "log_event",
    "pid_alive",
    "pid_start_time",
    "read_lease",
    "release_held",
    "stranded",
    "sweep",
    "write_lease",
]

HOLD_TAG = "linkwise:held"  # AdminComment of a job held for the loop (job_submit.lua)
RELEASED_TAG = "linkwise:released"  # ... once released (job_submit.lua, with the release)
LeaseState = Literal["active", "releasing", "released"]
_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$")

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


def valid_name(name: str) -> bool:
    """Whether ``name`` is safe as a partition or file name part (no path, no spaces)."""
    return bool(_NAME.match(name)) and len(name) <= 100


@dataclass(frozen=True)
class Lease:
    """What the loop holds and until when (the watchdog's input; see the module)."""

    owner_pid: int
    owner_start: int | None
    expires_at: float
    partitions: tuple[str, ...]
    slurm_conf: str | None
    db: str | None
    run_id: str
    held: tuple[int, ...] = ()
    state: LeaseState = "active"
    renewed_at: float = field(default_factory=time.time)
    host: str = field(default_factory=lambda: os.uname().nodename)
    spool: str | None = None  # where the watchdog's records go when the store is unavailable
    slurm_bin: str | None = None  # a folder of Slurm's commands (LINKWISE_SLURM_BIN)

    @property
    def released(self) -> bool:
        """Handed back completely (swept twice after new holds stopped)."""
        return self.state == "released"


def lease_dir_for(root: str | os.PathLike[str], slurm_conf_text: str) -> Path:
    """The lease directory of a cluster: ``root/<ClusterName>-<SlurmctldHost>-<port>``, the
    same for every loop of that cluster whatever its ``--state-dir`` (job_submit.lua's
    ``LEASE_DIR``)."""
    keys: dict[str, str] = {}
    for raw in slurm_conf_text.splitlines():
        line = raw.split("#", 1)[0].strip()
        key, eq, value = line.partition("=")
        if eq and key.strip().lower() not in keys:
            keys[key.strip().lower()] = value.strip().split()[0] if value.strip() else ""
    host = (keys.get("slurmctldhost") or keys.get("controlmachine") or "").split("(")[0]
    parts = (keys.get("clustername", ""), host, keys.get("slurmctldport") or "6817")
    return Path(root) / "-".join(re.sub(r"[^A-Za-z0-9_.]", "_", x) or "_" for x in parts)


def _expires_line(lease: Lease) -> str:
    expiry = int(lease.expires_at) if lease.state == "active" else 0
    return f"{expiry} {lease.owner_pid} {lease.owner_start or 0} {lease.host}\n"


def write_lease(path: str | os.PathLike[str], lease: Lease) -> None:
    """Atomically (write, fsync, rename) write the lease file and, beside it, one
    ``<partition>.expires`` per partition for ``job_submit.lua``: one line, ``expiry pid
    start host`` (expiry 0 unless the lease is active)."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    line = _expires_line(lease)
    if lease.state != "active":  # the plugin stops holding before anything else changes
        for p in lease.partitions:
            _atomic_write(target.with_name(f"{p}.expires"), line)
    _atomic_write(target, json.dumps(asdict(lease)))
    if lease.state == "active":
        for p in lease.partitions:
            _atomic_write(target.with_name(f"{p}.expires"), line)


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
        state = str(data.get("state", "active"))
        if state not in ("active", "releasing", "released"):
            return None
        return Lease(
            owner_pid=int(data["owner_pid"]),
            owner_start=data.get("owner_start"),
            expires_at=float(data["expires_at"]),
            partitions=tuple(str(p) for p in data.get("partitions") or ()),
            slurm_conf=data.get("slurm_conf"),
            db=data.get("db"),
            run_id=str(data.get("run_id", "")),
            held=tuple(int(x) for x in data.get("held") or ()),
            state=state,  # type: ignore[arg-type]
            renewed_at=float(data.get("renewed_at", 0.0)),
            host=str(data.get("host", "")),
            spool=data.get("spool"),
            slurm_bin=data.get("slurm_bin"),
        )
    except (KeyError, TypeError, ValueError):
        return None


def lease_live(lease: Lease, now: float) -> bool:
    """Active, unexpired and renewed by a live owner: what job_submit.lua holds jobs under."""
    return (
        lease.state == "active"
        and now < lease.expires_at
        and pid_alive(lease.owner_pid, lease.owner_start)
    )


def lease_expired(lease: Lease, now: float) -> bool:
    """True once an active lease ran out or its owner process is gone."""
    return lease.state == "active" and not lease_live(lease, now)


def renewed(lease: Lease, now: float, lease_s: float, **changes: Any) -> Lease:
    """The lease extended to ``now + lease_s`` with ``changes`` applied."""
    return replace(lease, expires_at=now + lease_s, renewed_at=now, **changes)


WATCHDOG_HOLDER = "the watchdog of a stopped loop"  # how a handing-back watchdog signs


class LeaseTaken(RuntimeError):
    """Another loop (or its watchdog) holds a partition's lock: ``holder`` says who."""

    def __init__(self, message: str, *, partition: str = "", holder: str = "") -> None:
        super().__init__(message)
        self.partition = partition
        self.holder = holder


@dataclass(frozen=True)
class PartitionLocks:
    """``flock``-ed ``<dir>/<partition>.lock`` files, held until ``close()`` or the process
    ends (``kill -9`` included: the kernel drops them; children do not inherit them)."""

    fds: tuple[int, ...]

    def close(self) -> None:
        """Release every lock (call once: a closed descriptor's number is reused)."""
        for fd in self.fds:
            with contextlib.suppress(OSError):
                os.close(fd)


def lock_partitions(
    lease_dir: str | os.PathLike[str],
    partitions: Iterable[str],
    holder: str,
    *,
    wait_s: float = 0.0,
) -> PartitionLocks:
    """Lock every partition (sorted, so two takers never deadlock) or none: ``LeaseTaken``
    names the partition and its holder. ``holder`` is written into each lock file."""
    folder = Path(lease_dir)
    folder.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + wait_s
    fds: list[int] = []
    try:
        for p in sorted(set(partitions)):
            if not valid_name(p):
                raise ValueError(f"invalid partition name {p!r}")
            path = folder / f"{p}.lock"
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
            fds.append(fd)
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() >= deadline:
                        other = path.read_text(encoding="utf-8", errors="replace").strip()
                        raise LeaseTaken(
                            f"partition {p} is managed by another loop ({other or 'unknown'}; "
                            f"lock {path}): stop it first",
                            partition=p,
                            holder=other,
                        ) from None
                    time.sleep(0.1)
            os.ftruncate(fd, 0)
            os.pwrite(fd, holder.encode("utf-8"), 0)
    except BaseException:
        PartitionLocks(tuple(fds)).close()
        raise
    return PartitionLocks(tuple(fds))


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


# ------------------------------------------------------------------------ releasing


def held_for_loop(job: QueuedJob) -> bool:
    """Held for the loop: held as job_submit.lua holds (``JobHeldUser``) and tagged so. An
    administrator's hold on top (``JobHeldAdmin``) or an untagged hold is not the loop's."""
    return job.held and job.reason == "JobHeldUser" and job.admin_comment == HOLD_TAG


def in_partitions(job: QueuedJob, partitions: Iterable[str]) -> bool:
    """Whether any of the job's partitions (``gpu`` or a submitted list ``gpu,cpu``) is one
    of ``partitions``."""
    return not set(job.partition.split(",")).isdisjoint(partitions)


def bypassed(job: QueuedJob) -> bool:
    """Tagged as held for the loop but no longer held: released by someone else (or by a
    release that did not go through job_submit.lua, which ends the tag with it)."""
    return not job.held and job.admin_comment == HOLD_TAG and job.state in ("PENDING", "RUNNING")


# pending reasons of a released job that cannot run on the node list the loop gave it
STRANDED_REASONS = ("BadConstraints", "ReqNodeNotAvail", "PartitionNodeLimit", "NodeDown")


def stranded(job: QueuedJob) -> bool:
    """Released by the loop with a node list Slurm reports it cannot run on (22.05 also
    gives such a job priority 0, so it may look held): its node list must be cleared."""
    return (
        job.state == "PENDING"
        and job.admin_comment == RELEASED_TAG
        and bool(job.req_nodes)
        and job.reason.startswith(STRANDED_REASONS)
    )


def release_command(job_id: int) -> list[str]:
    """The argument list that releases a held job."""
    return ["scontrol", "release", str(int(job_id))]


def clear_nodes_command(job_id: int) -> list[str]:
    """The argument list that clears a pending job's node list (Slurm places it again)."""
    return ["scontrol", "update", f"JobId={int(job_id)}", "ReqNodeList="]


def error_text(exc: BaseException, limit: int = 300) -> str:
    """An error's message for the logs, naming ENOSPC where a full disk is the cause (DuckDB
    reports it as an I/O error; an ``OSError`` carries its errno)."""
    text = " ".join([str(exc), *getattr(exc, "__notes__", ())])
    full = getattr(exc, "errno", None) == errno.ENOSPC or "no space left" in text.lower()
    if full and "ENOSPC" not in text:
        text = f"ENOSPC (disk full): {text}"
    return text[:limit]


def untag_command(job_id: int) -> list[str]:
    """The argument list that ends the loop's claim on a job no longer held."""
    return ["scontrol", "update", f"JobId={int(job_id)}", f"AdminComment={RELEASED_TAG}"]


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
    command: Callable[[int], list[str]] = release_command,
) -> list[int]:
    """Run ``command`` (by default: release unchanged) on ``jobs``, each audited first;
    returns the ids it succeeded on. Releasing skips jobs no longer held."""
    targets = [j for j in jobs if j.held or command is not release_command]
    targets = list({j.job_id: j for j in targets}.values())
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
            "command": json.dumps(command(j.job_id)),
            "model_version": model_version,
            "outcome": "pending",
        }
        for j in targets
    ]
    try:
        recorder.write(audits=audits, must_persist=True)
    except RecordError as exc:
        # releasing hands jobs back to Slurm: safer to do it unaudited than to strand them
        log_event(logger, "audit_unavailable_acting_anyway", logging.ERROR, error=str(exc))
    done: list[int] = []
    outcomes: list[tuple[str, str, float]] = []
    for job, row in zip(targets, audits, strict=True):
        cmd = command(job.job_id)
        try:
            client.runner.run(cmd)
            outcome = "ok"
            done.append(job.job_id)
        except SlurmError as exc:
            outcome = f"error: {str(exc)[:200]}"
        outcomes.append((str(row["audit_id"]), outcome, time.time()))
        log_event(logger, cmd[1] + "d", job_id=job.job_id, actor=actor, outcome=outcome)
    recorder.write(outcomes=outcomes)
    return done


def sweep(
    client: SlurmClient,
    lease: Lease,
    recorder: Recorder,
    *,
    actor: str,
    logger: logging.Logger,
    cycle_id: int = -1,
    untag: Iterable[int] = (),
) -> list[int]:
    """Release (unchanged) every job of the lease's partitions held for the loop; end the
    tag of the ``untag`` jobs found released but still tagged (no job_submit.lua ended it);
    clear the node list of released jobs Slurm cannot run there (``stranded``)."""
    managed = set(lease.partitions)
    queue = [q for q in client.queue() if in_partitions(q, managed)]
    done = set(untag)
    stale = [q for q in queue if bypassed(q) and q.job_id in done]
    common: dict[str, Any] = dict(
        recorder=recorder, run_id=lease.run_id, cycle_id=cycle_id, model_version="", logger=logger
    )
    if stale:
        release_held(client, stale, actor=actor + ":untag", command=untag_command, **common)
    lost = [q for q in queue if stranded(q)]
    if lost:  # released where Slurm cannot run them: Slurm places them itself
        release_held(client, lost, actor=actor + ":unstrand", command=clear_nodes_command, **common)
    return release_held(client, [q for q in queue if held_for_loop(q)], actor=actor, **common)


def hand_back(
    client: SlurmClient,
    lease_path: str | os.PathLike[str],
    lease: Lease,
    recorder: Recorder,
    *,
    actor: str,
    logger: logging.Logger,
    grace_s: float = 2.0,
    sleep: Callable[[float], None] = time.sleep,
) -> list[int]:
    """Give the partitions back to Slurm: mark the lease releasing (job_submit.lua holds
    nothing new), sweep, wait ``grace_s`` for a submission that read the lease before, sweep
    again, mark it released. Raises ``SlurmError`` with the lease left ``releasing``."""
    write_lease(lease_path, replace(lease, state="releasing", held=()))
    released = sweep(client, lease, recorder, actor=actor, logger=logger)
    sleep(grace_s)
    released += sweep(client, lease, recorder, actor=actor, logger=logger, untag=released)
    write_lease(lease_path, replace(lease, state="released", held=()))
    log_event(logger, "lease_released", actor=actor, released=released)
    return released
