"""Accounting ingest: idempotent upserts, settled-wins, rejects, atomicity, windows."""

from __future__ import annotations

import dataclasses
import json

import duckdb
import pytest

import linkwise.datasets.ingest as ingest_mod
from linkwise.cluster.slurm.records import JobRun, NodeInfo
from linkwise.datasets.ingest import (
    get_watermark,
    ingest_job_runs,
    ingest_nodes,
    next_window_start,
    runs_frame,
    set_watermark,
    windows,
)
from linkwise.datasets.store import open_store, scalar

BASE = JobRun(
    cluster="c1",
    job_id=101,
    run_index=0,
    name="train ;$(rm -rf /) `x` 日本",
    user="alice",
    account="ml",
    partition="gpu",
    state="COMPLETED",
    exit_code=0,
    signal=None,
    submit_time=1000.0,
    start_time=1010.0,
    end_time=2010.0,
    time_limit_s=3600.0,
    nodes=("gpu01", "gpu02"),
    gpus=8,
    gpus_per_node=(4, 4),
    allocation_nodes=2,
    settled=True,
)


def _store() -> duckdb.DuckDBPyConnection:
    return open_store(":memory:")


def _count(con: duckdb.DuckDBPyConnection, table: str) -> int:
    return int(str(scalar(con, f"SELECT count(*) FROM {table}")))


def _job(con: duckdb.DuckDBPyConnection, job_id: int, run_index: int = 0) -> dict[str, object]:
    cur = con.execute("SELECT * FROM jobs WHERE job_id = ? AND run_index = ?", [job_id, run_index])
    cols = [d[0] for d in cur.description or ()]
    rows = cur.fetchall()
    assert len(rows) == 1
    return dict(zip(cols, rows[0], strict=True))


def _nodes(con: duckdb.DuckDBPyConnection, job_id: int) -> list[tuple[object, ...]]:
    return con.execute(
        "SELECT node, gpus FROM job_nodes WHERE job_id = ? ORDER BY node", [job_id]
    ).fetchall()


def test_insert_then_reingest_is_a_no_op() -> None:
    con = _store()
    runs = [
        BASE,
        dataclasses.replace(BASE, job_id=102, nodes=("gpu03",), gpus=1, gpus_per_node=(1,)),
    ]
    first = ingest_job_runs(con, runs, source="sacct")
    assert (first.inserted, first.updated, first.rejected) == (2, 0, 0)
    assert first.job_node_rows == 3
    again = ingest_job_runs(con, runs, source="sacct")
    assert (again.inserted, again.updated, again.unchanged) == (0, 0, 2)
    assert _count(con, "jobs") == 2 and _count(con, "job_nodes") == 3
    row = _job(con, 101)
    assert row["name"] == BASE.name  # metacharacters and unicode untouched
    assert row["nodes"] == ["gpu01", "gpu02"] and row["gpus_per_node"] == [4, 4]
    assert row["user_name"] == "alice" and row["partition_name"] == "gpu"
    assert _nodes(con, 101) == [("gpu01", 4), ("gpu02", 4)]


def test_settled_replaces_unsettled_but_never_the_reverse() -> None:
    con = _store()
    transient = dataclasses.replace(
        BASE,
        state="COMPLETED",
        nodes=("gpu01",),
        gpus_per_node=(8,),
        allocation_nodes=0,
        settled=False,
    )
    ingest_job_runs(con, [transient], source="sacct")
    assert _nodes(con, 101) == [("gpu01", 8)]
    rep = ingest_job_runs(con, [BASE], source="sacct")
    assert rep.updated == 1
    assert _job(con, 101)["settled"] is True
    assert _nodes(con, 101) == [("gpu01", 4), ("gpu02", 4)]  # job_nodes replaced
    rep = ingest_job_runs(con, [transient], source="sacct")
    assert (rep.kept_settled, rep.updated) == (1, 0)
    assert _job(con, 101)["allocation_nodes"] == 2
    assert _nodes(con, 101) == [("gpu01", 4), ("gpu02", 4)]


def test_settled_record_can_be_corrected_by_a_later_settled_one() -> None:
    con = _store()
    ingest_job_runs(con, [BASE], source="sacct")
    fixed = dataclasses.replace(BASE, state="FAILED", exit_code=3)
    assert ingest_job_runs(con, [fixed], source="sacct").updated == 1
    row = _job(con, 101)
    assert (row["state"], row["exit_code"]) == ("FAILED", 3)


def test_requeued_runs_are_separate_rows_and_batch_duplicates_collapse() -> None:
    con = _store()
    run0 = dataclasses.replace(BASE, state="REQUEUED", end_time=1500.0)
    run1 = dataclasses.replace(BASE, run_index=1, submit_time=1500.0, start_time=1600.0)
    unsettled1 = dataclasses.replace(run1, settled=False, allocation_nodes=0)
    rep = ingest_job_runs(con, [run0, run1, unsettled1], source="sacct")
    assert (rep.inserted, rep.duplicates) == (2, 1)
    assert _job(con, 101, 1)["settled"] is True  # the settled duplicate won
    assert _job(con, 101, 0)["state"] == "REQUEUED"


def test_malformed_records_are_rejected_with_reasons() -> None:
    con = _store()
    bad = [
        dataclasses.replace(BASE, job_id=201, end_time=1000.0),  # ends before it starts
        dataclasses.replace(BASE, job_id=202, gpus=-1),
        dataclasses.replace(BASE, job_id=203, gpus_per_node=(4,)),  # 2 nodes, 1 count
        dataclasses.replace(BASE, job_id=204, gpus_per_node=(4, -4)),
    ]
    rep = ingest_job_runs(con, [BASE, *bad], source="sacct")
    assert rep.inserted == 1 and rep.rejected == 4
    assert dict(rep.rejected_reasons) == {
        "end_time before start_time": 1,
        "negative gpus": 1,
        "nodes and gpus_per_node differ in length": 1,
        "negative gpus_per_node": 1,
    }
    rows = con.execute("SELECT source, raw, reason FROM rejected_rows ORDER BY raw").fetchall()
    assert len(rows) == 4 and {r[0] for r in rows} == {"sacct"}
    raw = json.loads(rows[0][1])
    assert raw["job_id"] == 201 and raw["name"] == BASE.name
    assert _count(con, "jobs") == 1


def test_failure_mid_batch_leaves_store_unchanged(monkeypatch: pytest.MonkeyPatch) -> None:
    con = _store()
    ingest_job_runs(con, [BASE], source="sacct", watermark=5.0)
    before = con.execute("SELECT * FROM jobs ORDER BY job_id").fetchall()
    nodes_before = con.execute("SELECT * FROM job_nodes ORDER BY node").fetchall()

    def boom(con: duckdb.DuckDBPyConnection, changed: object) -> int:
        raise RuntimeError("disk full")

    monkeypatch.setattr(ingest_mod, "_replace_job_nodes", boom)
    batch = [
        dataclasses.replace(BASE, state="FAILED", exit_code=1),  # an update
        dataclasses.replace(BASE, job_id=300),  # an insert
        dataclasses.replace(BASE, job_id=301, gpus=-2),  # a reject
    ]
    with pytest.raises(RuntimeError, match="disk full"):
        ingest_job_runs(con, batch, source="sacct", watermark=9.0)
    assert con.execute("SELECT * FROM jobs ORDER BY job_id").fetchall() == before
    assert con.execute("SELECT * FROM job_nodes ORDER BY node").fetchall() == nodes_before
    assert _count(con, "rejected_rows") == 0
    assert get_watermark(con, "sacct") == 5.0
    monkeypatch.undo()
    rep = ingest_job_runs(con, batch, source="sacct", watermark=9.0)  # the store still works
    assert (rep.inserted, rep.updated, rep.rejected) == (1, 1, 1)
    assert get_watermark(con, "sacct") == 9.0


def test_runs_frame_is_columnar_and_typed() -> None:
    df = runs_frame(
        [BASE, dataclasses.replace(BASE, job_id=7, exit_code=None, nodes=(), gpus_per_node=())]
    )
    assert df.height == 2
    assert df["nodes"].to_list() == [["gpu01", "gpu02"], []]
    assert df["exit_code"].to_list() == [0, None]
    assert runs_frame([]).height == 0


def test_windows_overlap_and_cover_the_range() -> None:
    w = windows(0.0, 250.0, 100.0, 20.0)
    assert w == ((0.0, 100.0), (80.0, 180.0), (160.0, 250.0))
    assert windows(5.0, 5.0, 10.0, 1.0) == ()
    with pytest.raises(ValueError):
        windows(0.0, 10.0, 5.0, 5.0)
    assert next_window_start(None, 60.0, default=123.0) == 123.0
    assert next_window_start(1000.0, 60.0, default=123.0) == 940.0


def test_overlapping_windows_converge_without_duplicates() -> None:
    """Collect two overlapping windows; the overlap re-delivers a record now settled."""
    con = _store()
    early = dataclasses.replace(
        BASE, settled=False, allocation_nodes=0, end_time=None, state="RUNNING"
    )
    other = dataclasses.replace(BASE, job_id=102)
    ingest_job_runs(con, [early], source="sacct", watermark=100.0)
    ingest_job_runs(con, [BASE, other], source="sacct", watermark=200.0)
    assert _count(con, "jobs") == 2
    assert _job(con, 101)["state"] == "COMPLETED"
    assert get_watermark(con, "sacct") == 200.0


def test_watermarks_and_nodes() -> None:
    con = _store()
    assert get_watermark(con, "rest") is None
    set_watermark(con, "rest", 10.0)
    set_watermark(con, "rest", 8.0)
    assert get_watermark(con, "rest") == 8.0
    nodes = [
        NodeInfo("gpu01", "IDLE", ("gpu",), 32, 4, 0),
        NodeInfo("gpu02", "MIXED", ("gpu", "debug"), 32, 4, 2),
    ]
    assert ingest_nodes(con, "c1", nodes) == 2
    ingest_nodes(con, "c1", [dataclasses.replace(nodes[1], gpus_used=4, state="ALLOCATED")])
    rows = con.execute(
        "SELECT node, state, gpus_total, gpus_used, partitions FROM nodes ORDER BY node"
    ).fetchall()
    assert rows == [
        ("gpu01", "IDLE", 4, 0, ["gpu"]),
        ("gpu02", "ALLOCATED", 4, 4, ["gpu", "debug"]),
    ]


def test_impossible_records_are_rejected_one_by_one_and_the_rest_stored() -> None:
    from linkwise.cluster.slurm.records import RejectedRecord
    from linkwise.datasets.ingest import ClusterLimits

    con = _store()
    many = tuple(f"gpu{i:07d}" for i in range(1, 1001))
    bad = [
        dataclasses.replace(BASE, job_id=401, gpus=20, gpus_per_node=(10, 10)),  # > 16 GPUs
        dataclasses.replace(BASE, job_id=402, nodes=many, gpus=0, gpus_per_node=(0,) * 1000),
        dataclasses.replace(BASE, job_id=403, submit_time=-5.0),
        dataclasses.replace(BASE, job_id=404, start_time=-1.0, end_time=10.0),
        dataclasses.replace(BASE, job_id=405, gpus=2_000_000, gpus_per_node=(10**6, 10**6)),
        dataclasses.replace(BASE, job_id=408, gpus=5_000_000_000),
        dataclasses.replace(BASE, job_id=2**70),
        dataclasses.replace(BASE, job_id=406, name=b"\xff"),  # type: ignore[arg-type]
        dataclasses.replace(BASE, job_id=407, exit_code=2**40),
    ]
    parsed = RejectedRecord("abc", "job_id", "job_id is not an integer", '{"job_id": "abc"}')
    rep = ingest_job_runs(
        con,
        [BASE, *bad],
        source="sacct",
        watermark=50.0,
        rejected=(parsed,),
        limits=ClusterLimits(nodes=4, gpus=16),
    )
    assert (rep.inserted, rep.rejected) == (1, 10)
    assert get_watermark(con, "sacct") == 50.0
    rows = con.execute(
        "SELECT job_id, field, reason FROM rejected_rows ORDER BY rejected_at, job_id"
    ).fetchall()
    assert sorted(rows, key=str) == sorted(
        [
            ("401", "gpus", "more GPUs than the cluster has"),
            ("402", "nodes", "more nodes than the cluster has"),
            ("403", "submit_time", "negative submit_time"),
            ("404", "start_time", "negative start_time"),
            ("405", "gpus", "absurd GPU count"),
            ("408", "gpus", "gpus out of range"),
            (str(2**70), "job_id", "job_id out of range"),
            ("406", "name", "name missing or of the wrong type"),
            ("407", "exit_code", "exit_code out of range"),
            ("abc", "job_id", "job_id is not an integer"),
        ],
        key=str,
    )
    assert _count(con, "jobs") == 1 and _count(con, "job_nodes") == 2
    assert dict(rep.rejected_reasons)["more GPUs than the cluster has"] == 1


def test_a_reused_job_id_keeps_both_jobs() -> None:
    """Issue 21 (9): after Slurm's state is cleared job ids restart, and sacct lists the old
    and the new job 1: both are kept (they differ in submit time), each with its nodes."""
    con = _store()
    old = dataclasses.replace(BASE, job_id=1)
    ingest_job_runs(con, [old], source="sacct")
    new = dataclasses.replace(
        BASE,
        job_id=1,
        name="new job",
        submit_time=90000.0,
        start_time=90010.0,
        end_time=90100.0,
        nodes=("gpu03",),
        gpus=1,
        gpus_per_node=(1,),
        allocation_nodes=1,
    )
    rep = ingest_job_runs(con, [old, new], source="sacct")
    assert (rep.inserted, rep.updated, rep.unchanged) == (1, 0, 1)
    rows = con.execute(
        "SELECT name, submit_time, nodes FROM jobs WHERE job_id = 1 ORDER BY submit_time"
    ).fetchall()
    assert rows == [(BASE.name, 1000.0, ["gpu01", "gpu02"]), ("new job", 90000.0, ["gpu03"])]
    assert con.execute(
        "SELECT submit_time, node FROM job_nodes WHERE job_id = 1 ORDER BY ALL"
    ).fetchall() == [(1000.0, "gpu01"), (1000.0, "gpu02"), (90000.0, "gpu03")]


def test_in_one_batch_the_settled_record_wins_over_a_stale_running_one() -> None:
    """Issue 21 (9): one run listed twice in a batch, settled and stale RUNNING (either
    order): the settled record is stored, the stale one counted as a duplicate."""
    stale = dataclasses.replace(
        BASE, state="RUNNING", end_time=None, exit_code=None, settled=False, allocation_nodes=0
    )
    for batch in ([BASE, stale], [stale, BASE]):
        con = _store()
        rep = ingest_job_runs(con, batch, source="sacct")
        assert (rep.inserted, rep.duplicates) == (1, 1)
        row = _job(con, 101)
        assert (row["state"], row["settled"], row["end_time"]) == ("COMPLETED", True, 2010.0)


def test_requeued_records_of_one_submit_time_collapse_to_one() -> None:
    """Issue 21 (9): the key gained the submit time; records of one run (same id, same
    submit time, same run index) listed several times still collapse to one row."""
    con = _store()
    pending = dataclasses.replace(
        BASE, state="PENDING", start_time=None, end_time=None, exit_code=None, nodes=(),
        gpus_per_node=(), allocation_nodes=0,
    )  # fmt: skip
    rep = ingest_job_runs(con, [pending, BASE, BASE], source="sacct")
    assert (rep.inserted, rep.duplicates) == (1, 2)
    assert _count(con, "jobs") == 1 and _job(con, 101)["state"] == "COMPLETED"
    assert ingest_job_runs(con, [BASE], source="sacct").unchanged == 1


def test_readers_of_the_jobs_table_tell_a_reused_id_apart() -> None:
    """Issue 21 (9): the readers of ``jobs`` (the runs for rollouts and the log builder's
    replay) see two jobs where Slurm reused an id, each with its own allocation and id."""
    from linkwise.datasets.log_jobs import load_log_jobs, topology_from_store
    from linkwise.datasets.rollouts import runs_from_store

    con = _store()
    ingest_nodes(
        con,
        "c1",
        [NodeInfo(f"gpu0{i}", "idle", ("gpu",), 32, 4, 0) for i in (1, 2, 3)],
    )
    run0 = dataclasses.replace(BASE, job_id=1, state="REQUEUED", end_time=1500.0)
    run1 = dataclasses.replace(BASE, job_id=1, run_index=1, submit_time=1500.0, start_time=1600.0)
    reused = dataclasses.replace(
        BASE, job_id=1, submit_time=9000.0, start_time=9010.0, end_time=9110.0,
        nodes=("gpu03",), gpus=2, gpus_per_node=(2,), allocation_nodes=1,
    )  # fmt: skip
    ingest_job_runs(con, [run0, run1, reused], source="sacct")
    runs = runs_from_store(con, cluster="c1").sort("submit_time")
    assert runs["submit_time"].to_list() == [1000.0, 9000.0]
    assert runs["duration"].to_list() == [490.0 + 410.0, 100.0]  # the requeued runs summed
    assert runs["num_gpus"].to_list() == [8, 2]
    assert runs["job_id"].n_unique() == 2 and runs["job_id"][0] == 1
    log, skipped = load_log_jobs(con, topology_from_store(con, "c1"), "c1")
    assert skipped == {}
    log = log.sort("submit")
    assert log["slurm_job_id"].to_list() == [1, 1, 1]
    assert log["job_id"].n_unique() == 3 and log["job_id"][0] == 1
    assert log["alloc_gpus"].to_list() == [[4, 4], [4, 4], [2]]
