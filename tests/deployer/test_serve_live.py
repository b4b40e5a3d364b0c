"""``linkwise serve`` against a real Slurm: its own local cluster (dir and ports of its own),
started for this module and stopped after it, so other work on the shared cluster is not
disturbed."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import duckdb
import pytest

from linkwise.cluster.domain import ClusterState, Decision, Placement, Start
from linkwise.cluster.hostlist import expand
from linkwise.cluster.slurm.client import SlurmClient, read_env_file
from linkwise.datasets.store import open_store
from linkwise.deployer.loop import ServeConfig, serve
from linkwise.deployer.policies import LoadedPolicy
from linkwise.tests._serve import cycles_run, free_port
from linkwise.tests._slurm import slurm_argv
from linkwise.tests._store import read_store

pytestmark = pytest.mark.services

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "local-slurm"
LIVE_DIR = "/tmp/lw-slurm-live"
LIVE_ENV = {"LINKWISE_SLURM_DIR": LIVE_DIR, "LINKWISE_SLURM_PORT_BASE": "18800"}
LEASE_ROOT = "/tmp/lw-slurm-live-leases"  # shared by every loop of these tests (not per state dir)


@pytest.fixture(scope="module")
def cluster() -> Iterator[dict[str, str]]:
    env = {**os.environ, **LIVE_ENV}
    subprocess.run([str(SCRIPT), "start"], env=env, check=True, capture_output=True, timeout=300)
    try:
        yield read_env_file(Path(LIVE_DIR) / "env")
    finally:
        subprocess.run([str(SCRIPT), "stop"], env=env, check=False, capture_output=True)


@pytest.fixture(scope="module")
def client(cluster: dict[str, str]) -> SlurmClient:
    return SlurmClient.from_env(cluster, "cli")


HOLD_TAG = "linkwise:held"  # what job_submit.lua sets (AdminComment) when it holds a job


def hand_over(client: SlurmClient, job_id: int) -> None:
    """Tag a held job the way job_submit.lua does: an administrator hands it to the loop."""
    client.runner.run(["scontrol", "update", f"JobId={job_id}", f"AdminComment={HOLD_TAG}"])


def wait_for(cond: Callable[[], bool], timeout: float, what: str, step: float = 0.3) -> None:
    deadline = time.time() + timeout
    while not cond():
        assert time.time() < deadline, f"timed out after {timeout} s waiting for {what}"
        time.sleep(step)


def acct(client: SlurmClient, ids: list[int]) -> dict[int, tuple[str, str]]:
    """job -> (state, node list) from sacct; a record still in 22.05's transient form (only the
    batch host listed for a multi-node job) shows the state ``UNSETTLED``."""
    args = ["sacct", "-a", "-X", "-P", "-n", "-o", "JobIDRaw,State,NNodes,NodeList", "-j"]
    out = client.runner.run([*args, ",".join(map(str, ids))])
    rows = [line.split("|") for line in out.splitlines() if line.strip()]
    return {
        int(r[0]): (r[1] if str(len(expand(r[3]))) == r[2] else "UNSETTLED", r[3]) for r in rows
    }


def all_done(client: SlurmClient, ids: list[int]) -> bool:
    states = acct(client, ids)
    return len(states) == len(ids) and all(s == "COMPLETED" for s, _ in states.values())


def serve_cmd(env_file: str, tmp: Path, *args: str) -> list[str]:
    return [
        sys.executable, "-m", "linkwise.cli", "serve", "--partition", "gpu",
        "--slurm-env", env_file, "--db", str(tmp / "store.duckdb"),
        "--state-dir", str(tmp / "state"), "--lease-root", LEASE_ROOT, *args,
    ]  # fmt: skip


class LastFit:
    """Places each pending job on the highest-numbered nodes with room (Slurm's own first
    fit starts at the lowest), so a job on those nodes shows the policy's control."""

    name = "last_fit"

    def decide(self, state: ClusterState) -> Decision:
        free = list(state.free_gpus)
        starts = []
        for p in state.pending:
            per = min(p.job.num_gpus, 4)
            k = -(-p.job.num_gpus // per)
            nodes = [i for i in reversed(range(len(free))) if free[i] >= per][:k]
            if len(nodes) == k:
                for i in nodes:
                    free[i] -= per
                starts.append(Start(p.job.job_id, Placement.of([(i, per) for i in nodes])))
        return Decision(starts=tuple(starts))


def test_active_places_jobs_on_the_policy_nodes(client: SlurmClient, tmp_path: Path) -> None:
    ids = [
        client.submit("sleep 1", name="one", gpus_per_node=1, hold=True),
        client.submit("sleep 1", name="two", gpus_per_node=2, hold=True),
        client.submit("sleep 1", name="wide", nodes=2, gpus_per_node=4, hold=True),
    ]
    # held for the loop, and can never fit (6 nodes in a 4-node partition): handed back
    bad = client.submit("sleep 1", name="too-big", nodes=6, gpus_per_node=1, hold=True)
    for j in [*ids, bad]:
        hand_over(client, j)
    try:
        cfg = ServeConfig(
            mode="active", partitions=("gpu",), slurm_env=str(Path(LIVE_DIR) / "env"),
            db=str(tmp_path / "store.duckdb"), state_dir=str(tmp_path / "state"),
            lease_root=LEASE_ROOT, interval_s=0.5, lease_s=60.0, max_cycles=4,
        )  # fmt: skip
        summary = serve(cfg, policy=LoadedPolicy(LastFit(), "last_fit", "test:last_fit", ""))
        assert summary["cycles"] == 4
        wait_for(lambda: all_done(client, ids), 240, "the placed jobs to complete")
        con = read_store(tmp_path / "store.duckdb")
        chosen = dict(
            con.execute(
                "SELECT job_id, nodes FROM decisions WHERE action = 'start' AND note = 'applied'"
            ).fetchall()
        )
        assert set(chosen) == set(ids)
        ran = acct(client, ids)
        for job in ids:  # sacct: each job ran on exactly the nodes the policy chose
            assert ran[job][1] == chosen[job], (job, ran[job], chosen[job])
        assert chosen[ids[0]] == chosen[ids[1]] == "gpu04" and chosen[ids[2]] == "gpu[02-03]"
        # every command audited (before it ran: outcome recorded after) with the model version
        audit = con.execute(
            "SELECT job_id, command, model_version, outcome FROM audit WHERE actor = 'loop'"
        ).fetchall()
        assert {(j, json.loads(c)[1]) for j, c, _, _ in audit} == {
            (j, verb) for j in ids for verb in ("update", "release")
        }
        assert all(v == "test:last_fit" and o == "ok" for _, _, v, o in audit)
        # the infeasible request: reported, not placed, released unchanged to Slurm
        note = con.execute("SELECT note FROM decisions WHERE job_id = ?", [bad]).fetchall()
        assert len(note) == 1 and note[0][0].startswith("infeasible: needs 6 node(s)")
        handed = con.execute(
            "SELECT command FROM audit WHERE job_id = ? AND actor = 'loop:unmanaged'", [bad]
        ).fetchall()
        assert [json.loads(c)[:2] for (c,) in handed] == [["scontrol", "release"]]
        q = {j.job_id: j for j in client.queue()}
        assert not q[bad].held and q[bad].state == "PENDING"
        con.close()
    finally:
        client.cancel(bad)


def test_shadow_burst_with_corrupt_model_and_store_outage(
    client: SlurmClient, tmp_path: Path
) -> None:
    corrupt = tmp_path / "corrupt-model"
    corrupt.mkdir()
    lines = []
    for name in ("network.pt", "obs_spec.json", "dataset.json", "policy.json"):
        (corrupt / name).write_bytes(b"garbage")
        lines.append(f"{hashlib.sha256(b'other').hexdigest()}  {name}\n")
    (corrupt / "checksums.sha256").write_text("".join(lines))
    db = tmp_path / "store.duckdb"
    duckdb.connect(str(db)).close()
    port = free_port()
    cmd = serve_cmd(
        str(Path(LIVE_DIR) / "env"), tmp_path, "--mode", "shadow", "--policy",
        f"model:{corrupt}", "--fallback", "fifo", "--interval", "1", "--metrics-port", str(port),
    )  # fmt: skip
    errf = tmp_path / "serve.log"

    def cycles() -> int:  # counted on /metrics: an idle cycle writes no log line
        return cycles_run(port)

    with open(errf, "wb") as fh:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=fh, cwd=tmp_path)
    try:
        wait_for(lambda: cycles() >= 1, 120, "the first cycle")
        # another writer holds the store (the loop opens it per write: retried until between
        # two writes): unavailable until the loop has spooled a cycle of the burst's decisions
        lock = open_store(db, lock_wait_s=120)
        try:
            wait_for(lambda: b"store_unavailable" in errf.read_bytes(), 120, "the outage")
            burst = [client.submit("sleep 2", name=f"burst{i}", gpus_per_node=4) for i in range(6)]
            later = [
                client.submit(
                    "sleep 1", name=f"later{i}", gpus_per_node=1, extra_args=["--begin=now+5"]
                )
                for i in range(2)
            ]
            seen = cycles()
            wait_for(lambda: cycles() >= seen + 2, 120, "cycles during the outage")
        finally:
            lock.close()
        wait_for(lambda: b"spool_replayed" in errf.read_bytes(), 120, "the spool's replay")
        wait_for(lambda: all_done(client, burst + later), 240, "the burst to complete")
        # jobs that left the queue unseen are joined from sacct once settled (ended over 5 s
        # ago, every third cycle): cycles last at least the 1 s interval
        done = cycles()
        wait_for(lambda: cycles() >= done + 10, 240, "the joins of finished jobs")
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(60)
    err_lines = errf.read_bytes().splitlines()
    log = [json.loads(x) for x in err_lines if x.startswith(b"{")]
    events = [e["event"] for e in log]
    assert proc.returncode == 0, errf.read_text()[-2000:]
    fallback = [e for e in log if e["event"] == "fallback"]
    assert fallback and "SHA-256" in fallback[0]["reason"] and fallback[0]["fallback"] == "fifo"
    # no calibration flag, package record or tracking store here: the shipped one, said once
    (calibration,) = [e for e in log if e["event"] == "calibration"]
    assert calibration["source"] == "shipped" and calibration["run_id"] is None
    assert events.index("calibration") < events.index("serve_start")
    assert "store_unavailable" in events and "spool_replayed" in events
    n_cycles = json.loads(out)["cycles"]
    assert n_cycles >= 13 and events[-1] == "serve_stop"
    assert log[-1]["cycles"] == n_cycles and "cycle" in events  # the first cycle's line at least
    con = read_store(db)
    cycles = [
        r[0] for r in con.execute("SELECT DISTINCT cycle_id FROM decisions ORDER BY 1").fetchall()
    ]
    # a decision per cycle, the outage's ones included
    assert cycles == list(range(1, n_cycles + 1))
    assert con.execute("SELECT count(*) FROM audit").fetchone() == (0,)
    assert {r[0] for r in con.execute("SELECT DISTINCT mode FROM decisions").fetchall()} == {
        "shadow"
    }
    # shadow: the future-begin jobs looked startable; Slurm started them later, elsewhere maybe
    joined = con.execute(
        "SELECT job_id, nodes, actual_start, actual_nodes FROM decisions "
        "WHERE action = 'start' AND actual_start IS NOT NULL"
    ).fetchall()
    ran = acct(client, burst + later)
    assert {j for j, *_ in joined} >= set(later)
    for job, _, start, nodes in joined:
        assert nodes == ran[job][1] and start > 0
    assert json.loads(out)["spooled"] == 0
    con.close()
    # shadow changed nothing: no job of the burst was held or given a node list
    assert all(not q.req_nodes for q in client.queue())


def test_kill9_with_held_jobs_releases_within_the_lease(
    client: SlurmClient, tmp_path: Path
) -> None:
    blocker = client.submit("sleep 4", name="blocker", nodes=4, gpus_per_node=4, hold=True)
    waiting = [client.submit("sleep 1", name=f"w{i}", gpus_per_node=4, hold=True) for i in range(3)]
    for j in [blocker, *waiting]:
        hand_over(client, j)
    # the watchdog acts once it sees its owner gone, not at the lease's end: a long lease
    # makes "within the lease" a check with a wide margin on a loaded machine
    lease = 60.0
    port = free_port()
    cmd = serve_cmd(
        str(Path(LIVE_DIR) / "env"), tmp_path, "--mode", "active", "--policy", "fifo",
        "--interval", "1", "--lease", str(lease), "--metrics-port", str(port),
    )  # fmt: skip
    errf = tmp_path / "serve.log"
    with open(errf, "wb") as fh:
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=fh, cwd=tmp_path)
    try:
        wait_for(
            lambda: any(q.job_id == blocker and q.state == "RUNNING" for q in client.queue()),
            120, "the loop to start the blocker",
        )  # fmt: skip
        seen = cycles_run(port)
        wait_for(  # a whole cycle that saw the blocker run holds the waiting jobs (no room)
            lambda: cycles_run(port) >= seen + 2, 120, "two cycles"
        )
        assert all(q.held for q in client.queue() if q.job_id in waiting)
        proc.send_signal(signal.SIGKILL)
        killed = time.time()
        proc.wait(60)
        wait_for(
            lambda: not any(q.held for q in client.queue() if q.job_id in waiting),
            lease, "the watchdog to release the held jobs",
        )  # fmt: skip
        assert time.time() - killed <= lease
        wait_for(lambda: all_done(client, [blocker, *waiting]), 240, "every job to complete")
        # the watchdog writes its audit rows (and holds the store's lock meanwhile) until it
        # has swept twice and marked the lease released: read the store after that
        wlog = tmp_path / "state" / "watchdog.log"
        wait_for(lambda: b"owner gone, jobs released" in wlog.read_bytes(), 120, "the watchdog")
        con = read_store(tmp_path / "store.duckdb")
        rows = con.execute("SELECT job_id, outcome FROM audit WHERE actor = 'watchdog'").fetchall()
        assert sorted(rows) == sorted((j, "ok") for j in waiting)
        con.close()
    finally:
        if proc.poll() is None:
            proc.kill()


def test_slurmctld_restart_mid_cycle_loop_survives(client: SlurmClient, tmp_path: Path) -> None:
    port = free_port()
    cmd = serve_cmd(
        str(Path(LIVE_DIR) / "env"), tmp_path, "--mode", "active", "--policy", "best_fit",
        "--interval", "1", "--lease", "10", "--metrics-port", str(port),
    )  # fmt: skip
    errf = tmp_path / "serve.log"
    with open(errf, "wb") as fh:
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=fh, cwd=tmp_path)
    try:
        wait_for(lambda: cycles_run(port) >= 2, 120, "two cycles")
        pid = int((Path(LIVE_DIR) / "run" / "slurmctld.pid").read_text().strip())
        os.kill(pid, signal.SIGTERM)
        wait_for(lambda: b"slurm_read_failed" in errf.read_bytes(), 120, "the outage")
        env = {**os.environ, **LIVE_ENV}
        subprocess.run(
            [str(SCRIPT), "start"], env=env, check=True, capture_output=True, timeout=300
        )
        assert proc.poll() is None, "the loop died with slurmctld"
        ids = [
            client.submit("sleep 1", name=f"after{i}", gpus_per_node=2, hold=True) for i in range(2)
        ]
        for j in ids:
            hand_over(client, j)
        wait_for(lambda: all_done(client, ids), 240, "jobs submitted after the restart to run")
        proc.send_signal(signal.SIGTERM)
        proc.wait(120)
        assert proc.returncode == 0
        log = [json.loads(x) for x in errf.read_bytes().splitlines() if x.startswith(b"{")]
        events = [e["event"] for e in log]
        last_outage = max(i for i, e in enumerate(events) if e == "slurm_read_failed")
        assert "cycle" in events[last_outage:] and events[-1] == "serve_stop"
        starts = {e["job_id"] for e in log if e["event"] == "start" and e["outcome"] == "applied"}
        assert starts >= set(ids)
    finally:
        if proc.poll() is None:
            proc.kill()


def submit_as(user: str, *args: str) -> int:
    """sbatch as another (non-root) user of the cluster; its job id."""
    env = read_env_file(Path(LIVE_DIR) / "env")
    cmd = slurm_argv(env, "sbatch", "--parsable", "--chdir=/tmp", "-o", "/dev/null", user=user)
    out = subprocess.run([*cmd, *args], check=True, capture_output=True, text=True, timeout=30)
    return int(out.stdout.strip().split(";")[0])


def reasons(client: SlurmClient, ids: list[int]) -> dict[int, str]:
    """job -> squeue's reason while it is pending ("" once it left the queue or runs)."""
    out = client.runner.run(["squeue", "-h", "-t", "PD", "-o", "%i|%r"])
    got = dict(line.split("|", 1) for line in out.splitlines() if "|" in line)
    return {j: got.get(str(j), "") for j in ids}


def test_holds_the_loop_did_not_place_are_left_alone(client: SlurmClient, tmp_path: Path) -> None:
    admin = client.submit("sleep 1", name="i12-admin", gpus_per_node=1, hold=True)
    client.runner.run(["scontrol", "hold", str(admin)])  # an administrator's hold
    user = submit_as("slurm", "--hold", "-J", "i12-user", "--gres=gpu:1", "--wrap=sleep 1")
    tagged_admin = client.submit("sleep 1", name="i12-tag-admin", gpus_per_node=1, hold=True)
    hand_over(client, tagged_admin)
    client.runner.run(["scontrol", "hold", str(tagged_admin)])  # an admin held it on top
    ours = client.submit("sleep 1", name="i12-ours", gpus_per_node=1, hold=True)
    hand_over(client, ours)
    theirs = [admin, user, tagged_admin]
    before = reasons(client, theirs)
    assert before == {admin: "JobHeldAdmin", user: "JobHeldUser", tagged_admin: "JobHeldAdmin"}
    try:
        cfg = ServeConfig(
            mode="active", partitions=("gpu",), slurm_env=str(Path(LIVE_DIR) / "env"),
            db=str(tmp_path / "store.duckdb"), state_dir=str(tmp_path / "state"),
            lease_root=LEASE_ROOT, interval_s=0.5, lease_s=60.0, max_cycles=3,
        )  # fmt: skip
        summary = serve(cfg, policy=LoadedPolicy(LastFit(), "last_fit", "test:last_fit", ""))
        wait_for(lambda: all_done(client, [ours]), 240, "the loop's own job to run")
        assert reasons(client, theirs) == before, summary  # the clean shutdown left them alone
        # kill -9: the watchdog sweeps; it too leaves every hold it did not place alone
        errf = tmp_path / "serve.log"
        cmd = serve_cmd(
            str(Path(LIVE_DIR) / "env"), tmp_path / "k", "--mode", "active", "--policy", "fifo",
            "--interval", "0.5", "--lease", "30",
        )  # fmt: skip
        with open(errf, "wb") as fh:
            proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=fh, cwd=tmp_path)
        wait_for(lambda: b'"event": "cycle"' in errf.read_bytes(), 120, "a cycle")
        proc.send_signal(signal.SIGKILL)
        proc.wait(60)
        wlog = tmp_path / "k" / "state" / "watchdog.log"
        wait_for(lambda: b"owner gone, jobs released" in wlog.read_bytes(), 120, "the watchdog")
        assert reasons(client, theirs) == before
    finally:
        for j in theirs:
            client.cancel(j)


def test_a_second_loop_on_an_overlapping_partition_is_refused(
    client: SlurmClient, tmp_path: Path
) -> None:
    env_file = str(Path(LIVE_DIR) / "env")
    sleeper = client.submit("sleep 60", name="i12-sleeper", gpus_per_node=1)
    wait_for(lambda: any(q.job_id == sleeper and q.state == "RUNNING" for q in client.queue()),
             120, "the sleeper to run")  # fmt: skip
    wide = client.submit("sleep 1", name="i12-wide", nodes=4, gpus_per_node=4, hold=True)
    hand_over(client, wide)  # the first loop holds it: a GPU is busy
    errf = tmp_path / "a.log"
    first = serve_cmd(env_file, tmp_path / "a", "--mode", "active", "--interval", "1")
    with open(errf, "wb") as fh:
        proc = subprocess.Popen(first, stdout=subprocess.DEVNULL, stderr=fh, cwd=tmp_path)
    try:
        wait_for(lambda: errf.read_bytes().count(b'"event": "cycle"') >= 1, 120, "a cycle")
        for parts in ("gpu", "zzz,gpu"):  # another state dir; the same partition in a set
            second = serve_cmd(env_file, tmp_path / "b", "--mode", "active", "--max-cycles", "2")
            second[second.index("--partition") + 1] = parts
            out = subprocess.run(second, capture_output=True, text=True, timeout=240, cwd=tmp_path)
            assert out.returncode == 2, (parts, out.returncode, out.stderr[-1500:])
            assert "gpu" in out.stderr and "another loop" in out.stderr, out.stderr[-1500:]
        assert proc.poll() is None
        assert reasons(client, [wide]) == {wide: "JobHeldUser"}  # still held by the first loop
    finally:
        client.cancel(sleeper)
        client.cancel(wide)
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            proc.wait(120)
