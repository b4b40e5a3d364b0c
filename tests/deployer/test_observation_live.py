"""The live observation on the real local Slurm (the shared cluster of ``scripts/local-slurm``):
squeue's comment and ``--requeue`` reach the policy's view (a declared profile, the opt-in
flag), and a learned package (models/pretrained/philly-multigpu) decides in a live shadow
``serve`` itself, on every cycle, without falling back (before: ``unknown profile ''``); a
job the migration executor signalled is in transit with its target's GPU reserved. This
module's jobs are named ``lw-obs-*`` (those of the serve test wait in the queue, ``--begin``
in the future); other engineers' jobs share the cluster, so the assertions are on this
module's own jobs. The fast counterparts with fakes: tests/deployer/test_observation.py."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import time
from pathlib import Path

import duckdb
import pytest
from prometheus_client import CollectorRegistry

from linkwise.cluster.domain import Placement
from linkwise.cluster.profiles import load_calibration
from linkwise.cluster.slurm.client import SlurmClient, read_env_file
from linkwise.datasets.store import open_store
from linkwise.deployer.loop import ServeConfig, serve
from linkwise.deployer.migration import MigrationConfig, MigrationExecutor, Move
from linkwise.deployer.observation import build_observation, slurm_topology
from linkwise.deployer.profiles import resolve_profiles
from linkwise.deployer.recorder import Recorder
from linkwise.policies.spec import PolicySpec
from linkwise.tests._slurm import slurm_cmd

pytestmark = pytest.mark.services

ROOT = Path(__file__).resolve().parents[2]
SLURM_DIR = Path(os.environ.get("LINKWISE_SLURM_DIR", "/tmp/linkwise-slurm"))
SCRIPT = ROOT / "scripts" / "local-slurm"
LOG = logging.getLogger("test.observation_live")
PACKAGE = f"model:{ROOT / 'models' / 'pretrained' / 'philly-multigpu'}"


@pytest.fixture(scope="module")
def env_file() -> Path:
    env = SLURM_DIR / "env"
    status = subprocess.run([str(SCRIPT), "status"], capture_output=True, check=False)
    if not env.exists() or status.returncode != 0:
        pytest.fail(f"local Slurm is not up in {SLURM_DIR}: run `scripts/local-slurm start`")
    return env


def test_a_learned_package_decides_on_the_live_queue(env_file: Path, tmp_path: Path) -> None:
    env = read_env_file(env_file)
    client = SlurmClient.from_env(env, "cli")
    partition = env.get("LINKWISE_SLURM_PARTITION", "gpu")
    tag = f"lw-obs-{os.getpid()}"
    later = ["--begin=now+900"]  # pending for the whole test, however loaded the machine
    ids = {
        "bert": client.submit("sleep 1", name=f"{tag}-bert", gpus_per_node=1,
                              comment="linkwise:profile=bert", extra_args=later),
        "opted": client.submit("sleep 1", name=f"{tag}-opted", gpus_per_node=2,
                               comment="linkwise:migratable@30 linkwise:profile=NCF",
                               extra_args=[*later, "--requeue"]),
        "plain": client.submit("sleep 1", name=f"{tag}-plain", gpus_per_node=1,
                               extra_args=[*later, "--no-requeue"]),
    }  # fmt: skip
    mine = set(ids.values())
    db = tmp_path / "store.duckdb"
    try:
        # what squeue says of them reaches the policy's view
        queue = [q for q in client.queue() if q.job_id in mine]
        assert len(queue) == 3 and all(q.state == "PENDING" for q in queue)
        cal = load_calibration(None)
        profiles = resolve_profiles(queue, cal)
        topo = slurm_topology(env["SLURM_CONF"])
        obs = build_observation(
            queue, client.nodes(), topo, [partition], time.time(), mode="shadow",
            profiles={j: p.profile for j, p in profiles.items()},
        )  # fmt: skip
        jobs = {p.job.job_id: p.job for p in obs.state.pending}
        assert jobs[ids["bert"]].profile == "bert" and profiles[ids["bert"]].source == "declared"
        assert jobs[ids["opted"]].profile == "ncf"
        assert profiles[ids["plain"]].source == "default"
        assert jobs[ids["plain"]].profile in cal.profiles
        assert jobs[ids["opted"]].preemptible is True
        assert jobs[ids["plain"]].preemptible is False
        assert jobs[ids["bert"]].preemptible is False  # requeue-able, but did not opt in

        # a live shadow serve with the learned package: it decides itself, every cycle
        seen: set[int] = set()
        deadline = time.time() + 240
        while not seen:
            assert time.time() < deadline, "the shadow loop never decided about this test's jobs"
            cfg = ServeConfig(
                mode="shadow", partitions=(partition,), policy=PolicySpec.parse(PACKAGE),
                fallback=PolicySpec.parse("fifo"),
                slurm_env=str(env_file), db=str(db), state_dir=str(tmp_path / "state"),
                interval_s=1.0, max_cycles=3, watchdog=False,
                lease_root=str(tmp_path / "leases"),
            )  # fmt: skip
            summary = serve(cfg)
            assert summary["cycles"] == 3 and summary["spooled"] == 0
            con = duckdb.connect(str(db), read_only=True)
            try:
                rows = con.execute(
                    "SELECT job_id, policy, note, explanation FROM decisions"
                ).fetchall()
            finally:
                con.close()
            assert rows
            for job_id, policy, note, raw in rows:
                assert policy == PACKAGE and not note.startswith("fallback"), note
                named = json.loads(raw)["jobs"] if raw else []
                seen |= {j for j in mine if j == job_id or str(j) in map(str, named)}
        # shadow changed nothing: this test's jobs are still pending, not held
        queue = [q for q in client.queue() if q.job_id in mine]
        assert all(q.state == "PENDING" and not q.held for q in queue)
    finally:
        subprocess.run(
            [slurm_cmd(env, "scancel"), *map(str, mine)], env={**os.environ, **env}, check=False,
            capture_output=True,
        )  # fmt: skip


def test_a_signalled_job_is_in_transit_with_its_target_reserved(
    env_file: Path, tmp_path: Path
) -> None:
    """The executor signals this test's own opted-in job on the real Slurm: the live view
    shows it draining (not running) with its migration target's GPU reserved."""
    env = read_env_file(env_file)
    client = SlurmClient.from_env(env, "cli")
    partition = env.get("LINKWISE_SLURM_PARTITION", "gpu")
    job = client.submit(
        "trap '' USR1; sleep 600", name=f"lw-obs-{os.getpid()}-drain", gpus_per_node=1,
        comment="linkwise:migratable@300", extra_args=["--requeue"],
    )  # fmt: skip
    open_store(str(tmp_path / "store.duckdb")).close()
    recorder = Recorder(str(tmp_path / "store.duckdb"), tmp_path / "spool.jsonl", logger=LOG)
    ex = MigrationExecutor(
        client, recorder, CollectorRegistry(), MigrationConfig(min_run_s=0), run_id="t",
        logger=LOG,
    )  # fmt: skip
    topo = slurm_topology(env["SLURM_CONF"])
    try:
        deadline = time.time() + 180
        while True:
            mine = [q for q in client.queue() if q.job_id == job]
            if mine and mine[0].state == "RUNNING":
                break
            assert time.time() < deadline, f"job {job} never ran: {mine}"
            time.sleep(1.0)
        (q,) = mine
        queue, nodes = client.queue(), client.nodes()
        free = {n.name: max(0, n.gpus_total - n.gpus_used) for n in nodes}
        target = next((n for n, f in free.items() if f >= 1 and n not in q.nodes), None)
        if target is None:
            pytest.fail(f"no other node with a free GPU on the shared cluster: {free}")
        out = ex.cycle([Move(job, "migrate", (target,))], queue, free, partitions=(partition,),
                       mode="active", cycle_id=1)  # fmt: skip
        assert out == {job: "signalled"}, out
        obs = build_observation(client.queue(), client.nodes(), topo, [partition], time.time(),
                                mode="shadow", transit=ex.in_transit())  # fmt: skip
        assert job not in {r.job.job_id for r in obs.state.running}
        (tr,) = [t for t in obs.state.transit if t.job.job_id == job]
        k = topo.node_index[target]
        assert tr.draining and tr.target == Placement.of([(k, 1)])
        assert tr.held is not None and tr.held.nodes == (topo.node_index[q.nodes[0]],)
        assert obs.state.free_gpus[k] == max(0, obs.slurm_free[k] - 1)
    finally:
        subprocess.run([slurm_cmd(env, "scancel"), str(job)], env={**os.environ, **env},
                       check=False, capture_output=True)  # fmt: skip
