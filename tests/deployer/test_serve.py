"""The live loop's logic with a fake Slurm client (the real one:
tests/deployer/test_serve_live.py)."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import duckdb
import pytest

from linkwise.cluster.contention import AnalyticModel
from linkwise.cluster.domain import Decision, Job, Placement, Shape, Start
from linkwise.cluster.loop import drive
from linkwise.cluster.slurm.errors import SlurmError, SlurmTimeout, SlurmUnavailable
from linkwise.cluster.slurm.records import NodeInfo, QueuedJob
from linkwise.cluster.slurm.schema import SlurmSchemaError
from linkwise.cluster.topology.spec import from_spec
from linkwise.datasets.predictor import RuntimePredictor
from linkwise.datasets.store import open_store
from linkwise.deployer.calibration import CalibrationResolver
from linkwise.deployer.cycle_lines import CycleLines
from linkwise.deployer.drift import DriftMonitor
from linkwise.deployer.holds import HOLD_TAG
from linkwise.deployer.lease import Lease, lease_dir_for, lease_expired, read_lease, write_lease
from linkwise.deployer.locks import WATCHDOG_HOLDER, LeaseTaken, lock_partitions
from linkwise.deployer.loop import ServeConfig, ShadowBackend, SlurmBackend, serve
from linkwise.deployer.metrics import ServeMetrics
from linkwise.deployer.observation import build_observation
from linkwise.deployer.policies import GuardedPolicy, LoadedPolicy, PolicyHolder
from linkwise.deployer.recorder import Recorder
from linkwise.deployer.release import hand_back
from linkwise.deployer.scontrol import untag_command
from linkwise.deployer.slurm_reads import read_fault_kind
from linkwise.deployer.start_checks import check_start
from linkwise.deployer.watchdog import _tools
from linkwise.models.calibrations import log_cluster_calibration
from linkwise.policies.heuristics import make_policy
from linkwise.policies.spec import PolicySpec
from linkwise.tests import _drift, _profile_runs
from linkwise.tests._telemetry_truth import CLUSTER

LOG = logging.getLogger("test.serve")
TOPO = from_spec("4x4")
NAMES = [n.name for n in TOPO.nodes]


def qjob(job_id: int, gpus: int, n_nodes: int = 1, *, held: bool = True, **kw: Any) -> QueuedJob:
    base: dict[str, Any] = dict(
        job_id=job_id, name=f"j{job_id}", user="u", partition="gpu", state="PENDING",
        reason="JobHeldUser" if held else "Priority", submit_time=100.0 + job_id,
        start_time=None, time_limit_s=600.0, num_nodes=n_nodes, gpus=gpus, nodes=(), held=held,
        admin_comment=HOLD_TAG if held else "",  # held by job_submit.lua for the loop
    )  # fmt: skip
    base.update(kw)
    return QueuedJob(**base)


def ninfo(name: str, used: int = 0, state: str = "IDLE") -> NodeInfo:
    return NodeInfo(name, state, ("gpu",), 8, 4, used)


class FakeRunner:
    def __init__(self, on_run: Any = None) -> None:
        self.slurm_conf = None
        self.bin_dir: str | None = None
        self.commands: list[list[str]] = []
        self.on_run = on_run

    def run(self, args: list[str], **_: Any) -> str:
        if self.on_run is not None:
            self.on_run(args)
        self.commands.append(list(args))
        return ""


class FakeClient:
    def __init__(self, queue: list[QueuedJob], nodes: list[NodeInfo], runner: FakeRunner) -> None:
        self._queue, self._nodes, self.runner = queue, nodes, runner
        self.fail_reads = 0
        self.faults: list[Exception] = []  # raised by the next reads, one each

    def queue(self) -> list[QueuedJob]:
        if self.faults:
            raise self.faults.pop(0)
        if self.fail_reads:
            self.fail_reads -= 1
            raise SlurmError("squeue: Unable to contact slurm controller")
        return list(self._queue)

    def nodes(self) -> list[NodeInfo]:
        return list(self._nodes)

    def release(self, job_id: int) -> None:
        self.runner.run(["scontrol", "release", str(job_id)])


def test_observation_keeps_held_gpu_jobs_and_refuses_impossible_ones() -> None:
    queue = [
        qjob(1, 2),
        qjob(2, 8, 2),
        qjob(3, 6, 6),  # 6 nodes in a 4-node partition: never fits
        qjob(4, 0),  # no GPUs: handed back to Slurm
        qjob(5, 1, held=False),  # not held: Slurm's, not ours
        qjob(6, 4, state="RUNNING", nodes=(NAMES[0],), start_time=90.0, held=False),
        qjob(7, 1, reason="JobHeldAdmin"),  # an administrator held it on top: not ours
        qjob(8, 1, admin_comment=""),  # its user's own hold: not ours
        qjob(10, 1, held=False, admin_comment=HOLD_TAG),  # released by someone else
        qjob(11, 1, partition="gpu,cpu"),  # held for the loop, several partitions: handed back
        qjob(12, 1, partition="cpu,gpu", admin_comment=""),  # not ours
    ]
    nodes = [
        ninfo(NAMES[0], 4),
        ninfo(NAMES[1]),
        ninfo(NAMES[2], state="IDLE+DRAIN"),
        ninfo(NAMES[3]),
    ]
    obs = build_observation(
        queue, nodes, TOPO, ["gpu"], 200.0, mode="active", inflight={9: Placement.of([(1, 3)])},
        link_load={NAMES[3]: 60e9},
    )  # fmt: skip
    assert sorted(obs.managed) == [1, 2]
    assert obs.shapes[2] == Shape(2, 4)
    # a policy sees the shape and the time limit Slurm has, as backfill's estimates need
    pending = {p.job.job_id: p.job for p in obs.state.pending}
    assert (pending[2].nodes, pending[2].time_limit) == (2, 600.0)
    assert (pending[1].nodes, pending[1].time_limit) == (1, 600.0)
    assert list(obs.refused) == [3, 11] and "needs 6 node(s)" in obs.refused[3]
    assert [q.job_id for q in obs.no_gpu] == [4, 3, 11]  # handed back unchanged
    assert obs.foreign_held == 2 and [q.job_id for q in obs.bypassed] == [10]
    assert obs.state.free_gpus == (0, 1, 0, 4)  # busy, in flight, drained, idle
    assert [r.job.job_id for r in obs.state.running] == [6]
    assert obs.state.link_flows[3] == round(60e9 / (TOPO.nodes[3].nic_gbps * 1e9))
    shadow = build_observation(queue, nodes, TOPO, ["gpu"], 200.0, mode="shadow")
    assert [p.job.job_id for p in shadow.state.pending] == [5, 10]


def test_observation_annotates_jobs_with_the_serving_predictor() -> None:
    """Jobs are what squeue shows (user, name, shape, limit) with the predictions of the
    serving package's predictor; a running job's attained service is its GPUs x its time
    since it started; without a predictor the jobs carry no predictions."""
    past = [Job(i, float(i), 2, 300.0 * (1 + i % 3), user="u", name="j1") for i in range(10)]
    predictor = RuntimePredictor.fit(past)
    queue = [
        qjob(1, 2),
        qjob(6, 4, state="RUNNING", nodes=(NAMES[0],), start_time=90.0, held=False),
    ]
    nodes = [ninfo(n) for n in NAMES]
    obs = build_observation(queue, nodes, TOPO, ["gpu"], 200.0, mode="active", predictor=predictor)
    (pending,) = obs.state.pending
    (running,) = obs.state.running
    assert (pending.job.user, pending.job.name) == ("u", "j1")
    assert pending.job.pred_s == predictor.predict(pending.job)[0]  # its (user, name) group
    assert running.job.predicted and running.attained_at(200.0) == 4 * 110.0
    bare = build_observation(queue, nodes, TOPO, ["gpu"], 200.0, mode="active")
    assert not any(p.job.predicted for p in bare.state.pending)


def test_check_start_validates_shape_and_free_gpus() -> None:
    free = [4, 2, 0, 4]
    assert check_start(Placement.of([(0, 4), (3, 4)]), Shape(2, 4), free, TOPO) is None
    assert "shape" in str(check_start(Placement.of([(0, 4)]), Shape(2, 2), free, TOPO))
    assert "busy" in str(check_start(Placement.of([(1, 4)]), Shape(1, 4), free, TOPO))


def make_backend(
    tmp_path: Path, client: FakeClient, *, cluster: str = "", **cfg: Any
) -> SlurmBackend:
    config = ServeConfig(
        mode="active", partitions=("gpu",), db=str(tmp_path / "s.duckdb"),
        state_dir=str(tmp_path / "state"), interval_s=0.01, lease_s=120.0, watchdog=False, **cfg,
    )  # fmt: skip
    metrics = ServeMetrics()
    holder = PolicyHolder(
        PolicySpec.parse("fifo"), PolicySpec.parse("fifo"), metrics=metrics, logger=LOG
    )
    recorder = Recorder(config.db, config.spool_path, logger=LOG)
    return SlurmBackend(
        client, TOPO, config, GuardedPolicy(holder, metrics, LOG), recorder, metrics,  # type: ignore[arg-type]
        cluster=cluster, logger=LOG, sleep=lambda s: None, lease_dir=tmp_path / "leases",
    )  # fmt: skip


def test_the_loop_observes_with_the_serving_packages_predictor(tmp_path: Path) -> None:
    """The policy about to decide brings its run-time predictor (a learned package's): the
    jobs the loop observes carry its predictions; a heuristic brings none."""
    fitted = RuntimePredictor.fit([Job(i, float(i), 1, 900.0) for i in range(5)])

    @dataclass(frozen=True)
    class Packaged:
        predictor: RuntimePredictor
        name: str = "packaged"

        def decide(self, state: Any) -> Decision:
            return Decision()

    client = FakeClient([qjob(1, 4)], [ninfo(n) for n in NAMES], FakeRunner())
    backend = make_backend(tmp_path, client)
    assert not backend.observe().pending[0].job.predicted  # fifo: no predictor
    holder = backend.policy.holder
    holder.current = LoadedPolicy(Packaged(fitted), "model:x", "v1", "obs")
    (pending,) = backend.observe().pending
    assert (pending.job.pred_s, pending.job.pred_hi_s) == (600.0, 600.0)  # capped at its limit


def test_the_loop_exports_observed_against_predicted_slowdown(tmp_path: Path) -> None:
    """A running job with telemetry in the store and a learned profile the cluster's
    calibration holds gets its slowdown series on /metrics (deployer/drift.py; the scenario:
    tests/_drift.py, up to now): 0.5 alone, 0.4 now, alone in Slurm's view now (predicted 1);
    a running job the accounting does not hold yet is counted; no calibration, every job
    counted."""
    now = time.time()
    con = open_store(tmp_path / "s.duckdb")
    try:
        _drift.fill(con, labelled=True, base=now - 1500.0, now=now)
    finally:
        con.close()
    running = [
        qjob(1, 8, 2, state="RUNNING", nodes=tuple(NAMES[:2]), start_time=now - 1490, held=False),
        qjob(99, 4, state="RUNNING", nodes=(NAMES[3],), start_time=now - 60, held=False),
    ]
    client = FakeClient(running, [ninfo(n, 4 if n != NAMES[2] else 0) for n in NAMES], FakeRunner())
    backend = make_backend(tmp_path, client)
    backend.observe()
    text = backend.metrics.text()
    assert 'linkwise_serve_slowdown_unobserved_jobs{reason="no_calibration"} 2.0' in text
    assert "linkwise_serve_slowdown_ratio{" not in text
    backend.drift = DriftMonitor(TOPO, CLUSTER, _drift.calibration, logger=LOG)
    # the book learned from earlier runs names j1 (its own run has not ended: not in the store)
    backend.learned_book.book, backend.learned_book.read_at = _drift.book(), float("inf")
    backend.observe()
    text = backend.metrics.text()
    observed = _drift.ALONE / _drift.SLOWED
    assert f'linkwise_serve_slowdown_observed{{job_id="1"}} {observed}' in text
    assert 'linkwise_serve_slowdown_predicted{job_id="1"} 1.0' in text
    assert f'linkwise_serve_slowdown_ratio{{job_id="1"}} {observed}' in text
    assert 'linkwise_serve_slowdown_unobserved_jobs{reason="not_in_store"} 1.0' in text


def test_active_audits_before_acting_and_releases_on_shutdown(tmp_path: Path) -> None:
    db = tmp_path / "s.duckdb"

    def audited_first(args: list[str]) -> None:
        con = duckdb.connect(str(db), read_only=True)
        rows = con.execute("SELECT command, outcome FROM audit").fetchall()
        con.close()
        assert [json.dumps(args), "pending"] in [list(r) for r in rows], args

    runner = FakeRunner(audited_first)
    client = FakeClient([qjob(1, 4), qjob(2, 8, 2), qjob(3, 4)], [ninfo(n) for n in NAMES], runner)
    backend = make_backend(tmp_path, client)
    backend.start()
    state = backend.observe()
    backend.apply(
        Decision(
            starts=(
                Start(1, Placement.of([(3, 4)])),
                Start(2, Placement.of([(0, 4), (1, 4)])),
                Start(3, Placement.of([(3, 4)])),  # same node again: no room left -> refused
            )
        )
    )
    assert state.total_free_gpus == 16
    assert runner.commands == [
        ["scontrol", "update", "JobId=1", f"ReqNodeList={NAMES[3]}", "NumNodes=1"],
        ["scontrol", "release", "1"],
        ["scontrol", "update", "JobId=2", f"ReqNodeList={NAMES[0]},{NAMES[1]}", "NumNodes=2"],
        ["scontrol", "release", "2"],
    ]
    lease = read_lease(backend.keeper.path)
    assert lease is not None and sorted(lease.held) == [1, 2, 3] and lease.state == "active"
    con = open_store(db)
    notes = dict(con.execute("SELECT job_id, note FROM decisions").fetchall())
    assert notes[1] == notes[2] == "applied" and notes[3].startswith("rejected: busy")
    assert con.execute("SELECT count(*) FROM audit WHERE outcome = 'ok'").fetchone() == (4,)
    con.close()
    runner.commands.clear()
    runner.on_run = lambda args: client._queue.clear()  # released: no longer held
    admin = qjob(4, 4, reason="JobHeldAdmin")
    client._queue = [qjob(3, 4), admin, qjob(5, 1, admin_comment="")]
    assert backend.shutdown() == [3]  # neither the admin's hold nor the user's own
    assert runner.commands == [["scontrol", "release", "3"]]
    lease = read_lease(backend.keeper.path)
    assert lease is not None and lease.released


def test_slurm_outage_is_retried_and_the_loop_resumes(tmp_path: Path) -> None:
    client = FakeClient([qjob(1, 4)], [ninfo(n) for n in NAMES], FakeRunner())
    client.fail_reads = 2
    backend = make_backend(tmp_path, client)
    state = backend.observe()
    assert backend.cycles_failed == 2 and [p.job.job_id for p in state.pending] == [1]


def test_jobs_held_too_long_go_back_to_slurm(tmp_path: Path) -> None:
    runner = FakeRunner()
    client = FakeClient([qjob(1, 4)], [ninfo(n, 4) for n in NAMES], runner)
    backend = make_backend(tmp_path, client, max_hold_s=0.0)
    backend.start()
    backend.observe()
    backend.first_seen[1] = time.time() - 5
    backend.apply(Decision())
    assert runner.commands == [["scontrol", "release", "1"]]


def test_policy_holder_falls_back_reloads_and_keeps_the_previous_model() -> None:
    metrics = ServeMetrics()
    token = {"v": "1"}
    broken = {"v": False}

    def loader(spec: str) -> LoadedPolicy:
        if broken["v"]:
            raise ValueError("checksum mismatch")
        return LoadedPolicy(make_policy("best_fit"), spec, f"v{token['v']}", "obs1")

    holder = PolicyHolder(
        PolicySpec.parse("model:champion"), PolicySpec.parse("fifo"), metrics=metrics, logger=LOG,
        reload_s=0.0, loader=loader,
        probe=lambda _s: token["v"],
    )  # fmt: skip
    assert holder.active.model_version == "v1"
    token["v"] = "2"  # the alias moved
    holder.refresh(now=1.0)
    assert holder.active.model_version == "v2"
    token["v"], broken["v"] = "3", True  # the new version is corrupt: keep v2
    holder.refresh(now=2.0)
    assert holder.active.model_version == "v2"
    fresh = PolicyHolder(
        PolicySpec.parse("model:champion"), PolicySpec.parse("fifo"), metrics=metrics, logger=LOG,
        loader=loader,
        probe=lambda _s: "9",
    )  # fmt: skip
    assert fresh.active.name == "fifo" and "checksum mismatch" in fresh.fallback_reason
    assert 'linkwise_serve_fallbacks_total{reason="model_unavailable"} 1.0' in metrics.text()


def test_recorder_spools_while_the_store_is_locked_and_replays(tmp_path: Path) -> None:
    db = tmp_path / "s.duckdb"
    open_store(db).close()
    rec = Recorder(str(db), tmp_path / "spool.jsonl", logger=LOG)
    row = {"decision_id": "a", "run_id": "r", "cycle_id": 1, "ts": 1.0, "mode": "shadow",
           "cluster": "c", "partition": "gpu", "policy": "fifo", "model_version": "h",
           "obs_spec_version": "", "job_id": None, "action": "wait", "nodes": "", "gpus": 0,
           "latency_ms": 0.1, "n_pending": 0, "note": ""}  # fmt: skip
    holder = subprocess.Popen(
        [sys.executable, "-c", f"import duckdb,time; c=duckdb.connect({str(db)!r}); "
         "print('locked', flush=True); time.sleep(600)"],  # killed below
        stdout=subprocess.PIPE,
    )  # fmt: skip
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == b"locked"
        assert rec.write(decisions=[row]) == "spool"
        assert rec.spooled() == 1
    finally:
        holder.kill()
        holder.wait()
    assert rec.write(decisions=[{**row, "decision_id": "b", "cycle_id": 2}]) == "store"
    assert rec.spooled() == 0
    con = duckdb.connect(str(db), read_only=True)
    assert con.execute("SELECT cycle_id FROM decisions ORDER BY 1").fetchall() == [(1,), (2,)]
    con.close()


def test_a_start_seen_during_a_store_outage_is_joined_once_the_store_is_back(
    tmp_path: Path,
) -> None:
    """The actual start of a started job is joined when the store takes it: a join that
    came during an outage (records spooled) is kept and applied by a later cycle."""
    client = FakeClient([qjob(1, 1)], [ninfo(n) for n in NAMES], FakeRunner())
    backend = make_backend(tmp_path, client)
    backend.start()
    backend.observe()
    backend.apply(Decision(starts=(Start(1, Placement.of([(3, 1)])),)))
    client._queue = [
        qjob(1, 1, state="RUNNING", held=False, nodes=(NAMES[3],), start_time=150.0, reason="")
    ]
    store_open = backend.recorder._open

    def locked(path: str) -> Any:
        raise duckdb.IOException(f'Could not set lock on file "{path}": Conflicting lock')

    backend.recorder._open = locked
    backend.observe()
    backend.apply(Decision())  # Slurm started it: seen while the store is locked
    assert backend.recorder.spooled() > 0
    backend.recorder._open = store_open
    backend.observe()
    backend.apply(Decision())
    con = duckdb.connect(str(tmp_path / "s.duckdb"), read_only=True)
    joined = con.execute(
        "SELECT actual_start, actual_nodes FROM decisions WHERE job_id = 1 AND action = 'start'"
    ).fetchall()
    con.close()
    assert joined == [(150.0, NAMES[3])]
    backend.shutdown()


def test_lease_expires_when_its_owner_is_gone(tmp_path: Path) -> None:
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    lease = Lease(dead.pid, None, time.time() + 60, ("gpu",), None, None, "r")
    assert lease_expired(lease, time.time())
    import os

    mine = Lease(os.getpid(), None, time.time() + 60, ("gpu", "b"), None, None, "r")
    assert not lease_expired(mine, time.time())
    assert lease_expired(mine, time.time() + 61)
    path = tmp_path / "lease.json"
    write_lease(path, mine)
    assert read_lease(path) == mine
    line = [str(int(mine.expires_at)), str(os.getpid()), "0", os.uname().nodename]
    for part in ("gpu", "b"):  # job_submit.lua's input, one file per partition
        assert (tmp_path / f"{part}.expires").read_text().split() == line
    write_lease(path, replace(mine, state="releasing"))
    assert (tmp_path / "gpu.expires").read_text().split()[0] == "0"


def test_serve_config_rejects_a_lease_shorter_than_two_cycles() -> None:
    with pytest.raises(ValueError, match="two cycles"):
        ServeConfig(mode="active", partitions=("gpu",), interval_s=5, lease_s=6)


def test_a_registry_model_is_recorded_by_its_version_number(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Promotion's shadow evidence looks decisions up by registry version: record that."""
    from types import SimpleNamespace

    import linkwise.models.build as build
    from linkwise.deployer import policies as loop

    fake = SimpleNamespace(  # a loaded package as load_source gives it (policy.json: meta)
        package_dir="models:/linkwise-policy/7", spec=SimpleNamespace(version="obs-x"), meta={}
    )
    monkeypatch.setattr(build, "load_source", lambda source, **_kw: fake)
    loaded = loop._learned(PolicySpec.parse("model:champion"))
    assert (loaded.model_version, loaded.obs_spec_version) == ("7", "obs-x")
    fake.package_dir = "/srv/packages/abc"
    assert loop._learned(PolicySpec.parse("model:/srv/packages/abc")).model_version == (
        "/srv/packages/abc"
    )


# ---------------------------------------------------------------- issue 12


def test_partition_locks_refuse_any_overlap_and_free_on_kill(tmp_path: Path) -> None:
    first = lock_partitions(tmp_path, ["b", "a"], "loop one")
    with pytest.raises(LeaseTaken, match=r"partition a is managed by another loop \(loop one"):
        lock_partitions(tmp_path, ["zz", "a"], "loop two")
    lock_partitions(tmp_path, ["zz"], "loop three").close()  # disjoint: fine (and freed)
    first.close()
    code = "import sys, time; from linkwise.deployer.locks import lock_partitions as L; "
    code += f"L({str(tmp_path)!r}, ['a'], 'child'); print('locked', flush=True); time.sleep(60)"
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert child.stdout is not None and child.stdout.readline().strip() == "locked"
    with pytest.raises(LeaseTaken, match="child"):
        lock_partitions(tmp_path, ["a"], "me")
    os.kill(child.pid, signal.SIGKILL)
    child.wait()
    lock_partitions(tmp_path, ["a", "b"], "me", wait_s=2).close()  # the kernel dropped it


def test_the_lease_is_per_cluster_and_sorted_partition_set() -> None:
    conf = "ClusterName=c1\nSlurmctldHost=ctl(10.0.0.1)\nSlurmctldPort=6817\n"
    assert lease_dir_for("/r", conf) == Path("/r/c1-ctl-6817")
    assert lease_dir_for("/r", conf.replace("6817", "7817")) != lease_dir_for("/r", conf)
    one = ServeConfig(mode="active", partitions=("b", "a"), state_dir="/x")
    two = ServeConfig(mode="active", partitions=("a", "b"), state_dir="/y")
    assert one.lease_name == two.lease_name == "lease-a_b.json"
    with pytest.raises(ValueError, match="invalid partition"):
        ServeConfig(mode="active", partitions=("../etc",))


def test_hand_back_stops_new_holds_before_each_sweep(tmp_path: Path) -> None:
    path = tmp_path / "lease-gpu.json"
    lease = Lease(os.getpid(), None, time.time() + 60, ("gpu",), None, None, "r")
    write_lease(path, lease)
    seen: list[str] = []

    class Watching(FakeClient):
        def queue(self) -> list[QueuedJob]:
            seen.append((tmp_path / "gpu.expires").read_text().split()[0])
            return super().queue()

    runner = FakeRunner()
    client = Watching([qjob(1, 1), qjob(2, 1, reason="JobHeldAdmin")], [], runner)
    recorder = Recorder(None, tmp_path / "spool.jsonl", logger=LOG)
    sleeps: list[float] = []
    released = hand_back(
        client, path, lease, recorder, actor="t", logger=LOG, grace_s=1.5,  # type: ignore[arg-type]
        sleep=sleeps.append,
    )  # fmt: skip
    assert seen == ["0", "0"] and sleeps == [1.5]  # marked first, swept twice
    assert released == [1, 1] and ["scontrol", "release", "2"] not in runner.commands
    # without job_submit.lua nothing ends the tag with the release: the second sweep does
    client._queue = [qjob(1, 1, held=False, admin_comment=HOLD_TAG, reason="Priority")]
    runner.commands.clear()
    hand_back(
        client, path, lease, recorder, actor="t", logger=LOG, sleep=sleeps.append,  # type: ignore[arg-type]
    )  # fmt: skip
    assert runner.commands == []  # not released by this hand-back: not its to untag
    client._queue = [qjob(1, 1)]
    runner.on_run = lambda args: client._queue.__setitem__(
        0, qjob(1, 1, held=False, admin_comment=HOLD_TAG, reason="Priority")
    )
    hand_back(
        client, path, lease, recorder, actor="t", logger=LOG, sleep=sleeps.append,  # type: ignore[arg-type]
    )  # fmt: skip
    assert runner.commands == [["scontrol", "release", "1"], untag_command(1)]
    assert (read_lease(path) or lease).state == "released"


def test_a_bypassed_hold_is_counted_and_untagged(tmp_path: Path) -> None:
    runner = FakeRunner()
    gone = qjob(5, 2, held=False, admin_comment=HOLD_TAG, reason="Priority")
    client = FakeClient([gone], [ninfo(n) for n in NAMES], runner)
    backend = make_backend(tmp_path, client)
    backend.start()
    backend.observe()
    backend.apply(Decision())
    assert runner.commands == [untag_command(5)]
    assert "linkwise_serve_hold_bypasses_total 1.0" in backend.metrics.text()
    backend.hand_backs.released_ids.add(6)  # one the loop released itself: untagged, not counted
    client._queue = [replace(gone, job_id=6)]
    backend.observe()
    backend.apply(Decision())
    assert "linkwise_serve_hold_bypasses_total 1.0" in backend.metrics.text()
    backend.shutdown()


def test_a_new_loop_waits_for_a_watchdog_handing_back(tmp_path: Path) -> None:
    import threading

    backend = make_backend(tmp_path, FakeClient([], [ninfo(n) for n in NAMES], FakeRunner()))
    locks = lock_partitions(backend.keeper.path.parent, ["gpu"], f"{WATCHDOG_HOLDER} (pid 1)")
    threading.Timer(0.5, locks.close).start()
    t0 = time.monotonic()
    backend.start()  # waits instead of refusing
    assert time.monotonic() - t0 >= 0.4 and backend.keeper.lease is not None
    other = make_backend(tmp_path, FakeClient([], [], FakeRunner()))
    with pytest.raises(LeaseTaken, match="another loop"):
        other.start()  # a live loop: refused at once
    backend.shutdown()


def test_a_watchdog_leaves_a_later_runs_lease_to_that_runs_watchdog(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A watchdog of an earlier run must not act on the lease a later loop wrote over the
    same file (the later loop has its own watchdog; two would race for its jobs)."""
    import os

    from linkwise.deployer.watchdog import watch

    path = tmp_path / "lease.json"
    later = Lease(os.getpid(), None, time.time() - 5, ("gpu",), None, None, "run-b")
    write_lease(path, later)  # expired: the earlier run's watchdog would sweep it
    with caplog.at_level(logging.INFO, logger="linkwise.watchdog"):
        # max_s only ends a watchdog that stayed (a failure, told apart by its log below)
        assert watch(path, poll_s=0.1, max_s=60.0, run_id="run-a") == 0
    events = [json.loads(r.getMessage()) for r in caplog.records if r.name == "linkwise.watchdog"]
    # it left at once, on its first look, instead of sweeping (no load-dependent clock)
    assert [e["event"] for e in events] == ["watchdog_exit"], events
    assert events[0]["reason"] == "a later run of the loop holds the lease"
    assert read_lease(path) == later  # untouched


def _events(caplog: pytest.LogCaptureFixture, event: str) -> list[dict[str, Any]]:
    found = [json.loads(r.getMessage()) for r in caplog.records if r.name == LOG.name]
    return [e for e in found if e["event"] == event]


def test_slurm_read_faults_hand_back_held_jobs_once_and_back_off(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A parse fault (TypeError) and Slurm errors: the jobs the last good read showed held
    for the loop in its partitions are released once, one log line per fault without a
    traceback, the wait doubles to backoff_max_s, every fault counted by kind, and the lease
    is renewed again only by the first good read."""
    runner = FakeRunner()
    queue = [
        qjob(1, 4),
        qjob(2, 4, partition="other"),  # held for another loop's partition: not ours
        qjob(3, 4, held=False),
        qjob(4, 1, reason="JobHeldAdmin"),  # an administrator's hold
    ]
    client = FakeClient(queue, [ninfo(n) for n in NAMES], runner)
    backend = make_backend(tmp_path, client, backoff_max_s=0.04)
    backend.start()
    backend.observe()  # the last good read
    renewals: list[int] = []
    renew = backend.keeper.renew
    backend.keeper.renew = lambda held: (renewals.append(len(client.faults)), renew(held))[1]  # type: ignore[method-assign]
    client.faults = [
        TypeError("'NoneType' object is not subscriptable"),
        SlurmError("squeue: error: Invalid user"),
        SlurmSchemaError("squeue printed v0.0.99"),
        SlurmError("squeue: error: again"),
    ]
    with caplog.at_level(logging.INFO, logger=LOG.name):
        state = backend.observe()
    assert [p.job.job_id for p in state.pending] == [1]  # the loop resumed
    assert runner.commands == [["scontrol", "release", "1"]]  # once, ours only
    failed = _events(caplog, "slurm_read_failed")
    assert [e["kind"] for e in failed] == ["parse", "command", "schema", "command"]
    assert [e["retry_in_s"] for e in failed] == [0.01, 0.02, 0.04, 0.04]
    assert [e["released"] for e in failed] == [[1], [], [], []]
    assert failed[0]["error_type"] == "TypeError" and "subscriptable" in failed[0]["error"]
    assert not any(r.exc_info for r in caplog.records) and "Traceback" not in caplog.text
    text = backend.metrics.text()
    assert 'linkwise_serve_handed_back_total{reason="slurm_fault"} 1.0' in text
    for kind, n in (("parse", 1), ("command", 2), ("schema", 1), ("unavailable", 0)):
        assert f'linkwise_slurm_read_errors_total{{kind="{kind}"}} {n:.1f}' in text
    assert backend.cycles_failed == 4
    # the cycle's renewal before the first read, none while reads fail, then the good read's
    assert renewals == [4, 0]
    lease = read_lease(backend.keeper.path)
    assert lease is not None and lease.state == "active" and lease.expires_at > time.time()
    # the next good read sees job 1 released by the loop: not a bypass of its hold
    client._queue = [replace(queue[0], held=False, reason="Priority"), *queue[1:]]
    backend.observe()
    backend.apply(Decision())
    assert "linkwise_serve_hold_bypasses_total 0.0" in backend.metrics.text()


def test_the_fault_kinds_and_no_hand_back_while_slurm_is_unreachable(tmp_path: Path) -> None:
    faults: list[tuple[Exception, str]] = [
        (SlurmUnavailable("squeue: Unable to contact slurm controller"), "unavailable"),
        (SlurmTimeout("squeue did not answer in 30 s"), "timeout"),
        (SlurmSchemaError("v0.0.99"), "schema"),
        (SlurmError("squeue: exit 1"), "command"),
        (KeyError("jobs"), "parse"),
        (TypeError("bad"), "parse"),
        (ValueError("bad"), "parse"),
    ]
    assert [read_fault_kind(e) for e, _ in faults] == [k for _, k in faults]
    runner = FakeRunner()
    client = FakeClient([qjob(1, 4)], [ninfo(n) for n in NAMES], runner)
    backend = make_backend(tmp_path, client)
    backend.start()
    backend.observe()
    client.faults = [faults[0][0], faults[1][0]]
    backend.observe()
    assert runner.commands == [] and backend.cycles_failed == 2


def test_drive_keeps_cycling_through_read_faults(tmp_path: Path) -> None:
    client = FakeClient([qjob(1, 4)], [ninfo(n, 4) for n in NAMES], FakeRunner())
    client.faults = [KeyError("job_id"), SlurmError("sinfo: exit 1")]
    backend = make_backend(tmp_path, client, max_cycles=3)
    assert drive(backend, backend.policy) == 3
    assert (backend.cycles_ok, backend.cycles_failed) == (3, 2)


def test_sigterm_during_the_backoff_ends_serve_promptly(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Slurm fails and the loop waits a second between reads: SIGTERM ends the wait within
    about 0.2 s and serve shuts down as usual, handing back what is held for it."""
    conf = tmp_path / "slurm.conf"
    conf.write_text(
        "ClusterName=t\nSlurmctldHost=h\nNodeName=n[1-4] CPUs=8 Gres=gpu:4\n"
        "PartitionName=gpu Nodes=n[1-4]\n"
    )
    env = tmp_path / "env"
    env.write_text(f"SLURM_CONF={conf}\nLINKWISE_SLURM_CLUSTER=t\n")
    stop_at: list[float] = []
    failed = threading.Semaphore(0)

    class Down(FakeClient):
        def queue(self) -> list[QueuedJob]:
            if not stop_at:  # down until the signal; the shutdown's sweeps then read
                failed.release()
                raise SlurmError("squeue: error: Invalid user for SlurmUser slurm")
            return list(self._queue)

    runner = FakeRunner()
    client = Down([qjob(1, 4)], [ninfo(f"n{i}") for i in range(1, 5)], runner)
    runner.on_run = lambda args: client._queue.clear()
    config = ServeConfig(
        mode="active", partitions=("gpu",), slurm_env=str(env), db=str(tmp_path / "s.duckdb"),
        state_dir=str(tmp_path / "state"), interval_s=1.0, lease_s=2.0, watchdog=False,
        lease_root=str(tmp_path / "leases"),
    )  # fmt: skip

    def term() -> None:
        # 0.1 s into the second wait (1 s, then 2 s): the signal always meets a backoff, however
        # long start-up takes on a loaded machine
        for _ in range(2):
            failed.acquire(timeout=120)  # (signals anyway after that: no hang)
        time.sleep(0.1)
        stop_at.append(time.time())
        os.kill(os.getpid(), signal.SIGTERM)

    handlers = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    killer = threading.Thread(target=term)
    try:
        with caplog.at_level(logging.INFO, logger=LOG.name):
            killer.start()
            summary = serve(config, client=client, logger=LOG, install_signals=True)  # type: ignore[arg-type]
    finally:
        killer.join()
        signal.signal(signal.SIGTERM, handlers[0])
        signal.signal(signal.SIGINT, handlers[1])
    (stopped,) = _events(caplog, "stopped_during_backoff")
    assert stopped["ts"] - stop_at[0] < 1.5  # not the rest (1.9 s) of the 2 s wait
    assert summary["released"] == [1] and summary["cycles"] == 0
    assert runner.commands == [["scontrol", "release", "1"]]
    assert _events(caplog, "serve_stop")


def test_the_watchdog_runs_slurm_commands_from_the_leases_bin_dir(tmp_path: Path) -> None:
    """LINKWISE_SLURM_BIN reaches the watchdog through the lease (a chroot Slurm's wrappers)."""
    runner = FakeRunner()
    runner.bin_dir = str(tmp_path / "slurm-bin")
    backend = make_backend(tmp_path, FakeClient([], [ninfo(n) for n in NAMES], runner))
    backend.start()
    lease = read_lease(backend.keeper.path)
    assert lease is not None and lease.slurm_bin == runner.bin_dir
    client, _ = _tools(lease, backend.keeper.path)
    assert client.runner.bin_dir == runner.bin_dir
    backend.shutdown()


def test_cycle_lines_log_changes_and_an_idle_heartbeat_once_a_minute() -> None:
    lines = CycleLines()
    seen = ("fifo", "", (), "store")
    # the first cycle, then 2 s cycles over the same state: silent, one idle line a minute
    got = [lines.note(seen, False, 2.0 * i) for i in range(61)]
    assert got[0] == ("cycle", 0)
    assert [(i, g) for i, g in enumerate(got) if g[0]] == [(0, ("cycle", 0)), (30, ("idle", 30)),
                                                           (60, ("idle", 30))]  # fmt: skip
    assert got[1] == ("", 1) and got[59] == ("", 29)
    assert lines.note(seen, True, 122.0) == ("cycle", 0)  # a cycle that did something
    assert lines.note(("fifo", "", (7,), "store"), False, 124.0) == ("cycle", 0)  # a new job
    assert lines.note(("fifo", "", (7,), "spool"), False, 126.0) == ("cycle", 0)  # an outage
    assert lines.note(("fifo", "", (7,), "spool"), False, 128.0) == ("", 1)


def test_an_idle_loop_logs_its_first_cycle_and_then_only_what_changes(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Idle cycles (nothing held for the loop, nothing decided) write no line; a job the loop
    cannot place yet is a change (one line), and so are hand-backs; the count of cycles is
    the metrics' and the summary's, not the log's."""
    full = [ninfo(n, 4) for n in NAMES]  # every GPU busy: a held job waits
    runner = FakeRunner()
    client = FakeClient([qjob(9, 1, held=False)], full, runner)

    def leaves_when_released(args: list[str]) -> None:  # Slurm runs it: it leaves the queue
        if args[:2] == ["scontrol", "release"]:
            client._queue[:] = [q for q in client._queue if str(q.job_id) != args[2]]

    runner.on_run = leaves_when_released
    backend = make_backend(tmp_path, client, max_cycles=5)
    backend.start()
    with caplog.at_level(logging.INFO, logger=LOG.name):
        assert drive(backend, backend.policy) == 5
        assert [e["cycle"] for e in _events(caplog, "cycle")] == [1]
        assert not _events(caplog, "idle")
        client._queue.append(qjob(1, 4))  # held for the loop, no room: pending from now on
        client._queue.append(qjob(2, 0))  # no GPUs: handed back to Slurm, once
        backend.cfg = replace(backend.cfg, max_cycles=9)
        drive(backend, backend.policy)
    assert [e["cycle"] for e in _events(caplog, "cycle")] == [1, 6]
    assert [e["job_id"] for e in _events(caplog, "handing_to_slurm")] == [2]
    assert backend.cycles_ok == 9
    assert 'linkwise_serve_cycles_total{outcome="ok"} 9.0' in backend.metrics.text()
    backend.shutdown()


def test_a_shadow_loop_deciding_the_same_starts_again_logs_them_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Shadow mode applies nothing: a job Slurm leaves pending (a later --begin, its
    priority) is started by the policy every cycle; the same decision again is no news."""
    client = FakeClient([qjob(1, 2, held=False)], [ninfo(n) for n in NAMES], FakeRunner())
    config = ServeConfig(
        mode="shadow", partitions=("gpu",), db=str(tmp_path / "s.duckdb"),
        state_dir=str(tmp_path / "state"), interval_s=0.01, max_cycles=4, watchdog=False,
    )  # fmt: skip
    metrics = ServeMetrics()
    holder = PolicyHolder(
        PolicySpec.parse("fifo"), PolicySpec.parse("fifo"), metrics=metrics, logger=LOG
    )
    guarded = GuardedPolicy(holder, metrics, LOG)
    backend = ShadowBackend(
        client, TOPO, config, guarded, Recorder(config.db, config.spool_path, logger=LOG),  # type: ignore[arg-type]
        metrics, logger=LOG, sleep=lambda s: None, lease_dir=tmp_path / "leases",
    )  # fmt: skip
    backend.start()
    with caplog.at_level(logging.INFO, logger=LOG.name):
        assert drive(backend, guarded) == 4
        assert [(e["cycle"], e["starts"]) for e in _events(caplog, "cycle")] == [(1, 1)]
        client._queue.append(qjob(2, 1, held=False))  # a new job: a new decision
        backend.cfg = replace(backend.cfg, max_cycles=6)
        drive(backend, guarded)
    assert [(e["cycle"], e["starts"]) for e in _events(caplog, "cycle")] == [(1, 1), (5, 2)]


def test_the_clusters_fit_in_the_tracking_store_gives_live_jobs_their_learned_profile(
    tmp_path: Path,
) -> None:
    """serve's calibration is the cluster's fit logged in the tracking store (no package,
    no flag): a heuristic's live path gives the bert job its learned profile (counted as
    learned on /metrics), and the drift monitor predicts with that fit."""
    _profile_runs.fill_profile_store(tmp_path / "s.duckdb")
    uri = f"sqlite:///{tmp_path / 'ml' / 'mlflow.db'}"
    run_id = log_cluster_calibration(uri, _profile_runs.fitted(), CLUSTER)
    queue = [qjob(1, 4, name="bert"), qjob(3, 4, name="new")]
    client = FakeClient(queue, [ninfo(n) for n in NAMES], FakeRunner())
    backend = make_backend(tmp_path, client, cluster=CLUSTER)
    fifo = PolicySpec.parse("fifo")
    holder = PolicyHolder(
        fifo, fifo, metrics=backend.metrics, logger=LOG,
        calibrate=CalibrationResolver(None, CLUSTER, uri),
    )  # fmt: skip
    backend.policy = GuardedPolicy(holder, backend.metrics, LOG)
    got = {p.job.job_id: p.job.profile for p in backend.observe().pending}
    assert got[1] == _profile_runs.BERT and not got[3].startswith("history:")
    text = backend.metrics.text()
    assert 'linkwise_serve_job_profiles{source="learned"} 1.0' in text
    assert f'linkwise_serve_calibration_info{{run_id="{run_id}",source="cluster-fit"}}' in text
    assert backend._drift_calibration() == _profile_runs.fitted()


def test_the_loop_gives_jobs_their_learned_profile_where_the_calibration_holds_it(
    tmp_path: Path,
) -> None:
    """The store holds earlier runs' telemetry of bert and gpt (tests/_profile_runs.py): with
    a policy predicting with a calibration fitted on bert, a bert job gets its learned profile,
    the others their declared one or the default; /metrics counts the sources. A policy with
    the shipped calibration learns nothing (no job could use it)."""
    _profile_runs.fill_profile_store(tmp_path / "s.duckdb")

    @dataclass(frozen=True)
    class Calibrated:
        model: AnalyticModel
        name: str = "calibrated"

        def decide(self, state: Any) -> Decision:
            return Decision()

    queue = [
        qjob(1, 4, name="bert"),
        qjob(2, 4, name="gpt", comment="linkwise:profile=ncf"),
        qjob(3, 4, name="new"),
    ]
    client = FakeClient(queue, [ninfo(n) for n in NAMES], FakeRunner())
    backend = make_backend(tmp_path, client, cluster=CLUSTER)  # the store's cluster
    backend.observe()
    text = backend.metrics.text()
    assert 'linkwise_serve_job_profiles{source="learned"} 0.0' in text
    assert 'linkwise_serve_job_profiles{source="declared"} 1.0' in text
    cal = _profile_runs.fitted()
    backend.policy.holder.current = LoadedPolicy(Calibrated(AnalyticModel(cal)), "m", "v1", "o")
    got = {p.job.job_id: p.job.profile for p in backend.observe().pending}
    assert got[1] == _profile_runs.BERT and got[2] == "ncf"
    assert got[3] in cal.profiles and not got[3].startswith("history:")
    text = backend.metrics.text()
    assert 'linkwise_serve_job_profiles{source="learned"} 1.0' in text
    assert 'linkwise_serve_job_profiles{source="default"} 1.0' in text
