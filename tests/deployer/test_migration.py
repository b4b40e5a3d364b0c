"""Preempting and migrating opted-in jobs (deployer/migration.py): planning rules, and the
executor's command sequence over a recording runner with the real DuckDB audit store (every
command must find its audit row already persisted). The same code on a real Slurm:
tests/deployer/test_migration_live.py."""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import duckdb
import pytest
from prometheus_client import CollectorRegistry

from linkwise.cluster.domain import Decision, Node, Placement, Start, Topology
from linkwise.cluster.slurm.client import SlurmClient, parse_show_job, signal_args
from linkwise.cluster.slurm.errors import SlurmError
from linkwise.cluster.slurm.records import NodeInfo, QueuedJob
from linkwise.datasets.store import open_store
from linkwise.deployer.migration import (
    MigrationConfig,
    MigrationExecutor,
    Move,
    moves_of,
    opt_in_grace,
    plan,
)
from linkwise.deployer.recorder import Recorder

LOG = logging.getLogger("test.migration")
NOW = 10_000.0
CFG = MigrationConfig(grace_s=20, max_grace_s=60, budget=2, min_run_s=100, settle_s=2)


def show(job_id: int, *, comment: str = "linkwise:migratable@5", requeue: int = 1,
         restarts: int = 0) -> str:  # fmt: skip
    return (
        f"JobId={job_id} JobName=train UserId=alice(1000) JobState=RUNNING Reason=None "
        f"Requeue={requeue} Restarts={restarts} BatchFlag=1 Partition=gpu "
        f"Comment={comment} StdErr=/dev/null StdIn=/dev/null"
    )


def queued(job_id: int, nodes: tuple[str, ...] = ("gpu01",), *, gpus: int = 2,
           state: str = "RUNNING", start: float = NOW - 500, partition: str = "gpu",
           admin_comment: str = "") -> QueuedJob:  # fmt: skip
    return QueuedJob(
        job_id=job_id, name="train", user="alice", partition=partition, state=state,
        reason="None", submit_time=NOW - 1000, start_time=start, time_limit_s=3600.0,
        num_nodes=len(nodes), gpus=gpus * len(nodes), nodes=nodes, held=False,
        admin_comment=admin_comment,
    )  # fmt: skip


FREE = {"gpu01": 0, "gpu02": 4, "gpu03": 1, "gpu04": 4}


def test_opt_in_needs_the_tag_and_requeue() -> None:
    assert opt_in_grace(parse_show_job(show(1, comment="linkwise:migratable")), CFG) == 20
    assert opt_in_grace(parse_show_job(show(1, comment="x linkwise:migratable@7,y")), CFG) == 7
    assert opt_in_grace(parse_show_job(show(1, comment="linkwise:migratable@900")), CFG) == 60
    assert opt_in_grace(parse_show_job(show(1, comment="linkwise:migratablex")), CFG) is None
    assert opt_in_grace(parse_show_job(show(1, comment="(null)")), CFG) is None
    assert opt_in_grace(parse_show_job(show(1, requeue=0)), CFG) is None
    # a user's comment cannot override a real field (the first occurrence wins)
    spoof = parse_show_job(show(1, restarts=2, comment="linkwise:migratable Restarts=0"))
    assert spoof["Restarts"] == "2" and opt_in_grace(spoof, CFG) == 20


def test_plan_refuses_every_job_the_rules_exclude() -> None:
    queue = [
        queued(1),  # opted in, migrates to gpu02
        queued(2),  # not opted in
        queued(3, start=NOW - 10),  # ran 10 s < 100 s
        queued(4),  # budget spent (2 restarts)
        queued(5, state="PENDING"),
        queued(6, partition="other"),
        queued(7),  # target busy
        queued(8),  # two nodes asked for a one-node job
        queued(9, admin_comment="maintenance ticket 12"),
        queued(10),  # preempt: allowed
        queued(11),  # the second migration onto gpu02 still fits (4 free, 2 + 2)
        queued(12),  # the third one does not
    ]
    table = {j.job_id: show(j.job_id) for j in queue}
    table[2] = show(2, comment="(null)")
    table[4] = show(4, restarts=2)
    asked: list[int] = []

    def details(j: int) -> dict[str, str]:
        asked.append(j)
        return parse_show_job(table[j])

    moves = [
        Move(1, "migrate", ("gpu02",)), Move(2, "preempt"), Move(3, "preempt"),
        Move(4, "preempt"), Move(5, "preempt"), Move(6, "preempt"),
        Move(7, "migrate", ("gpu03",)), Move(8, "migrate", ("gpu02", "gpu04")),
        Move(9, "preempt"), Move(10, "preempt"), Move(1, "preempt"),
        Move(11, "migrate", ("gpu02",)), Move(12, "migrate", ("gpu02",)),
        Move(99, "preempt"),
    ]  # fmt: skip
    ok, refused = plan(moves, queue, details, NOW, CFG, ("gpu",), FREE)
    assert [(p.move.job_id, p.move.kind, p.grace_s) for p in ok] == [
        (1, "migrate", 5.0), (10, "preempt", 5.0), (11, "migrate", 5.0),
    ]  # fmt: skip
    why = {r.move.job_id: r.reason.split(":")[0] for r in refused}
    assert why == {
        2: "not opted in", 3: "min run time", 4: "budget spent", 5: "not running",
        6: "not managed", 7: "no room", 8: "bad target", 9: "not managed", 1: "busy",
        12: "no room", 99: "not running",
    }  # fmt: skip
    assert 5 not in asked and 6 not in asked and 99 not in asked  # Slurm asked only when needed


def test_moves_of_a_decision_name_the_nodes() -> None:
    topo = Topology(
        name="t",
        nodes=tuple(Node(f"gpu0{i}", 4, 0) for i in range(1, 5)),
        leaf_names=("leaf",),
        leaf_agg=(0,),
        leaf_uplink_gbps=(100.0,),
    )
    d = Decision(preempt=(3,), migrate=(Start(4, Placement.of([(1, 2), (3, 2)])),))
    assert moves_of(d, topo) == [Move(3, "preempt"), Move(4, "migrate", ("gpu02", "gpu04"))]


class Runner:
    """A runner double: answers ``scontrol show job`` from a table; every other command is
    recorded after checking that its audit row is already in the store."""

    def __init__(self, db: Path | None, table: dict[int, str], fail: str = "") -> None:
        self.db = db
        self.table = table
        self.fail = fail  # commands containing this fail
        self.calls: list[list[str]] = []
        self.slurm_conf = None
        self.bin_dir = None

    def run(self, args: Sequence[str], **_kw: Any) -> str:
        argv = [str(a) for a in args]
        if argv[:4] == ["scontrol", "-o", "show", "job"]:
            return self.table[int(argv[4])]
        if self.db is not None:
            con = duckdb.connect(str(self.db), read_only=True)
            audited = {c for (c,) in con.execute("SELECT command FROM audit").fetchall()}
            con.close()
            assert json.dumps(argv) in audited, f"{argv} ran before its audit row was stored"
        self.calls.append(argv)
        if self.fail and self.fail in " ".join(argv):
            raise SlurmError(f"{argv[1]}: exit status 1: refused")
        return ""


class Reads:
    """The transport double: one opted-in job running on gpu01, and free GPUs as ``FREE``."""

    name = "fake"

    def queue(self) -> list[QueuedJob]:
        return [queued(1)]

    def nodes(self) -> list[NodeInfo]:
        return [NodeInfo(n, "MIXED", ("gpu",), 8, 4, 4 - f) for n, f in FREE.items()]


class Clock:
    def __init__(self) -> None:
        self.t = NOW

    def __call__(self) -> float:
        return self.t

    def sleep(self, s: float) -> None:
        self.t += s


def executor(tmp: Path, runner: Runner, clock: Clock, recorder: Recorder | None = None
             ) -> tuple[MigrationExecutor, CollectorRegistry]:  # fmt: skip
    registry = CollectorRegistry()
    rec = recorder or Recorder(str(tmp / "store.duckdb"), tmp / "spool.jsonl", logger=LOG)
    client = SlurmClient(Reads(), runner)  # type: ignore[arg-type]
    ex = MigrationExecutor(
        client, rec, registry, CFG, run_id="r1", logger=LOG, clock=clock, sleep=clock.sleep
    )
    return ex, registry


def store(tmp: Path) -> Path:
    db = tmp / "store.duckdb"
    open_store(str(db)).close()
    return db


def count(registry: CollectorRegistry, name: str, **labels: str) -> float:
    return registry.get_sample_value(name, labels) or 0.0


def test_a_migration_signals_then_requeues_places_and_releases(tmp_path: Path) -> None:
    db = store(tmp_path)
    runner = Runner(db, {1: show(1), 2: show(2, comment="(null)")})
    clock = Clock()
    ex, reg = executor(tmp_path, runner, clock)
    queue = [queued(1), queued(2)]
    moves = [Move(1, "migrate", ("gpu04",)), Move(2, "preempt")]
    out = ex.cycle(moves, queue, FREE, partitions=("gpu",), mode="active", cycle_id=1)
    assert out == {1: "signalled", 2: "refused: not opted in"}
    assert runner.calls == [signal_args(1)]
    clock.t += 4.9  # within the grace: nothing more
    assert ex.cycle([], queue, FREE, partitions=("gpu",), mode="active", cycle_id=2) == {}
    clock.t += 0.2
    out = ex.cycle([], queue, FREE, partitions=("gpu",), mode="active", cycle_id=3)
    assert out == {1: "migrated"}
    assert runner.calls == [
        ["scancel", "--batch", "--signal=USR1", "1"],
        ["scontrol", "update", "JobId=1", "AdminComment=linkwise:held"],
        ["scontrol", "requeuehold", "1"],
        ["scontrol", "update", "JobId=1", "ReqNodeList=gpu04", "NumNodes=1"],
        ["scontrol", "release", "1"],
        ["scontrol", "update", "JobId=1", "AdminComment=linkwise:released"],
    ]
    con = duckdb.connect(str(db), read_only=True)
    rows = con.execute("SELECT job_id, actor, outcome, cycle_id FROM audit ORDER BY ts").fetchall()
    con.close()
    assert {(j, a, o) for j, a, o, _ in rows} == {(1, "loop:migrate", "ok")} and len(rows) == 6
    assert count(reg, "linkwise_serve_migrations_total", mode="active") == 1
    assert count(reg, "linkwise_serve_moves_refused_total", reason="not opted in") == 1
    # the job never opted in: Slurm was only asked about it, never told anything
    assert not any(c[-1] == "2" or "JobId=2" in c for c in runner.calls)


def test_a_preempted_job_stays_held_for_the_loop(tmp_path: Path) -> None:
    runner = Runner(store(tmp_path), {1: show(1)})
    clock = Clock()
    ex, reg = executor(tmp_path, runner, clock)
    ex.cycle([Move(1, "preempt")], [queued(1)], FREE, partitions=("gpu",), mode="active",
             cycle_id=1)  # fmt: skip
    clock.t += 5
    out = ex.cycle([], [queued(1)], FREE, partitions=("gpu",), mode="active", cycle_id=2)
    assert out == {1: "preempted: held for the loop"}
    assert [c[1] for c in runner.calls] == ["--batch", "update", "requeuehold"]
    assert count(reg, "linkwise_serve_preemptions_total", mode="active") == 1


def test_shadow_records_would_be_moves_and_runs_nothing(tmp_path: Path) -> None:
    db = store(tmp_path)
    runner = Runner(db, {1: show(1)})
    ex, reg = executor(tmp_path, runner, Clock())
    out = ex.cycle([Move(1, "migrate", ("gpu02",))], [queued(1)], FREE, partitions=("gpu",),
                   mode="shadow", cycle_id=1)  # fmt: skip
    assert out == {1: "shadow"} and runner.calls == [] and not ex.draining
    con = duckdb.connect(str(db), read_only=True)
    rows = con.execute("SELECT actor, outcome, command FROM audit").fetchall()
    con.close()
    assert {(a, o) for a, o, _ in rows} == {("shadow:migrate", "shadow")}
    assert [json.loads(c)[1] for *_, c in rows] == [
        "--batch", "update", "requeuehold", "update", "release", "update",
    ]  # fmt: skip
    assert count(reg, "linkwise_serve_migrations_total", mode="shadow") == 1


def test_a_lapsed_lease_pauses_moves_under_way(tmp_path: Path) -> None:
    runner = Runner(store(tmp_path), {1: show(1)})
    clock = Clock()
    ex, _ = executor(tmp_path, runner, clock)
    ex.cycle([Move(1, "preempt")], [queued(1)], FREE, partitions=("gpu",), mode="active",
             cycle_id=1)  # fmt: skip
    clock.t += 60
    out = ex.cycle([Move(1, "preempt")], [queued(1)], FREE, partitions=("gpu",),
                   mode="paused", cycle_id=2)  # fmt: skip
    assert out == {1: "skipped: lease lapsed"} and len(runner.calls) == 1 and 1 in ex.draining
    # the job ended during the grace: nothing is requeued
    out = ex.cycle([], [], FREE, partitions=("gpu",), mode="active", cycle_id=3)
    assert out == {1: "dropped: ended during its grace"} and len(runner.calls) == 1


def test_a_target_filled_during_the_grace_abandons_the_move(tmp_path: Path) -> None:
    runner = Runner(store(tmp_path), {1: show(1)})
    clock = Clock()
    ex, reg = executor(tmp_path, runner, clock)
    ex.cycle([Move(1, "migrate", ("gpu02",))], [queued(1)], FREE, partitions=("gpu",),
             mode="active", cycle_id=1)  # fmt: skip
    clock.t += 6
    busy = {**FREE, "gpu02": 1}
    out = ex.cycle([], [queued(1)], busy, partitions=("gpu",), mode="active", cycle_id=2)
    assert out[1].startswith("abandoned: no room") and len(runner.calls) == 1  # signal only
    assert count(reg, "linkwise_serve_migration_failures_total", stage="target") == 1


def test_a_failed_placement_still_releases_the_job(tmp_path: Path) -> None:
    runner = Runner(store(tmp_path), {1: show(1)}, fail="ReqNodeList")
    clock = Clock()
    ex, reg = executor(tmp_path, runner, clock)
    out = ex.run_now([Move(1, "migrate", ("gpu02",))], partitions=("gpu",))
    assert out[1].startswith("requeued unplaced")
    assert runner.calls[-2:] == [
        ["scontrol", "release", "1"],
        ["scontrol", "update", "JobId=1", "AdminComment=linkwise:released"],
    ]
    assert count(reg, "linkwise_serve_migration_failures_total", stage="place") == 1


def test_no_action_without_a_persisted_audit(tmp_path: Path) -> None:
    def broken(_db: str) -> Any:
        raise OSError("store gone")

    rec = Recorder("x.duckdb", "/proc/no-such-dir/spool.jsonl", logger=LOG, open_store=broken)
    runner = Runner(None, {1: show(1)})
    ex, _ = executor(tmp_path, runner, Clock(), rec)
    out = ex.cycle([Move(1, "preempt")], [queued(1)], FREE, partitions=("gpu",),
                   mode="active", cycle_id=1)  # fmt: skip
    assert out[1].startswith("failed: signal: audit not persisted") and runner.calls == []


def test_config_is_validated() -> None:
    with pytest.raises(ValueError):
        MigrationConfig(signal="USR1; rm")
    with pytest.raises(ValueError):
        MigrationConfig(budget=-1)


def test_serve_options_set_the_rules() -> None:
    import argparse

    from linkwise.cli.serve import config_from_args, configure_parser

    parser = argparse.ArgumentParser()
    configure_parser(parser)
    args = ["--partition", "gpu", "--migrate-budget", "1", "--migrate-min-run", "60"]
    cfg = config_from_args(parser.parse_args([*args, "--migrate-grace", "45"]))
    assert cfg.migration == MigrationConfig(grace_s=45, budget=1, min_run_s=60)
    with pytest.raises(ValueError):
        config_from_args(parser.parse_args(["--partition", "gpu", "--migrate-grace", "-1"]))
