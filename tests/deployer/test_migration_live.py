"""Migration on a real Slurm (deployer/migration.py): a job that checkpoints its step counter
on SIGUSR1 (tests/migration_job.sh) is requeued, restarts on another node with the same job
id and resumes from its checkpoint; a job that did not opt in is never touched; a ``kill -9``
of the loop between ``requeuehold`` and ``release`` leaves the job to the watchdog, which
gets it running. A local cluster of its own (dir and ports), started for this module and
stopped after it, so other work on the shared cluster is not disturbed."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from linkwise.cluster.domain import ClusterState, Decision, Placement, Start
from linkwise.cluster.slurm.client import SlurmClient, read_env_file
from linkwise.cluster.slurm.records import QueuedJob
from linkwise.deployer.loop import ServeConfig, serve
from linkwise.deployer.migration import MigrationConfig, MigrationExecutor, Move
from linkwise.deployer.policies import LoadedPolicy
from linkwise.deployer.recorder import Recorder
from linkwise.tests._store import read_store

pytestmark = pytest.mark.services

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "local-slurm"
JOB = ROOT / "tests" / "migration_job.sh"
LIVE_DIR = "/tmp/lw-slurm-migration"
LIVE_ENV = {"LINKWISE_SLURM_DIR": LIVE_DIR, "LINKWISE_SLURM_PORT_BASE": "18900"}
ENV_FILE = str(Path(LIVE_DIR) / "env")
GRACE = 3
LOG = logging.getLogger("test.migration_live")
# a restart waits for Slurm's credential expiry (10 s here) and a scheduling pass
RESTART_S = 90


@pytest.fixture(scope="module")
def cluster() -> Iterator[dict[str, str]]:
    env = {**os.environ, **LIVE_ENV}
    subprocess.run([str(SCRIPT), "start"], env=env, check=True, capture_output=True, timeout=300)
    try:
        yield read_env_file(ENV_FILE)
    finally:
        subprocess.run([str(SCRIPT), "stop"], env=env, check=False, capture_output=True)


@pytest.fixture(scope="module")
def client(cluster: dict[str, str]) -> SlurmClient:
    return SlurmClient.from_env(cluster, "cli")


@pytest.fixture()
def jobs(client: SlurmClient) -> Iterator[list[int]]:
    """Job ids to cancel after the test."""
    ids: list[int] = []
    yield ids
    for j in ids:
        client.cancel(j)


def wait_for(cond: Callable[[], bool], timeout: float, what: str, step: float = 0.3) -> None:
    deadline = time.time() + timeout
    while not cond():
        assert time.time() < deadline, f"timed out after {timeout} s waiting for {what}"
        time.sleep(step)


def submit_counter(
    client: SlurmClient, work: Path, name: str, node: str, *, opt_in: bool = True
) -> int:
    """The counting job on ``node``; opted in: ``--requeue``, ``--signal=B:USR1@GRACE`` and the
    comment tag (the README's lines); otherwise requeue-able but untagged."""
    work.mkdir(parents=True, exist_ok=True)
    extra = ["--requeue", f"--signal=B:USR1@{GRACE}", f"--nodelist={node}"]
    return client.submit(
        f"exec bash {JOB} {work}",  # the batch shell itself traps the signal
        name=name,
        gpus_per_node=1,
        time_limit_min=15,
        comment=f"linkwise:migratable@{GRACE}" if opt_in else "an ordinary job",
        extra_args=extra,
    )


def job(client: SlurmClient, job_id: int) -> QueuedJob | None:
    return next((q for q in client.queue() if q.job_id == job_id), None)


def running_on(client: SlurmClient, job_id: int, node: str | None = None) -> bool:
    q = job(client, job_id)
    return q is not None and q.state == "RUNNING" and (node is None or q.nodes == (node,))


def counter(work: Path) -> int:
    try:
        return int((work / "counter").read_text() or 0)
    except (OSError, ValueError):
        return 0


def starts(work: Path) -> list[dict[str, str]]:
    """The job's start lines (one per run) as fields."""
    lines = (work / "log").read_text().splitlines()
    return [dict(re.findall(r"(\w+)=(\S+)", x)) for x in lines if x.startswith("start ")]


def checkpoints(work: Path) -> list[int]:
    lines = (work / "log").read_text().splitlines()
    return [int(x.split("step=")[1].split()[0]) for x in lines if x.startswith("checkpoint ")]


def started_counting(client: SlurmClient, job_id: int, node: str, work: Path) -> None:
    wait_for(lambda: running_on(client, job_id, node), 60, f"job {job_id} to run on {node}")
    wait_for(lambda: counter(work) >= 10, 60, f"job {job_id} to count")


def check_resumed(client: SlurmClient, job_id: int, work: Path, node: str | None) -> None:
    """Requeued once, restarted (same id) on ``node`` from its checkpoint, counting on."""
    wait_for(lambda: len(starts(work)) >= 2, RESTART_S, f"job {job_id} to restart")
    wait_for(lambda: running_on(client, job_id, node), 120, f"job {job_id} to run on {node}")
    first, second = starts(work)[:2]
    assert first["restart"] == "0" and second["restart"] == "1", starts(work)
    assert first["job"] == second["job"] == str(job_id)
    saved = checkpoints(work)
    assert saved and saved[0] >= 10, saved  # it checkpointed on the signal, before requeue
    assert int(second["step"]) == saved[0]  # resumed from the checkpoint, not from 0
    if node is not None:
        assert second["node"] == node and first["node"] != node
    wait_for(lambda: counter(work) > saved[0] + 10, 60, f"job {job_id} to count on")
    assert client.show_job(job_id)["Restarts"] == "1"


def untouched(client: SlurmClient, job_id: int, work: Path, node: str) -> None:
    assert running_on(client, job_id, node)
    assert client.show_job(job_id)["Restarts"] == "0"
    assert len(starts(work)) == 1 and checkpoints(work) == []  # never signalled nor requeued


def test_the_executor_migrates_an_opted_in_job_and_leaves_the_other_alone(
    client: SlurmClient, tmp_path: Path, jobs: list[int]
) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    jobs.append(submit_counter(client, a, "lw-mig-a", "gpu01"))
    jobs.append(submit_counter(client, b, "lw-mig-b", "gpu02", opt_in=False))
    mover, other = jobs
    started_counting(client, mover, "gpu01", a)
    started_counting(client, other, "gpu02", b)
    db = tmp_path / "store.duckdb"
    registry = CollectorRegistry()
    executor = MigrationExecutor(
        client,
        Recorder(str(db), tmp_path / "spool.jsonl", logger=LOG),
        registry,
        MigrationConfig(grace_s=30, min_run_s=1),
        run_id="test",
        logger=LOG,
    )
    moves = [Move(mover, "migrate", ("gpu04",)), Move(other, "preempt")]
    out = executor.run_now(moves, partitions=("gpu",))
    assert out == {mover: "migrated", other: "refused: not opted in"}
    check_resumed(client, mover, a, "gpu04")
    untouched(client, other, b, "gpu02")
    con = read_store(db)
    rows = con.execute(
        "SELECT job_id, command, outcome, ts, outcome_ts FROM audit ORDER BY ts, outcome_ts"
    ).fetchall()
    con.close()
    assert {r[0] for r in rows} == {mover}  # nothing was ever done to the other job
    verbs = [json.loads(r[1])[1:3] for r in rows]
    assert verbs == [
        ["--batch", "--signal=USR1"],
        ["update", f"JobId={mover}"],
        ["requeuehold", str(mover)],
        ["update", f"JobId={mover}"],
        ["release", str(mover)],
        ["update", f"JobId={mover}"],
    ]
    assert all(r[2] == "ok" and r[3] <= r[4] for r in rows)  # audited before, outcome after
    assert registry.get_sample_value("linkwise_serve_migrations_total", {"mode": "active"}) == 1


class MoveOnce:
    """Asks, in its first decision, to migrate one job to a node and to preempt others."""

    name = "move_once"

    def __init__(self, migrate: tuple[int, int], preempt: tuple[int, ...]) -> None:
        self.migrate = migrate
        self.preempt = preempt
        self.asked = False

    def decide(self, state: ClusterState) -> Decision:
        if self.asked:
            return Decision()
        self.asked = True
        job_id, node = self.migrate
        return Decision(migrate=(Start(job_id, Placement.of([(node, 1)])),), preempt=self.preempt)


def test_the_loop_migrates_and_preempts_what_its_policy_asks(
    client: SlurmClient, tmp_path: Path, jobs: list[int]
) -> None:
    a, b, c = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    jobs.append(submit_counter(client, a, "lw-mig-loop-a", "gpu01"))
    jobs.append(submit_counter(client, b, "lw-mig-loop-b", "gpu02", opt_in=False))
    jobs.append(submit_counter(client, c, "lw-mig-loop-c", "gpu02"))
    mover, other, preempted = jobs
    for j, w, n in ((mover, a, "gpu01"), (other, b, "gpu02"), (preempted, c, "gpu02")):
        started_counting(client, j, n, w)
    cfg = ServeConfig(
        mode="active", partitions=("gpu",), slurm_env=ENV_FILE,
        db=str(tmp_path / "store.duckdb"), state_dir=str(tmp_path / "state"),
        lease_root=str(tmp_path / "leases"), interval_s=0.5, lease_s=60.0, max_cycles=14,
        migration=MigrationConfig(grace_s=30, min_run_s=1),
    )  # fmt: skip
    policy = MoveOnce((mover, 3), (other, preempted))  # node 3: gpu04
    summary = serve(cfg, policy=LoadedPolicy(policy, "move_once", "test:move_once", ""))
    check_resumed(client, mover, a, "gpu04")
    check_resumed(client, preempted, c, None)
    untouched(client, other, b, "gpu02")
    metrics = summary["metrics"]
    assert 'linkwise_serve_migrations_total{mode="active"} 1.0' in metrics
    assert 'linkwise_serve_preemptions_total{mode="active"} 1.0' in metrics
    assert 'linkwise_serve_moves_refused_total{reason="not opted in"} 1.0' in metrics
    con = read_store(tmp_path / "store.duckdb")
    actors = con.execute("SELECT DISTINCT job_id, actor FROM audit ORDER BY 1, 2").fetchall()
    con.close()
    assert (other, "loop:migrate") not in actors and all(j != other for j, _ in actors)
    assert {(mover, "loop:migrate"), (preempted, "loop:migrate")} <= set(actors)
    # the preempted job was held for the loop, which released it (it hands back what it
    # will not place, and everything on the way out)
    assert {(preempted, "loop:shutdown"), (preempted, "loop:unmanaged")} & set(actors)


def test_shadow_records_the_would_be_migration_and_changes_nothing(
    client: SlurmClient, tmp_path: Path, jobs: list[int]
) -> None:
    work = tmp_path / "a"
    jobs.append(submit_counter(client, work, "lw-mig-shadow", "gpu01"))
    mover = jobs[0]
    started_counting(client, mover, "gpu01", work)
    db = tmp_path / "store.duckdb"
    cfg = ServeConfig(
        mode="shadow", partitions=("gpu",), slurm_env=ENV_FILE, db=str(db),
        state_dir=str(tmp_path / "state"), lease_root=str(tmp_path / "leases"),
        interval_s=0.5, max_cycles=4, migration=MigrationConfig(grace_s=30, min_run_s=1),
    )  # fmt: skip
    policy = MoveOnce((mover, 3), ())
    summary = serve(cfg, policy=LoadedPolicy(policy, "move_once", "test:move_once", ""))
    assert 'linkwise_serve_migrations_total{mode="shadow"} 1.0' in summary["metrics"]
    con = read_store(db)
    rows = con.execute("SELECT job_id, actor, outcome, command FROM audit").fetchall()
    con.close()
    assert {(j, a, o) for j, a, o, _ in rows} == {(mover, "shadow:migrate", "shadow")}
    assert any("ReqNodeList=gpu04" in c for *_, c in rows)
    time.sleep(GRACE + 1)  # long past the grace: still never signalled nor requeued
    untouched(client, mover, work, "gpu01")


CHILD = """
import sys
from linkwise.cluster.domain import Decision, Placement, Start
from linkwise.deployer.loop import ServeConfig, serve
from linkwise.deployer.migration import MigrationConfig
from linkwise.deployer.policies import LoadedPolicy

class MoveOnce:
    name = "move_once"
    asked = False
    def decide(self, state):
        if self.asked:
            return Decision()
        self.asked = True
        return Decision(migrate=(Start({job}, Placement.of([(3, 1)])),))

cfg = ServeConfig(
    mode="active", partitions=("gpu",), slurm_env={env!r}, db={db!r}, state_dir={state!r},
    lease_root={leases!r}, interval_s=0.5, lease_s=120.0,
    migration=MigrationConfig(grace_s=30, min_run_s=1),
)
serve(cfg, policy=LoadedPolicy(MoveOnce(), "move_once", "test:move_once", ""),
      install_signals=True)
"""

SHIM = """#!/bin/bash
# scontrol, except that the first placement of a job (ReqNodeList) never happens: it stops
# here (its pid in the marker) so that the test can kill the loop between requeuehold and
# release
if [[ " $* " == *" ReqNodeList="* && ! -e {marker} ]]; then
  echo $$ > {marker}
  exec sleep 600
fi
exec {real} "$@"
"""


def test_kill9_between_requeuehold_and_release_the_job_runs(
    client: SlurmClient, tmp_path: Path, jobs: list[int]
) -> None:
    work = tmp_path / "a"
    jobs.append(submit_counter(client, work, "lw-mig-kill", "gpu01"))
    mover = jobs[0]
    started_counting(client, mover, "gpu01", work)
    marker = tmp_path / "stopped-before-placing"
    shim_dir = tmp_path / "bin"
    shim_dir.mkdir()
    # the loop runs the instance's own commands (LINKWISE_SLURM_BIN, a chroot's Slurm) when
    # its env file names them: the shim stands in that folder, beside links to the others
    cluster_env = read_env_file(ENV_FILE)
    own_bin = cluster_env.get("LINKWISE_SLURM_BIN")
    real = os.path.join(own_bin, "scontrol") if own_bin else shutil.which("scontrol")
    assert real is not None
    for other in Path(own_bin).iterdir() if own_bin else ():
        if other.name != "scontrol":
            (shim_dir / other.name).symlink_to(other)
    (shim_dir / "scontrol").write_text(SHIM.format(marker=marker, real=real))
    (shim_dir / "scontrol").chmod(0o755)
    env_file = tmp_path / "env"
    env_file.write_text(
        "".join(f"{k}={shim_dir if k == 'LINKWISE_SLURM_BIN' else v}\n"
                for k, v in cluster_env.items())
    )  # fmt: skip
    db = tmp_path / "store.duckdb"
    (tmp_path / "child.py").write_text(
        CHILD.format(job=mover, env=str(env_file), db=str(db), state=str(tmp_path / "state"),
                     leases=str(tmp_path / "leases"))
    )  # fmt: skip
    env = {**os.environ, "PATH": f"{shim_dir}:{os.environ['PATH']}"}
    log = open(tmp_path / "serve.log", "wb")  # noqa: SIM115
    proc = subprocess.Popen(
        [sys.executable, str(tmp_path / "child.py")], env=env, stdout=log, stderr=log
    )
    try:
        wait_for(marker.exists, 90, "the loop to requeue-hold the job and try to place it")
        # requeue-held, not yet released (the loop is alive and its lease fresh: no watchdog
        # sweeps before the kill)
        held = job(client, mover)
        assert held is not None and held.held and held.reason == "JobHeldUser"
        assert proc.poll() is None
        proc.send_signal(signal.SIGKILL)
        killed = time.time()
        proc.wait(60)
        # the watchdog sees its owner gone (it polls every second) and releases the job,
        # long before the 120 s lease would have run out (a wide margin on a loaded machine)
        wait_for(lambda: not getattr(job(client, mover), "held", True), 90, "the release")
        print(f"released {time.time() - killed:.1f} s after kill -9")
        # the watchdog sees the loop gone and releases what it held: the job runs again
        check_resumed(client, mover, work, None)
        con = read_store(db)
        rows = con.execute(
            "SELECT actor, command, outcome FROM audit WHERE job_id = ? ORDER BY ts", [mover]
        ).fetchall()
        con.close()
        released = [r for r in rows if r[0] == "watchdog"]
        assert released and json.loads(released[0][1])[:2] == ["scontrol", "release"]
        assert released[0][2] == "ok"
        loop_verbs = [json.loads(c)[1] for a, c, _ in rows if a == "loop:migrate"]
        assert loop_verbs[:3] == ["--batch", "update", "requeuehold"]
        assert "release" not in loop_verbs  # the loop never got to release it
    finally:
        if proc.poll() is None:
            proc.kill()
        log.close()
        if marker.exists():
            pid = int(marker.read_text().split()[0])
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)  # the stopped scontrol (our own sleep)
