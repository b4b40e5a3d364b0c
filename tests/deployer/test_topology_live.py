"""``linkwise serve --mode active`` places held jobs as Slurm's topology plugin enforces it
(issue 31 item 4), against a real Slurm 24.11 of its own per topology (``scripts/local-slurm``
with ``LINKWISE_SLURM_TOPOLOGY=tree``: leaf switches s1 = gpu[01-02], s2 = gpu[03-04] under s0;
``block``: b1 = gpu[01-02], b2 = gpu[03-04], BlockSizes=2,4). Held 2-node jobs (one with
``--switches=1`` on the tree) are placed by the loop for a few cycles; every job must run on
the node list the loop gave it, inside one block, or within its switch limit."""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from linkwise.cluster.hostlist import expand
from linkwise.cluster.slurm.client import SlurmClient, read_env_file
from linkwise.deployer.holds import HOLD_TAG
from linkwise.deployer.loop import ServeConfig, serve
from linkwise.policies.spec import PolicySpec
from linkwise.tests._slurm import slurm_argv
from linkwise.tests._store import read_store

pytestmark = pytest.mark.services

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "local-slurm"
PORT_BASE = {"tree": 22800, "block": 22900}
LEAF = {"gpu01": "s1", "gpu02": "s1", "gpu03": "s2", "gpu04": "s2"}  # blocks b1/b2 alike


@pytest.fixture(scope="module", params=["tree", "block"])
def cluster(request: pytest.FixtureRequest) -> Iterator[tuple[str, dict[str, str], Path]]:
    topology = str(request.param)
    folder = Path(f"/tmp/lw-slurm-i31-{topology}")
    env = {
        **os.environ,
        "LINKWISE_SLURM_DIR": str(folder),
        "LINKWISE_SLURM_PORT_BASE": str(PORT_BASE[topology]),
        "LINKWISE_SLURM_VERSION": "24.11",  # topology/block needs 23.11+
        "LINKWISE_SLURM_TOPOLOGY": topology,
    }
    subprocess.run([str(SCRIPT), "stop"], env=env, capture_output=True, timeout=180)
    out = subprocess.run([str(SCRIPT), "start"], env=env, capture_output=True, timeout=900)
    assert out.returncode == 0, out.stderr.decode(errors="replace")[-2000:]
    try:
        conf = read_env_file(folder / "env")
        client = SlurmClient.from_env(conf, "cli")
        for q in client.queue():  # this cluster is this module's alone
            client.cancel(q.job_id)
        yield topology, conf, folder
    finally:
        subprocess.run([str(SCRIPT), "stop"], env=env, check=False, capture_output=True)


def wait_for(cond: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.time() + timeout
    while not cond():
        assert time.time() < deadline, f"timed out after {timeout} s waiting for {what}"
        time.sleep(0.5)


def sbatch(conf: dict[str, str], *args: str) -> int:
    cmd = slurm_argv(conf, "sbatch", "--parsable", "--hold", "--chdir=/tmp", "-o", "/dev/null")
    out = subprocess.run([*cmd, *args], capture_output=True, text=True, timeout=60, cwd="/tmp")
    assert out.returncode == 0, out.stderr
    return int(out.stdout.strip().split(";")[0])


def acct(client: SlurmClient, ids: list[int]) -> dict[int, tuple[str, tuple[str, ...]]]:
    args = ["sacct", "-a", "-X", "-P", "-n", "-o", "JobID,State,NodeList", "-j"]
    out = client.runner.run([*args, ",".join(map(str, ids))])
    rows = [line.split("|") for line in out.splitlines() if line.strip()]
    return {
        int(r[0]): (r[1].split(" ")[0], tuple(expand(r[2])) if r[2] != "None assigned" else ())
        for r in rows
        if r[0].isdigit()
    }


def test_the_loop_places_held_jobs_inside_the_topology(
    cluster: tuple[str, dict[str, str], Path], tmp_path: Path
) -> None:
    topology, conf, folder = cluster
    client = SlurmClient.from_env(conf, "cli")
    jobs = {
        "full": sbatch(conf, "-J", "i31-full", "-N2", "--gres=gpu:4", "--wrap=sleep 4"),
        "half": sbatch(conf, "-J", "i31-half", "-N2", "--gres=gpu:2", "--wrap=sleep 4"),
        "half2": sbatch(conf, "-J", "i31-half2", "-N2", "--gres=gpu:2", "--wrap=sleep 4"),
    }
    if topology == "tree":
        jobs["switch"] = sbatch(
            conf, "-J", "i31-switch", "-N2", "--gres=gpu:1", "--switches=1@5:00", "--wrap=sleep 4"
        )
    for job in jobs.values():  # handed to the loop the way job_submit.lua does
        client.runner.run(["scontrol", "update", f"JobId={job}", f"AdminComment={HOLD_TAG}"])
    ids = list(jobs.values())
    cfg = ServeConfig(
        mode="active", partitions=("gpu",), slurm_env=str(folder / "env"),
        policy=PolicySpec.parse("fifo"),
        db=str(tmp_path / "store.duckdb"), state_dir=str(tmp_path / "state"),
        lease_root=str(tmp_path / "leases"), interval_s=1.0, lease_s=60.0, max_cycles=20,
    )  # fmt: skip
    summary = serve(cfg)
    assert summary["cycles"] >= 1
    wait_for(
        lambda: (
            len(acct(client, ids)) == len(ids)
            and all(s == "COMPLETED" for s, _ in acct(client, ids).values())
        ),
        240,
        "every job to run",
    )
    ran = acct(client, ids)
    con = read_store(tmp_path / "store.duckdb")
    rows = con.execute(
        "SELECT job_id, command FROM audit WHERE actor = 'loop' AND outcome = 'ok'"
    ).fetchall()
    con.close()
    placed = {
        int(j): tuple(expand(arg.split("=", 1)[1]))
        for j, c in rows
        for arg in json.loads(c)
        if arg.startswith("ReqNodeList=")
    }
    for name, job in jobs.items():
        nodes = ran[job][1]
        assert placed.get(job) == nodes, (name, placed, ran)  # the loop's node list, run
        assert len(nodes) == 2, (name, ran)
        if topology == "block" or name == "switch":  # one block / one leaf switch
            assert len({LEAF[n] for n in nodes}) == 1, (name, ran)
