"""The DuckDB store: one file, a versioned schema, and the connection helper.

``open_store(path)`` opens (or creates) the file and applies the migrations it lacks, each
in its own transaction together with its ``schema_version`` row, so a crash mid-migration
leaves the previous version intact. A store written by a newer linkwise is refused.

Times are epoch seconds (DOUBLE), rates bytes per second, like the rest of linkwise.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import duckdb


@dataclass(frozen=True, slots=True)
class Migration:
    """One schema step: its version, a one-line description and its SQL statements."""

    version: int
    description: str
    statements: tuple[str, ...]


class StoreVersionError(RuntimeError):
    """The store's schema is newer than this code knows (or its version table is broken)."""


class StoreLockedError(RuntimeError):
    """Another process holds the store's file (DuckDB lets one process write a file)."""


_V1 = (
    """CREATE TABLE jobs (
        cluster VARCHAR NOT NULL,
        job_id BIGINT NOT NULL,
        run_index INTEGER NOT NULL,
        name VARCHAR NOT NULL,
        user_name VARCHAR NOT NULL,
        account VARCHAR NOT NULL,
        partition_name VARCHAR NOT NULL,
        state VARCHAR NOT NULL,
        exit_code INTEGER,
        signal INTEGER,
        submit_time DOUBLE NOT NULL,
        start_time DOUBLE,
        end_time DOUBLE,
        time_limit_s DOUBLE,
        nodes VARCHAR[] NOT NULL,
        gpus INTEGER NOT NULL,
        gpus_per_node INTEGER[] NOT NULL,
        allocation_nodes INTEGER NOT NULL,
        settled BOOLEAN NOT NULL,
        array_job_id BIGINT,
        array_task_id INTEGER,
        comment VARCHAR NOT NULL,
        source VARCHAR NOT NULL,
        ingested_at DOUBLE NOT NULL,
        PRIMARY KEY (cluster, job_id, run_index)
    )""",
    """CREATE TABLE job_nodes (
        cluster VARCHAR NOT NULL,
        job_id BIGINT NOT NULL,
        run_index INTEGER NOT NULL,
        node VARCHAR NOT NULL,
        gpus INTEGER NOT NULL,
        PRIMARY KEY (cluster, job_id, run_index, node)
    )""",
    """CREATE TABLE nodes (
        cluster VARCHAR NOT NULL,
        node VARCHAR NOT NULL,
        state VARCHAR NOT NULL,
        partitions VARCHAR[] NOT NULL,
        cpus INTEGER NOT NULL,
        gpus_total INTEGER NOT NULL,
        gpus_used INTEGER NOT NULL,
        updated_at DOUBLE NOT NULL,
        PRIMARY KEY (cluster, node)
    )""",
    """CREATE TABLE telemetry_samples (
        ts DOUBLE NOT NULL,
        host VARCHAR,
        source VARCHAR NOT NULL,
        metric VARCHAR NOT NULL,
        labels JSON NOT NULL,
        value DOUBLE NOT NULL,
        job VARCHAR
    )""",
    """CREATE TABLE link_load (
        ts DOUBLE NOT NULL,
        interval_s DOUBLE NOT NULL,
        cluster VARCHAR NOT NULL DEFAULT '',
        node VARCHAR NOT NULL,
        device VARCHAR NOT NULL,
        link_class VARCHAR NOT NULL CHECK (link_class IN ('nvlink', 'pcie', 'ib', 'eth')),
        direction VARCHAR NOT NULL CHECK (direction IN ('tx', 'rx', 'total')),
        bytes_per_s DOUBLE NOT NULL CHECK (bytes_per_s >= 0),
        source VARCHAR NOT NULL,
        PRIMARY KEY (cluster, node, device, link_class, direction, ts)
    )""",
    """CREATE TABLE rejected_rows (
        source VARCHAR NOT NULL,
        raw VARCHAR NOT NULL,
        reason VARCHAR NOT NULL,
        rejected_at DOUBLE NOT NULL
    )""",
    """CREATE TABLE ingest_state (
        source VARCHAR PRIMARY KEY,
        watermark DOUBLE NOT NULL,
        updated_at DOUBLE NOT NULL
    )""",
)

# Telemetry labels as plain VARCHAR: DuckDB's JSON functions (labels->>'key') read it just
# the same, and inserts skip validating every row as JSON (about 0.3 s per 1M samples).
_V2 = ("ALTER TABLE telemetry_samples ALTER COLUMN labels SET DATA TYPE VARCHAR",)

# The live loop (deployer/): one row per decision of every cycle (shadow or active), joined
# later with what Slurm did (actual_*), and the audit of every action before it is applied.
_V3 = (
    """CREATE TABLE decisions (
        decision_id VARCHAR PRIMARY KEY,
        run_id VARCHAR NOT NULL,
        cycle_id BIGINT NOT NULL,
        ts DOUBLE NOT NULL,
        mode VARCHAR NOT NULL CHECK (mode IN ('shadow', 'active')),
        cluster VARCHAR NOT NULL,
        partition VARCHAR NOT NULL,
        policy VARCHAR NOT NULL,
        model_version VARCHAR NOT NULL,
        obs_spec_version VARCHAR NOT NULL,
        job_id BIGINT,
        action VARCHAR NOT NULL CHECK (action IN ('start', 'wait')),
        nodes VARCHAR NOT NULL,
        gpus INTEGER NOT NULL,
        latency_ms DOUBLE NOT NULL,
        n_pending INTEGER NOT NULL,
        note VARCHAR NOT NULL,
        actual_start DOUBLE,
        actual_nodes VARCHAR,
        joined_at DOUBLE
    )""",
    """CREATE TABLE audit (
        audit_id VARCHAR PRIMARY KEY,
        ts DOUBLE NOT NULL,
        run_id VARCHAR NOT NULL,
        cycle_id BIGINT NOT NULL,
        actor VARCHAR NOT NULL,
        job_id BIGINT NOT NULL,
        command VARCHAR NOT NULL,
        model_version VARCHAR NOT NULL,
        outcome VARCHAR NOT NULL,
        outcome_ts DOUBLE
    )""",
)

# Rejected rows say which job (as written, when readable) and which field was at fault.
_V4 = (
    "ALTER TABLE rejected_rows ADD COLUMN job_id VARCHAR",
    "ALTER TABLE rejected_rows ADD COLUMN field VARCHAR",
)

# Why each decision (deployer/explain.py): whether the policy deviated from its base, and the
# explanation recorded at decision time (JSON text: chosen row, runner-up, scores, the base's
# choice, predicted slowdowns, the guard's reason).
_V_EXPLAIN = (
    "ALTER TABLE decisions ADD COLUMN deviated BOOLEAN",
    "ALTER TABLE decisions ADD COLUMN explanation VARCHAR",
)

# Job ids restart when Slurm's state is cleared (or across a slurmdbd purge): a run is keyed
# by its submit time too, so an old job 1 and a new job 1 are both kept. The tables are
# rebuilt with the new key and every row is kept (job_nodes takes its run's submit time).
_JOB_COLUMNS = (
    "cluster, job_id, run_index, name, user_name, account, partition_name, state, exit_code, "
    "signal, submit_time, start_time, end_time, time_limit_s, nodes, gpus, gpus_per_node, "
    "allocation_nodes, settled, array_job_id, array_task_id, comment, source, ingested_at"
)
_V_JOB_KEY = (
    _V1[0]
    .replace("CREATE TABLE jobs (", "CREATE TABLE jobs_keyed (")
    .replace(
        "PRIMARY KEY (cluster, job_id, run_index)",
        "PRIMARY KEY (cluster, job_id, submit_time, run_index)",
    ),
    f"INSERT INTO jobs_keyed ({_JOB_COLUMNS}) SELECT {_JOB_COLUMNS} FROM jobs",
    """CREATE TABLE job_nodes_keyed (
        cluster VARCHAR NOT NULL,
        job_id BIGINT NOT NULL,
        submit_time DOUBLE NOT NULL,
        run_index INTEGER NOT NULL,
        node VARCHAR NOT NULL,
        gpus INTEGER NOT NULL,
        PRIMARY KEY (cluster, job_id, submit_time, run_index, node)
    )""",
    "INSERT INTO job_nodes_keyed (cluster, job_id, submit_time, run_index, node, gpus) "
    "SELECT n.cluster, n.job_id, j.submit_time, n.run_index, n.node, n.gpus "
    "FROM job_nodes AS n JOIN jobs AS j USING (cluster, job_id, run_index)",
    "DROP TABLE job_nodes",
    "DROP TABLE jobs",
    "ALTER TABLE jobs_keyed RENAME TO jobs",
    "ALTER TABLE job_nodes_keyed RENAME TO job_nodes",
)

# Per-job telemetry (datasets/job_telemetry.py): link bytes and GPU activity attributed to one
# run of a job by ``ATTRIBUTION_RULE``, with the samples used, shared, at an edge, bad and
# missing; derived from link_load, telemetry_samples and the accounting, rebuilt at will.
_V_JOB_TELEMETRY = (
    """CREATE TABLE job_telemetry (
        cluster VARCHAR NOT NULL,
        job_id BIGINT NOT NULL,
        submit_time DOUBLE NOT NULL,
        run_index INTEGER NOT NULL,
        name VARCHAR NOT NULL,
        user_name VARCHAR NOT NULL,
        gpus INTEGER NOT NULL,
        nodes INTEGER NOT NULL,
        start_time DOUBLE NOT NULL,
        end_time DOUBLE NOT NULL,
        interval_s DOUBLE NOT NULL,
        nvlink_bytes DOUBLE NOT NULL,
        nvlink_gpu_s DOUBLE NOT NULL,
        pcie_bytes DOUBLE NOT NULL,
        pcie_gpu_s DOUBLE NOT NULL,
        ib_bytes DOUBLE NOT NULL,
        ib_gpu_s DOUBLE NOT NULL,
        ib_node_s DOUBLE NOT NULL,
        eth_bytes DOUBLE NOT NULL,
        eth_gpu_s DOUBLE NOT NULL,
        eth_node_s DOUBLE NOT NULL,
        nvlink_bytes_per_gpu_s DOUBLE,
        pcie_bytes_per_gpu_s DOUBLE,
        ib_bytes_per_gpu_s DOUBLE,
        eth_bytes_per_gpu_s DOUBLE,
        activity_alone DOUBLE,
        activity_alone_gpu_s DOUBLE NOT NULL,
        activity_beside DOUBLE,
        activity_beside_gpu_s DOUBLE NOT NULL,
        link_used INTEGER NOT NULL,
        link_shared INTEGER NOT NULL,
        link_edge INTEGER NOT NULL,
        link_missing INTEGER NOT NULL,
        activity_used INTEGER NOT NULL,
        activity_shared INTEGER NOT NULL,
        activity_bad INTEGER NOT NULL,
        activity_missing INTEGER NOT NULL,
        built_at DOUBLE NOT NULL,
        PRIMARY KEY (cluster, job_id, submit_time, run_index)
    )""",
)

# A rejected accounting record is kept once per (source, job id, field, reason, raw): a read
# that rejects it again counts it (``seen``, ``last_seen``), and a later read that stores
# its job resolves it (``resolved_at``); datasets/ingest.py, pipelines/collect_accounting.py.
_V_REJECT_ONCE = (
    "ALTER TABLE rejected_rows ADD COLUMN seen INTEGER DEFAULT 1",
    "ALTER TABLE rejected_rows ADD COLUMN last_seen DOUBLE",
    "ALTER TABLE rejected_rows ADD COLUMN resolved_at DOUBLE",
    "UPDATE rejected_rows SET last_seen = rejected_at",
)

MIGRATIONS: tuple[Migration, ...] = (
    Migration(1, "jobs, job_nodes, nodes, telemetry, link_load, rejected_rows, ingest_state", _V1),
    Migration(2, "telemetry_samples.labels as VARCHAR (JSON text, not validated)", _V2),
    Migration(3, "decisions and audit of the live loop", _V3),
    Migration(4, "rejected_rows.job_id and rejected_rows.field", _V4),
    Migration(5, "decisions.deviated and decisions.explanation", _V_EXPLAIN),
    Migration(6, "jobs and job_nodes keyed by submit time too (job ids are reused)", _V_JOB_KEY),
    Migration(7, "job_telemetry: per-job link bytes and GPU activity", _V_JOB_TELEMETRY),
    Migration(8, "rejected_rows kept once: seen, last_seen, resolved_at", _V_REJECT_ONCE),
)
SCHEMA_VERSION = MIGRATIONS[-1].version


def run_sql(
    con: duckdb.DuckDBPyConnection, sql: str, params: Sequence[object] | None = None
) -> None:
    """Execute a statement and consume its result (DuckDB 2.0 keeps unread results open)."""
    con.execute(sql, params).fetchall()


def scalar(
    con: duckdb.DuckDBPyConnection, sql: str, params: Sequence[object] | None = None
) -> object:
    """The first column of the first row of a query (None when it returns no row)."""
    rows = con.execute(sql, params).fetchall()
    return rows[0][0] if rows else None


def schema_version(con: duckdb.DuckDBPyConnection) -> int:
    """The store's schema version: 0 for an empty store."""
    has_table = scalar(
        con,
        "SELECT count(*) FROM information_schema.tables "
        "WHERE table_name = 'schema_version' AND table_schema = 'main'",
    )
    if not has_table:
        return 0
    version = scalar(con, "SELECT max(version) FROM schema_version")
    return int(str(version)) if version is not None else 0


def apply_migrations(
    con: duckdb.DuckDBPyConnection, migrations: Sequence[Migration] = MIGRATIONS
) -> tuple[int, ...]:
    """Apply the pending migrations, each in one transaction; return the versions applied.

    Raises StoreVersionError when the store is newer than ``migrations`` know.
    """
    versions = [m.version for m in migrations]
    if versions != sorted(set(versions)) or (versions and versions[0] < 1):
        raise ValueError(f"migration versions must be increasing from 1: {versions}")
    known = versions[-1] if versions else 0
    current = schema_version(con)
    if current > known:
        raise StoreVersionError(
            f"store schema version {current} is newer than this linkwise knows ({known}); "
            "upgrade linkwise or use a store written by this version"
        )
    applied: list[int] = []
    for m in migrations:
        if m.version <= current:
            continue
        con.begin()
        try:
            run_sql(
                con,
                "CREATE TABLE IF NOT EXISTS schema_version ("
                "version INTEGER PRIMARY KEY, description VARCHAR NOT NULL, "
                "applied_at TIMESTAMP NOT NULL DEFAULT current_timestamp)",
            )
            for stmt in m.statements:
                run_sql(con, stmt)
            run_sql(
                con,
                "INSERT INTO schema_version (version, description) VALUES (?, ?)",
                [m.version, m.description],
            )
            con.commit()
        except BaseException:
            con.rollback()
            raise
        applied.append(m.version)
    return tuple(applied)


def open_store(path: str | Path, *, lock_wait_s: float = 0.0) -> duckdb.DuckDBPyConnection:
    """Open (creating if needed) the DuckDB store at ``path`` and bring its schema up to date.

    ``":memory:"`` gives a private in-memory store. Idempotent: opening an up-to-date store
    changes nothing. A file another process holds is tried again for ``lock_wait_s``
    seconds, then refused with ``StoreLockedError``. Raises StoreVersionError for a store
    newer than this code.
    """
    target = str(path)
    if target != ":memory:":
        Path(target).parent.mkdir(parents=True, exist_ok=True)
    con = _connect(target, lock_wait_s)
    try:
        apply_migrations(con)
    except BaseException:
        con.close()
        raise
    return con


def _connect(target: str, lock_wait_s: float) -> duckdb.DuckDBPyConnection:
    """``duckdb.connect``, retried with backoff while another process holds the file."""
    deadline = time.monotonic() + max(lock_wait_s, 0.0)
    delay = 0.05
    while True:
        try:
            return duckdb.connect(target)
        except duckdb.IOException as exc:
            if "lock" not in str(exc).lower():
                raise
            left = deadline - time.monotonic()
            if left <= 0:
                held = str(exc).split("Conflicting lock is held in", 1)[-1].split(". See")[0]
                raise StoreLockedError(
                    f"{target} is locked by another process ({held.strip()}); tried for "
                    f"{lock_wait_s:g} s. DuckDB lets one process write a store: wait for it "
                    "to finish or stop it"
                ) from None
            time.sleep(min(delay, left))
            delay = min(delay * 2, 1.0)
