"""The DuckDB store: schema, migrations, version checks."""

from __future__ import annotations

from pathlib import Path

import duckdb
import pytest

from linkwise.datasets.store import (
    MIGRATIONS,
    SCHEMA_VERSION,
    Migration,
    StoreVersionError,
    apply_migrations,
    open_store,
    scalar,
    schema_version,
)

TABLES = {
    "schema_version",
    "jobs",
    "job_nodes",
    "nodes",
    "telemetry_samples",
    "link_load",
    "rejected_rows",
    "ingest_state",
    "decisions",
    "audit",
    "job_telemetry",
}


def _tables(con: duckdb.DuckDBPyConnection) -> set[str]:
    rows = con.execute(
        "SELECT table_name FROM information_schema.tables WHERE table_schema = 'main'"
    ).fetchall()
    return {r[0] for r in rows}


def test_open_creates_every_table_and_is_idempotent(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "store.duckdb"
    con = open_store(path)
    assert _tables(con) == TABLES
    assert schema_version(con) == SCHEMA_VERSION
    con.execute("INSERT INTO ingest_state VALUES ('x', 1.0, 2.0)").fetchall()
    con.close()
    con = open_store(path)  # reopening applies nothing and keeps the data
    assert scalar(con, "SELECT count(*) FROM schema_version") == len(MIGRATIONS)
    assert scalar(con, "SELECT watermark FROM ingest_state WHERE source = 'x'") == 1.0
    assert apply_migrations(con) == ()
    con.close()


def test_newer_store_is_refused_clearly(tmp_path: Path) -> None:
    path = tmp_path / "store.duckdb"
    con = open_store(path)
    con.execute("INSERT INTO schema_version (version, description) VALUES (99, 'future')")
    con.close()
    with pytest.raises(StoreVersionError, match="99 is newer"):
        open_store(path)


def test_failed_migration_leaves_previous_version(tmp_path: Path) -> None:
    con = open_store(tmp_path / "s.duckdb")
    broken = Migration(
        SCHEMA_VERSION + 1,
        "broken",
        ("CREATE TABLE half_done (a INTEGER)", "THIS IS NOT SQL"),
    )
    with pytest.raises(duckdb.Error):
        apply_migrations(con, (*MIGRATIONS, broken))
    assert schema_version(con) == SCHEMA_VERSION
    assert "half_done" not in _tables(con)
    good = Migration(SCHEMA_VERSION + 1, "ok", ("CREATE TABLE extra (a INTEGER)",))
    assert apply_migrations(con, (*MIGRATIONS, good)) == (SCHEMA_VERSION + 1,)
    assert schema_version(con) == SCHEMA_VERSION + 1


def test_link_load_checks_its_domain() -> None:
    con = open_store(":memory:")
    with pytest.raises(duckdb.ConstraintException):
        con.execute(
            "INSERT INTO link_load VALUES (0, 1, '', 'n', 'd', 'wifi', 'tx', 1.0, 's')"
        ).fetchall()
    with pytest.raises(duckdb.ConstraintException):
        con.execute(
            "INSERT INTO link_load VALUES (0, 1, '', 'n', 'd', 'ib', 'tx', -1.0, 's')"
        ).fetchall()


def test_migration_versions_must_increase() -> None:
    con = duckdb.connect(":memory:")
    with pytest.raises(ValueError, match="increasing"):
        apply_migrations(con, (Migration(2, "a", ()), Migration(1, "b", ())))


def test_the_job_key_migration_keeps_every_row(tmp_path: Path) -> None:
    """Issue 21 (9): a store of the old key (cluster, job id, run index) moves to the new one
    (submit time too) with every jobs and job_nodes row kept; a reused id then fits beside."""
    path = tmp_path / "old.duckdb"
    old = duckdb.connect(str(path))
    key_migration = next(m.version for m in MIGRATIONS if "submit time" in m.description)
    apply_migrations(old, [m for m in MIGRATIONS if m.version < key_migration])
    row = "('c', {id}, {run}, 'n', 'u', 'a', 'p', 'COMPLETED', 0, NULL, {sub}, {sub} + 1, "
    row += "{sub} + 9, 60.0, ['g1', 'g2'], 2, [1, 1], 2, true, NULL, NULL, '', 's', 1.0)"
    for job_id, run, sub in ((1, 0, 10.0), (1, 1, 20.0), (2, 0, 30.0)):
        old.execute(f"INSERT INTO jobs VALUES {row.format(id=job_id, run=run, sub=sub)}")
        for node in ("g1", "g2"):
            old.execute(f"INSERT INTO job_nodes VALUES ('c', {job_id}, {run}, '{node}', 1)")
    old.close()
    con = open_store(path)
    assert schema_version(con) == SCHEMA_VERSION
    assert con.execute(
        "SELECT job_id, run_index, submit_time FROM jobs ORDER BY ALL"
    ).fetchall() == [(1, 0, 10.0), (1, 1, 20.0), (2, 0, 30.0)]
    nodes = con.execute(
        "SELECT job_id, submit_time, run_index, node, gpus FROM job_nodes ORDER BY ALL"
    ).fetchall()
    assert nodes == [
        (j, s, r, n, 1)
        for j, r, s in ((1, 0, 10.0), (1, 1, 20.0), (2, 0, 30.0))
        for n in ["g1", "g2"]
    ]
    # the new key: job 1 again, submitted later, is a row of its own
    con.execute(f"INSERT INTO jobs VALUES {row.format(id=1, run=0, sub=500.0)}")
    assert scalar(con, "SELECT count(*) FROM jobs WHERE job_id = 1") == 3
    with pytest.raises(duckdb.ConstraintException):
        con.execute(f"INSERT INTO jobs VALUES {row.format(id=1, run=0, sub=500.0)}")
