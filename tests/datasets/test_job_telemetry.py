"""Per-job telemetry (datasets/job_telemetry.py) on a real DuckDB store filled through the real
ingest functions with exporter text whose attribution is known (tests/_telemetry_truth.py).

The cluster: nodes n1, n2, n3 of 8 GPUs, scraped every 30 s from T0.
- job 1: GPUs 0-3 of n1 and of n2, [T0+10, T0+3010): alone on n1, on n2 alone until job 2;
- job 2: GPUs 4-7 of n2, [T0+1510, T0+4510): beside job 1 on n2 until T0+3010, then alone;
- job 3: GPUs 0-1 of n3, [T0+10, T0+3010): alone; one SM_ACTIVE sample bad (1.7), and two
  scrapes of n3 never happened.
"""

from __future__ import annotations

from pathlib import Path

import duckdb
import polars as pl
import pytest

from linkwise.datasets.job_telemetry import (
    ATTRIBUTION_RULE,
    build_job_telemetry,
    read_job_telemetry,
)
from linkwise.datasets.store import open_store, run_sql
from linkwise.tests._telemetry_truth import INTERVAL_S, T0, TruthJob, fill_store

NV1, NV2, NV3 = 2.0e9, 5.0e9, 1.0e9  # NVLink tx bytes/s per GPU
NIC1 = 3.0e9  # job 1's NIC tx bytes/s per node
A1, A2, A3 = 0.5, 0.8, 0.25
END = T0 + 4800.0
SKIPPED = frozenset({("n3", T0 + 600.0), ("n3", T0 + 630.0)})


def _jobs() -> list[TruthJob]:
    return [
        TruthJob(
            1,
            T0 + 10,
            T0 + 3010,
            {"n1": (0, 1, 2, 3), "n2": (0, 1, 2, 3)},
            A1,
            nvlink_tx=NV1,
            nic_tx=NIC1,
        ),
        TruthJob(2, T0 + 1510, T0 + 4510, {"n2": (4, 5, 6, 7)}, A2, nvlink_tx=NV2),
        TruthJob(
            3,
            T0 + 10,
            T0 + 3010,
            {"n3": (0, 1)},
            A3,
            nvlink_tx=NV3,
            bad={("n3", T0 + 900.0): 1.7},
        ),
    ]


def _store(tmp_path: Path, *, labelled: bool) -> duckdb.DuckDBPyConnection:
    con = open_store(tmp_path / "store.duckdb")
    fill_store(con, _jobs(), nodes=["n1", "n2", "n3"], until=END, labelled=labelled, skip=SKIPPED)
    return con


def _rows(con: duckdb.DuckDBPyConnection) -> dict[int, dict[str, object]]:
    return {int(r["job_id"]): r for r in read_job_telemetry(con).iter_rows(named=True)}


@pytest.fixture(scope="module")
def unlabelled(tmp_path_factory: pytest.TempPathFactory) -> duckdb.DuckDBPyConnection:
    con = _store(tmp_path_factory.mktemp("unlabelled"), labelled=False)
    yield con
    con.close()


def test_alone_gets_everything_shared_and_edges_are_counted_not_split(
    unlabelled: duckdb.DuckDBPyConnection,
) -> None:
    report = build_job_telemetry(unlabelled, interval_s=INTERVAL_S, now=0.0)
    assert report.built == 3 and report.with_telemetry == 3 and report.waiting == 0
    assert report.rule == ATTRIBUTION_RULE
    rows = _rows(unlabelled)
    j1, j2, j3 = rows[1], rows[2], rows[3]
    # job 1, InfiniBand: alone on n1 for the intervals starting T0+30 .. T0+2970 (99) and on
    # n2 for T0+30 .. T0+1470 (49); [T0, T0+30) and [T0+3000, T0+3030) are edges on n1, the
    # first an edge on n2 too; n2's intervals from T0+1500 to T0+3000 (51) are shared
    used_intervals = 99 + 49
    assert j1["ib_node_s"] == pytest.approx(used_intervals * INTERVAL_S)
    assert j1["ib_bytes"] == pytest.approx(2 * NIC1 * INTERVAL_S * used_intervals, rel=1e-9)
    assert j1["ib_bytes_per_gpu_s"] == pytest.approx(2 * NIC1 / 4, rel=1e-9)
    # NVLink on the same rule (no labels): every GPU of the node, idle ones read 0
    assert j1["nvlink_bytes_per_gpu_s"] == pytest.approx(2 * NV1, rel=1e-9)
    # counted in scrape intervals of one node and one exporter (DCGM's, node_exporter's)
    assert j1["link_used"] == 2 * used_intervals
    assert j1["link_edge"] == 2 * 3
    assert j1["link_shared"] == 2 * 51
    # activity: alone at 100 instants on n1 and 50 on n2, shared at the other 50 of n2
    assert j1["activity_alone"] == pytest.approx(A1)
    assert j1["activity_alone_gpu_s"] == pytest.approx(150 * 4 * INTERVAL_S)
    assert j1["activity_beside"] is None
    assert (j1["activity_used"], j1["activity_shared"], j1["activity_bad"]) == (150, 50, 0)
    assert j1["activity_missing"] == 0
    # job 2 on n2: shared until job 1 ends, then alone (T0+3030 .. T0+4470), an edge at the end
    assert j2["nvlink_bytes_per_gpu_s"] == pytest.approx(2 * NV2, rel=1e-9)
    assert j2["ib_bytes"] == pytest.approx(0.0)  # a one-node job: its NIC carried nothing
    assert (j2["link_used"], j2["link_shared"], j2["link_edge"]) == (2 * 49, 2 * 51, 2 * 1)
    assert j2["link_missing"] == 0
    assert j2["activity_alone"] == pytest.approx(A2)
    assert j2["activity_shared"] == 50
    # job 3: two scrapes missing, one instant bad (not used)
    assert j3["activity_bad"] == 1
    assert j3["activity_missing"] == 2
    assert j3["activity_used"] == 100 - 2 - 1
    assert j3["activity_alone"] == pytest.approx(A3)
    assert j3["link_missing"] == 2 * 2  # both exporters' scrapes
    assert j3["nvlink_bytes_per_gpu_s"] == pytest.approx(2 * NV3, rel=1e-9)
    counts = dict(report.counts)
    assert counts["activity_bad"] == 1 and counts["activity_missing"] == 2


def test_a_second_build_adds_nothing_and_a_rebuild_gives_the_same_rows(
    unlabelled: duckdb.DuckDBPyConnection,
) -> None:
    build_job_telemetry(unlabelled, interval_s=INTERVAL_S, now=0.0)
    before = read_job_telemetry(unlabelled)
    again = build_job_telemetry(unlabelled, interval_s=INTERVAL_S, now=1.0)
    assert again.built == 0
    rebuilt = build_job_telemetry(unlabelled, interval_s=INTERVAL_S, rebuild=True, now=0.0)
    assert rebuilt.built == 3
    after = read_job_telemetry(unlabelled)
    assert after.equals(before)


def test_only_runs_the_telemetry_has_passed_are_built(tmp_path: Path) -> None:
    con = open_store(tmp_path / "store.duckdb")
    jobs = _jobs()
    # telemetry up to T0+3600 only: job 2 (ends T0+4510) waits, jobs 1 and 3 are built
    fill_store(con, jobs, nodes=["n1", "n2", "n3"], until=T0 + 3600.0)
    first = build_job_telemetry(con, interval_s=INTERVAL_S, now=0.0)
    assert first.built == 2 and first.waiting == 1
    assert sorted(read_job_telemetry(con)["job_id"].to_list()) == [1, 3]
    # the rest of the telemetry arrives: only job 2 is new
    fill_store(con, [], nodes=["n1", "n2", "n3"], until=END)
    run_sql(con, "DELETE FROM link_load WHERE ts > ?", [END])
    second = build_job_telemetry(con, interval_s=INTERVAL_S, now=0.0)
    assert second.built == 1 and second.waiting == 0
    assert sorted(read_job_telemetry(con)["job_id"].to_list()) == [1, 2, 3]
    con.close()


def test_no_telemetry_builds_nothing(tmp_path: Path) -> None:
    con = open_store(tmp_path / "store.duckdb")
    report = build_job_telemetry(con, interval_s=INTERVAL_S)
    assert report.built == 0 and report.horizon is None
    assert read_job_telemetry(con).is_empty()
    con.close()


def test_labels_attribute_gpus_beside_other_jobs(tmp_path: Path) -> None:
    con = _store(tmp_path, labelled=True)
    build_job_telemetry(con, interval_s=INTERVAL_S, now=0.0)
    rows = _rows(con)
    j1, j2 = rows[1], rows[2]
    # with hpc_job labels, the GPUs on the shared node are each job's own: activity beside
    # the other job is measured, NVLink per GPU exact; the NIC stays shared (not split)
    assert j1["activity_beside"] == pytest.approx(A1)
    assert j2["activity_beside"] == pytest.approx(A2)
    assert j1["activity_shared"] == 0 and j2["activity_shared"] == 0
    assert j1["nvlink_bytes_per_gpu_s"] == pytest.approx(2 * NV1, rel=1e-9)
    assert j2["nvlink_bytes_per_gpu_s"] == pytest.approx(2 * NV2, rel=1e-9)
    assert j1["ib_node_s"] == pytest.approx((99 + 49) * INTERVAL_S)
    frame = read_job_telemetry(con)
    assert frame.filter(pl.col("activity_bad") > 0)["job_id"].to_list() == [3]
    con.close()
