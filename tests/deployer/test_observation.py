"""The live observation's view of what Slurm does not say itself (deployer/observation.py,
deployer/profiles.py): every job's communication profile (declared in its comment, else from
earlier runs of its name in the store, else the default; never one the contention model does
not know), whether it opted in to moves (``Job.preemptible``, honoured by the decision
problem's mask), and the moves under way (``ClusterState.transit``, their targets reserved).
Fakes for Slurm, the real DuckDB store and the real learned package; the same on the real
local Slurm: tests/deployer/test_observation_live.py."""

from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from linkwise.cluster.domain import Decision, Job, Placement, Shape, Start
from linkwise.cluster.mdp import MdpConfig, may_preempt, preemptable
from linkwise.cluster.mdp.running import eligible
from linkwise.cluster.profiles import load_calibration
from linkwise.cluster.slurm.client import SlurmClient, parse_show_job
from linkwise.cluster.slurm.records import JobRun, NodeInfo, QueuedJob
from linkwise.cluster.topology.spec import from_spec
from linkwise.datasets.ingest import ingest_job_runs
from linkwise.datasets.store import open_store
from linkwise.deployer.loop import ServeConfig, ShadowBackend, SlurmBackend
from linkwise.deployer.metrics import ServeMetrics
from linkwise.deployer.migration import InTransit, MigrationConfig, MigrationExecutor
from linkwise.deployer.observation import build_observation
from linkwise.deployer.policies import GuardedPolicy, PolicyHolder
from linkwise.deployer.profiles import (
    ProfileHistory,
    declared_profile,
    default_profile,
    read_profile_history,
    resolve_profiles,
)
from linkwise.deployer.recorder import Recorder
from linkwise.deployer.start_checks import check_start
from linkwise.policies.spec import PolicySpec

LOG = logging.getLogger("test.observation")
TOPO = from_spec("4x4")
NAMES = [n.name for n in TOPO.nodes]
CAL = load_calibration(None)
PACKAGE = "model:" + str(Path(__file__).resolve().parents[2] / "models/pretrained/philly-multigpu")
NOW = 10_000.0


def qjob(job_id: int, gpus: int = 2, **kw: Any) -> QueuedJob:
    base: dict[str, Any] = dict(
        job_id=job_id, name=f"j{job_id}", user="u", partition="gpu", state="PENDING",
        reason="Priority", submit_time=NOW - 100 + job_id, start_time=None,
        time_limit_s=3600.0, num_nodes=1, gpus=gpus, nodes=(), held=False,
    )  # fmt: skip
    base.update(kw)
    return QueuedJob(**base)


def running(job_id: int, nodes: tuple[str, ...], gpus: int = 2, **kw: Any) -> QueuedJob:
    return qjob(job_id, gpus * len(nodes), state="RUNNING", nodes=nodes, num_nodes=len(nodes),
                start_time=NOW - 2000, reason="None", **kw)  # fmt: skip


def ninfo(name: str, used: int = 0) -> NodeInfo:
    return NodeInfo(name, "MIXED" if used else "IDLE", ("gpu",), 8, 4, used)


# ------------------------------------------------------------------------ profiles


def test_a_profile_is_declared_else_from_history_else_the_default() -> None:
    queue = [
        qjob(1, comment="linkwise:profile=bert"),
        qjob(2, comment="linkwise:migratable@30, linkwise:profile=RESNET"),  # unknown name
        qjob(3, comment="x;linkwise:profile=moe"),  # case-insensitive: the calibration's MoE
        qjob(4, name="train", user="alice"),
        qjob(5),
        qjob(6, comment="linkwise:profile=bertx linkwise:profile=ncf"),  # the last one wins
    ]
    history = {("alice", "train"): "yolov3", ("bob", "train"): "ncf"}
    got = resolve_profiles(queue, CAL, history)
    assert {j: (r.profile, r.source) for j, r in got.items()} == {
        1: ("bert", "declared"),
        2: (default_profile(2, CAL), "default"),
        3: ("MoE", "declared"),
        4: ("yolov3", "history"),
        5: (default_profile(5, CAL), "default"),
        6: ("ncf", "declared"),
    }
    assert "RESNET" in got[2].note and not got[1].note
    assert all(r.profile in CAL.profiles for r in got.values())  # never unknown
    assert declared_profile("linkwise:profile=") is None
    assert declared_profile("linkwise:profile=bert(x)") is None  # not a tag as documented
    # the default: the operator's, or a draw from the mix that is the same for the same job
    assert default_profile(5, CAL, "BERT") == "bert"
    draws = [default_profile(j, CAL) for j in range(2000)]
    assert draws == [default_profile(j, CAL) for j in range(2000)]
    assert set(draws) == {n for n, w in CAL.mix.items() if w > 0}
    only = replace(CAL, mix={"ncf": 1.0})
    assert {default_profile(j, only) for j in range(50)} == {"ncf"}
    with pytest.raises(ValueError, match="unknown default profile"):
        default_profile(1, CAL, "nosuch")


def _run(job_id: int, name: str, user: str, submit: float, comment: str) -> JobRun:
    return JobRun(
        cluster="c", job_id=job_id, run_index=0, name=name, user=user, account="a",
        partition="gpu", state="COMPLETED", exit_code=0, signal=None, submit_time=submit,
        start_time=submit + 1, end_time=submit + 60, time_limit_s=600.0, nodes=("gpu01",),
        gpus=1, gpus_per_node=(1,), allocation_nodes=1, settled=True, comment=comment,
    )  # fmt: skip


def test_earlier_runs_in_the_store_give_the_profile(tmp_path: Path) -> None:
    db = tmp_path / "store.duckdb"
    con = open_store(str(db))
    ingest_job_runs(con, [
        _run(1, "train", "alice", 100.0, "linkwise:profile=ncf"),
        _run(2, "train", "alice", 200.0, "linkwise:migratable linkwise:profile=bert"),  # latest
        _run(3, "train", "bob", 300.0, "linkwise:profile=yolov3"),
        _run(4, "eval", "alice", 400.0, ""),
    ], source="test")  # fmt: skip
    con.close()
    rec = Recorder(str(db), tmp_path / "spool.jsonl", logger=LOG)
    keys = [("alice", "train"), ("bob", "train"), ("alice", "eval"), ("carol", "x")]
    assert read_profile_history(rec, keys) == {
        ("alice", "train"): "bert",
        ("bob", "train"): "yolov3",
    }
    assert read_profile_history(Recorder(None, tmp_path / "s2.jsonl", logger=LOG), keys) == {}
    cached = ProfileHistory(rec, ttl_s=300.0)
    assert cached.get(keys[:1], 0.0) == {("alice", "train"): "bert"}
    con = open_store(str(db))
    ingest_job_runs(con, [_run(5, "train", "alice", 500.0, "linkwise:profile=ncf")], source="t")
    con.close()
    assert cached.get(keys[:1], 299.0) == {("alice", "train"): "bert"}  # cached
    assert cached.get(keys[:1], 300.0) == {("alice", "train"): "ncf"}  # read again


def test_a_learned_package_decides_on_the_live_view_without_falling_back(tmp_path: Path) -> None:
    """The loop's view of squeue's jobs (no model names) with their resolved profiles: the
    shipped learned package decides itself (before: ``unknown profile ''`` every cycle and
    the heuristic instead)."""
    queue = [qjob(1, comment="linkwise:profile=bert"), qjob(2), qjob(3, 4),
             running(9, (NAMES[0],), 2)]  # fmt: skip
    client = FakeClient(queue, [ninfo(NAMES[0], 2), *(ninfo(n) for n in NAMES[1:])])
    backend = backend_for(tmp_path, client, PACKAGE)
    state = backend.observe()
    assert all(p.job.profile in CAL.profiles for p in state.pending)
    assert state.running[0].job.profile in CAL.profiles
    decision = backend.policy.decide(state)
    last = backend.policy.last
    assert last["policy"] == PACKAGE and last["note"] == "", last["note"]
    assert decision.starts  # the package starts jobs on the idle nodes
    metrics = backend.metrics.registry
    assert not metrics.get_sample_value(
        "linkwise_serve_fallbacks_total", {"reason": "decide_error"}
    )


# ------------------------------------------------------------------------ opt-in


def test_only_jobs_that_opted_in_may_be_preempted_live() -> None:
    queue = [
        running(1, (NAMES[0],), requeue=True, comment="linkwise:migratable@30"),
        running(2, (NAMES[1],), requeue=False, comment="linkwise:migratable"),  # no --requeue
        running(3, (NAMES[2],), requeue=True, comment="linkwise:migratablex"),
        running(4, (NAMES[3],), requeue=True),
    ]
    nodes = [ninfo(n, 2) for n in NAMES]
    obs = build_observation(queue, nodes, TOPO, ["gpu"], NOW, mode="shadow")
    assert {r.job.job_id: r.job.preemptible for r in obs.state.running} == {
        1: True, 2: False, 3: False, 4: False,
    }  # fmt: skip
    # the same marker the executor reads right before acting (one place: opted_in)
    fields = parse_show_job("JobId=1 Requeue=1 Comment=linkwise:migratable@30 Partition=gpu")
    assert fields["Comment"] == queue[0].comment
    # the decision problem's mask honours it whatever the simulator's share says
    for share in (0.0, 1.0):
        cfg = MdpConfig(running_slots=4, preempt_share=share, min_run_s=60.0)
        assert [r.job.job_id for r in eligible(obs.state, cfg)] == [1]
    # unknown (the simulator's jobs): the share decides, as before
    job = Job(7, 0.0, 2, 100.0)
    assert job.preemptible is None
    assert may_preempt(job, 0.5) == preemptable(7, 0.5)
    assert may_preempt(replace(job, preemptible=False), 1.0) is False
    assert may_preempt(replace(job, preemptible=True), 0.0) is True


# ------------------------------------------------------------------------ moves under way


def test_draining_and_restarting_jobs_are_in_transit_with_their_targets_reserved() -> None:
    queue = [
        running(1, (NAMES[0],), 2),  # signalled, migrates to gpu02
        running(2, (NAMES[2], NAMES[3]), 2),  # signalled, migrates to gpu03+gpu02 (overlap)
        running(3, (NAMES[3],), 1),  # signalled, preempted: no target
        qjob(4, 2, req_nodes=(NAMES[1],)),  # migrated, waits to restart on gpu02
        qjob(5, 1),  # an ordinary pending job
        running(6, (NAMES[0],), 1),  # an ordinary running job
    ]
    nodes = [ninfo(NAMES[0], 3), ninfo(NAMES[1]), ninfo(NAMES[2], 2), ninfo(NAMES[3], 3)]
    moves = [
        InTransit(1, (NAMES[1],), NOW + 20, True),
        InTransit(2, (NAMES[2], NAMES[1]), NOW + 25, True),
        InTransit(3, (), NOW + 5, True),
        InTransit(4, (NAMES[1],), NOW - 3, False),
        InTransit(6, (NAMES[1],), NOW - 60, False),  # restarted already: running
    ]
    obs = build_observation(queue, nodes, TOPO, ["gpu"], NOW, mode="shadow", transit=moves)
    st = obs.state
    assert [r.job.job_id for r in st.running] == [6]
    assert [p.job.job_id for p in st.pending] == [5]
    tr = {t.job.job_id: t for t in st.transit}
    assert sorted(tr) == [1, 2, 3, 4]
    assert tr[1].held == Placement.of([(0, 2)]) and tr[1].target == Placement.of([(1, 2)])
    assert tr[1].draining and tr[1].until == NOW + 20
    assert tr[2].target == Placement.of([(1, 2), (2, 2)])
    assert tr[3].target is None and tr[3].draining
    assert tr[4].held is None and tr[4].target == Placement.of([(1, 2)]) and not tr[4].draining
    # Slurm: 1, 4, 2, 1 free; targets on gpu02 take 2 + 2 + 2 (job 2 already holds its gpu03)
    assert obs.slurm_free == (1, 4, 2, 1)
    assert st.free_gpus == (1, 0, 2, 1)
    # draining jobs neither run nor share links any more (as in the simulator)
    assert sum(st.link_flows) == 0
    # without moves nothing changes
    plain = build_observation(queue[3:], nodes, TOPO, ["gpu"], NOW, mode="shadow")
    assert not plain.state.transit and plain.state.free_gpus == plain.slurm_free


class FakeRunner:
    def __init__(self, shows: dict[int, str]) -> None:
        self.slurm_conf = None
        self.bin_dir = None
        self.shows = shows
        self.commands: list[list[str]] = []

    def run(self, args: list[str], **_: Any) -> str:
        argv = [str(a) for a in args]
        if argv[:4] == ["scontrol", "-o", "show", "job"]:
            return self.shows[int(argv[4])]
        self.commands.append(argv)
        return ""


class FakeClient(SlurmClient):
    def __init__(self, queue: list[QueuedJob], nodes: list[NodeInfo],
                 shows: dict[int, str] | None = None) -> None:  # fmt: skip
        self._queue, self._nodes = queue, nodes
        self.runner = FakeRunner(shows or {})  # type: ignore[assignment]

    def queue(self) -> list[QueuedJob]:
        return list(self._queue)

    def nodes(self) -> list[NodeInfo]:
        return list(self._nodes)


def backend_for(tmp_path: Path, client: FakeClient, policy: str = "fifo", *,
                active: bool = False, **cfg: Any) -> SlurmBackend:  # fmt: skip
    spec = PolicySpec.parse(policy)
    config = ServeConfig(
        mode="active" if active else "shadow", partitions=("gpu",),
        db=str(tmp_path / "s.duckdb"), state_dir=str(tmp_path / "state"), interval_s=0.01,
        lease_s=120.0, watchdog=False, policy=spec, fallback=PolicySpec.parse("fifo"), **cfg,
    )  # fmt: skip
    metrics = ServeMetrics()
    holder = PolicyHolder(spec, PolicySpec.parse("fifo"), metrics=metrics, logger=LOG)
    recorder = Recorder(config.db, config.spool_path, logger=LOG)
    kind = SlurmBackend if active else ShadowBackend
    return kind(
        client, TOPO, config, GuardedPolicy(holder, metrics, LOG), recorder, metrics,
        logger=LOG, sleep=lambda s: None, lease_dir=tmp_path / "leases",
    )  # fmt: skip


class Clock:
    def __init__(self) -> None:
        self.t = NOW

    def __call__(self) -> float:
        return self.t


def test_the_loop_sees_its_own_moves_and_finishes_them_on_their_reserved_target(
    tmp_path: Path,
) -> None:
    """A migration signalled by the executor: the next observation shows the job draining
    with its target reserved (no policy can start another job there during the grace); once
    the grace is over the move finishes onto that target (its own reservation does not
    count against it), and the requeued job waits in transit until Slurm restarts it."""
    open_store(str(tmp_path / "s.duckdb")).close()
    opted = "linkwise:migratable@5"
    queue = [running(1, (NAMES[0],), 2, requeue=True, comment=opted), qjob(2, 2)]
    nodes = [ninfo(NAMES[0], 2), ninfo(NAMES[1], 2), ninfo(NAMES[2], 4), ninfo(NAMES[3], 4)]
    show = f"JobId=1 JobState=RUNNING Requeue=1 Restarts=0 Partition=gpu Comment={opted}"
    client = FakeClient(queue, nodes, {1: show})
    backend = backend_for(tmp_path, client, active=True)
    backend.start()  # the lease: moves are taken only while it is the loop's
    try:
        _migrate_through_the_loop(backend, client, opted)
    finally:
        backend.shutdown()


def _migrate_through_the_loop(backend: SlurmBackend, client: FakeClient, opted: str) -> None:
    clock = Clock()
    backend.migration = MigrationExecutor(
        client, backend.recorder, CollectorRegistry(),
        MigrationConfig(grace_s=5, min_run_s=60, settle_s=0), run_id="r", logger=LOG,
        clock=clock, sleep=lambda s: None,
    )  # fmt: skip
    state = backend.observe()
    assert [r.job.preemptible for r in state.running] == [True]
    assert state.free_gpus == (2, 2, 0, 0)
    migrate = Decision(migrate=(Start(1, Placement.of([(1, 2)])),))
    assert backend._moves(migrate, backend.obs, "v") == {1: "signalled"}  # type: ignore[arg-type]
    state = backend.observe()
    (tr,) = state.transit
    assert tr.job.job_id == 1 and tr.draining and tr.target == Placement.of([(1, 2)])
    assert not state.running and state.free_gpus == (2, 0, 0, 0)  # gpu02's 2 are reserved
    # a start on the reserved GPUs is refused by the loop's own check; within the grace the
    # move waits
    assert "busy" in str(check_start(Placement.of([(1, 2)]), Shape(1, 2), state.free_gpus, TOPO))
    clock.t += 4.9
    assert backend._moves(Decision(), backend.obs, "v") == {}  # type: ignore[arg-type]
    clock.t += 0.1
    assert backend._moves(Decision(), backend.obs, "v") == {1: "migrated"}  # type: ignore[arg-type]
    assert ["scontrol", "release", "1"] in client.runner.commands  # type: ignore[attr-defined]
    # requeued onto gpu02: pending with its node list until Slurm restarts it there
    client._queue = [qjob(1, 2, req_nodes=(NAMES[1],), comment=opted, requeue=True), qjob(2, 2)]
    client._nodes = [ninfo(NAMES[0]), ninfo(NAMES[1], 2), ninfo(NAMES[2], 4), ninfo(NAMES[3], 4)]
    state = backend.observe()
    (tr,) = state.transit
    assert tr.held is None and tr.target == Placement.of([(1, 2)])
    assert state.free_gpus == (4, 0, 0, 0)
    # restarted: running again, the move is over
    client._queue = [running(1, (NAMES[1],), 2, requeue=True, comment=opted), qjob(2, 2)]
    backend.observe()
    backend._moves(Decision(), backend.obs, "v")  # type: ignore[arg-type]
    assert not backend.migration.in_transit()
    assert not backend.observe().transit


def test_the_operators_default_profile_and_its_check(tmp_path: Path) -> None:
    client = FakeClient([qjob(1), qjob(2, comment="linkwise:profile=ncf")],
                        [ninfo(n) for n in NAMES])  # fmt: skip
    backend = backend_for(tmp_path, client, default_profile="BERT")
    assert [p.job.profile for p in backend.observe().pending] == ["bert", "ncf"]
    with pytest.raises(ValueError, match="unknown default profile 'resnet'"):
        ServeConfig(mode="shadow", partitions=("gpu",), default_profile="resnet")
