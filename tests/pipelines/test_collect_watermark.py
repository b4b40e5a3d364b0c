"""No silent loss (issue 31 item 3): records the parser rejects hold the accounting watermark,
so the next run reads their window again and stores them once the parser accepts them; a
reject holds for ``reject_hold_s`` at most unless the whole run was rejected (a schema
fault); each reject is kept once. A real DuckDB file; the Slurm side is a fake transport
whose "parser" rejects the records named broken."""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path

import duckdb
import pytest

from linkwise.cluster.slurm.records import AccountingBatch, JobRun, NodeInfo, RejectedRecord
from linkwise.pipelines.collect_accounting import (
    AccountingReport,
    WindowRejects,
    collect_accounting,
    hold_of,
    let_go,
)

CLUSTER = "c"
DAY = 86400.0


def job_run(job_id: int, end: float, gpus: int = 1) -> JobRun:
    return JobRun(
        cluster=CLUSTER, job_id=job_id, run_index=0, name=f"j{job_id}", user="u", account="a",
        partition="gpu", state="COMPLETED", exit_code=0, signal=None, submit_time=end - 100.0,
        start_time=end - 50.0, end_time=end, time_limit_s=3600.0, nodes=("n1",), gpus=gpus,
        gpus_per_node=(gpus,), allocation_nodes=1, settled=True,
    )  # fmt: skip


def rejected(job_id: int, end: float) -> RejectedRecord:
    raw = json.dumps({"job_id": job_id, "time": {"end": end}, "tres": "v0.0.99"})
    return RejectedRecord(str(job_id), "tres.allocated", "tres.allocated: not a list", raw)


@dataclass
class FakeSlurm:
    """Accounting records (job id, end time); the parser rejects the ``broken`` ones."""

    records: dict[int, float]
    broken: set[int] = field(default_factory=set)
    gpus: dict[int, int] = field(default_factory=dict)
    reads: list[tuple[float, float | None]] = field(default_factory=list)

    def accounting(self, since: float, until: float | None = None) -> AccountingBatch:
        self.reads.append((since, until))
        end = float("inf") if until is None else until
        inside = sorted((j, t) for j, t in self.records.items() if since <= t < end)
        runs = [job_run(j, t, self.gpus.get(j, 1)) for j, t in inside if j not in self.broken]
        bad = [rejected(j, t) for j, t in inside if j in self.broken]
        return AccountingBatch(runs=tuple(runs), rejected=tuple(bad))

    def nodes(self) -> list[NodeInfo]:
        return [NodeInfo("n1", "IDLE", ("gpu",), 8, 4, 0)]


def rows(db: Path, sql: str) -> list[tuple[object, ...]]:
    with duckdb.connect(str(db), read_only=True) as con:
        return con.execute(sql).fetchall()


def collect(slurm: FakeSlurm, db: Path, **kw: float) -> AccountingReport:
    kw = {"window_s": DAY, "overlap_s": 600.0, **kw}
    return collect_accounting(slurm, db, cluster=CLUSTER, **kw)  # type: ignore[arg-type]


def age_rejects(db: Path, seconds: float) -> None:
    """Make every reject ``seconds`` older (first and last seen)."""
    with duckdb.connect(str(db)) as con:
        con.execute(
            "UPDATE rejected_rows SET rejected_at = rejected_at - ?, last_seen = last_seen - ?",
            [seconds, seconds],
        )


def test_the_hold_rule() -> None:
    def w(start: float, accepted: int, rejected: int, age: float = 0.0) -> WindowRejects:
        return WindowRejects(start, start + 100.0, accepted, rejected, age if rejected else 1e18)

    assert hold_of([w(0, 5, 0), w(90, 3, 0)], None, 3600.0) is None
    # a young reject holds at its window's start, never before the previous watermark
    young = [w(0, 5, 0), w(90, 3, 1, age=10.0), w(180, 2, 1)]
    held = hold_of(young, None, 3600.0)
    assert held is not None and held.at == 90.0 and "rejected by the parser" in held.reason
    held = hold_of(young, 120.0, 3600.0)
    assert held is not None and held.at == 120.0
    # an old one among accepted records no longer holds, and is named to collect again
    old = [w(0, 5, 0), w(90, 3, 1, age=3600.0)]
    assert hold_of(old, None, 3600.0) is None and let_go(old, 3600.0) == (old[1],)
    # nothing accepted in the whole run: a schema fault holds whatever the rejects' age
    fault = [w(0, 0, 0), w(90, 0, 2, age=30 * DAY), w(180, 0, 1, age=30 * DAY)]
    held = hold_of(fault, None, 3600.0)
    assert held is not None and held.at == 90.0 and not let_go(fault, 3600.0)
    assert held.reason.startswith("schema fault: all 2 record(s) of window")
    # judged over the run: a window with only a rejected record beside accepted ones is no
    # schema fault
    quiet = [w(0, 0, 1, age=2 * DAY), w(90, 4, 0)]
    assert hold_of(quiet, None, 3600.0) is None and let_go(quiet, 3600.0) == (quiet[0],)


def test_rejected_records_hold_until_the_fixed_parser_stores_them(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    db = tmp_path / "store.duckdb"
    now = time.time()
    slurm = FakeSlurm({1: now - 4 * 3600, 2: now - 3600, 3: now - 1800}, broken={2, 3})
    good = collect(slurm, db, since=now - 5 * 3600, until=now - 3 * 3600)
    assert good.total("inserted") == 1 and good.watermark == now - 3 * 3600
    assert not good.watermark_held and good.open_rejects == 0
    # two runs whose every record the parser rejects: the watermark stays where it was
    for n in (1, 2):
        with caplog.at_level(logging.WARNING):
            caplog.clear()
            bad = collect(slurm, db)
        assert bad.since == pytest.approx(good.watermark - 600.0)
        assert bad.watermark == bad.previous_watermark == good.watermark
        assert bad.watermark_held and bad.held_at == good.watermark
        assert bad.held_reason.startswith("schema fault: all 2 record(s) of window")
        assert bad.total("rejected") == 2 and bad.total("new_rejects") == (2 if n == 1 else 0)
        assert bad.open_rejects == 2 and bad.total("inserted") == 0
        held_lines = [r for r in caplog.records if "watermark held at" in r.getMessage()]
        assert len(held_lines) == 1
    assert rows(db, "SELECT job_id, seen, resolved_at FROM rejected_rows ORDER BY job_id") == [
        ("2", 2, None),
        ("3", 2, None),
    ]
    assert get_watermark(db) == good.watermark
    # the parser fixed: no --since, the held window is read again and its jobs stored
    slurm.broken.clear()
    fixed = collect(slurm, db)
    assert slurm.reads[-1][0] == pytest.approx(good.watermark - 600.0)
    assert fixed.total("inserted") == 2 and fixed.total("resolved") == 2
    assert fixed.open_rejects == 0 and not fixed.watermark_held
    assert fixed.watermark is not None and fixed.watermark > now
    assert rows(db, "SELECT job_id FROM jobs ORDER BY job_id") == [(1,), (2,), (3,)]
    resolved = rows(db, "SELECT count(*) FROM rejected_rows WHERE resolved_at IS NOT NULL")
    assert resolved == [(2,)] and get_watermark(db) == fixed.watermark
    out = fixed.to_dict()
    assert (out["resolved"], out["open_rejects"], out["watermark_held"]) == (2, 0, False)


def get_watermark(db: Path) -> object:
    (value,) = rows(db, "SELECT watermark FROM ingest_state")[0]
    return value


def test_a_corrupt_record_among_good_ones_holds_for_reject_hold_s_then_stays_open(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    db = tmp_path / "store.duckdb"
    now = time.time()
    since = now - 7200.0
    slurm = FakeSlurm({1: now - 5000, 2: now - 4000, 3: now - 3000}, broken={3})
    first = collect(slurm, db, since=since, reject_hold_s=3600.0)
    assert first.total("inserted") == 2 and first.watermark == since
    assert first.held_at == since and "rejected by the parser" in first.held_reason
    # the reject is now older than reject_hold_s: it lets go, stays open, and says so
    age_rejects(db, 7200.0)
    with caplog.at_level(logging.WARNING):
        second = collect(slurm, db, reject_hold_s=3600.0)
    assert not second.watermark_held and second.watermark is not None and second.watermark > now
    assert second.open_rejects == 1 and second.total("new_rejects") == 0
    assert rows(db, "SELECT job_id, seen, resolved_at FROM rejected_rows") == [("3", 2, None)]
    warning = " ".join(r.getMessage() for r in caplog.records)
    assert f"--since {second.since:.0f}" in warning and "no longer hold" in warning


def test_a_schema_fault_holds_whatever_its_age(tmp_path: Path) -> None:
    db = tmp_path / "store.duckdb"
    now = time.time()
    slurm = FakeSlurm({7: now - 1000}, broken={7})
    first = collect(slurm, db, since=now - 3600, reject_hold_s=60.0)
    assert first.watermark == now - 3600 and first.held_reason.startswith("schema fault")
    age_rejects(db, 30 * DAY)
    again = collect(slurm, db, reject_hold_s=60.0)
    assert again.watermark == first.watermark and again.held_at == first.watermark
    assert again.held_reason.startswith("schema fault: all 1 record(s)")
    assert rows(db, "SELECT seen FROM rejected_rows") == [(2,)]


def test_overlapping_windows_keep_a_reject_once(tmp_path: Path) -> None:
    db = tmp_path / "store.duckdb"
    now = time.time()
    since = now - 3 * 3600.0
    # windows of an hour overlapping by 20 minutes; job 5 ends inside the first overlap
    slurm = FakeSlurm({4: since + 600, 5: since + 3000, 6: since + 5000}, broken={5})
    rep = collect(slurm, db, since=since, window_s=3600.0, overlap_s=1200.0)
    assert len(rep.windows) >= 2 and rep.total("rejected") == 2
    assert rep.total("new_rejects") == 1 and rep.open_rejects == 1
    assert rows(db, "SELECT job_id, seen FROM rejected_rows") == [("5", 2)]
    assert rep.held_at == since == rep.watermark


def test_value_check_rejects_are_kept_once_and_do_not_hold(tmp_path: Path) -> None:
    """A record the parser accepts but ingest refuses (more GPUs than the cluster's 4)."""
    db = tmp_path / "store.duckdb"
    now = time.time()
    slurm = FakeSlurm({1: now - 900, 2: now - 600}, gpus={2: 64})
    for _ in range(2):
        rep = collect(slurm, db, since=now - 3600)
        assert not rep.watermark_held and rep.watermark is not None and rep.watermark > now
    assert rows(db, "SELECT job_id, reason, seen FROM rejected_rows") == [
        ("2", "more GPUs than the cluster has", 2)
    ]
