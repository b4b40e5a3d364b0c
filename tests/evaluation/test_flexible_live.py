"""Flexible GPU requests on a real Slurm of its own with ``topology/tree`` (issue 33 item 1;
``scripts/local-slurm`` with ``LINKWISE_SLURM_TOPOLOGY=tree``: leaf switches s1 = gpu[01-02],
s2 = gpu[03-04]; the version of ``LINKWISE_SLURM_VERSION``, 24.11 by default).

- Slurm's own choice (nodes and GPUs per node) for ``--gpus=N`` (with and without
  ``--cpus-per-gpu``), ``-N 1-4 --gpus=N`` and ``-n N --gpus-per-task=1`` on the hand-picked
  fragmented states of ``evaluation.slurm_flexible`` is ``placement.slurm_select_flexible``'s.
- ``linkwise serve --mode active`` places held flexible requests itself: each runs on the
  nodes the policy chose with the GPUs per node it chose (Slurm's own split over them), its GPU
  count unchanged and its node count the placement's.

About 90 s besides the cluster's start."""

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
from linkwise.cluster.slurm.gpu_counts import gres_gpus
from linkwise.cluster.topology.load import load_topology
from linkwise.deployer.holds import HOLD_TAG
from linkwise.deployer.loop import ServeConfig, serve
from linkwise.evaluation.slurm_flexible import FORMS, HANDPICKED, FlexCase, run_cases
from linkwise.policies.spec import PolicySpec
from linkwise.tests._slurm import slurm_argv
from linkwise.tests._store import read_store

pytestmark = pytest.mark.services

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "local-slurm"
FOLDER = Path("/tmp/lw-slurm-i33-flex")
# (form, free GPUs per node, GPUs) where a version's cons_tres does not choose as the model
KNOWN_DIFFERENCES: dict[str, set[tuple[str, tuple[int, ...], int]]] = {
    "22.05": {("tasks", (2, 1, 2, 2), 5)},
}
PORT_BASE = 23900


@pytest.fixture(scope="module")
def cluster() -> Iterator[tuple[dict[str, str], SlurmClient]]:
    env = {
        **os.environ,
        "LINKWISE_SLURM_DIR": str(FOLDER),
        "LINKWISE_SLURM_PORT_BASE": str(PORT_BASE),
        "LINKWISE_SLURM_VERSION": os.environ.get("LINKWISE_SLURM_VERSION", "24.11"),
        "LINKWISE_SLURM_TOPOLOGY": "tree",
    }
    subprocess.run([str(SCRIPT), "stop"], env=env, capture_output=True, timeout=180)
    out = subprocess.run([str(SCRIPT), "start"], env=env, capture_output=True, timeout=900)
    assert out.returncode == 0, out.stderr.decode(errors="replace")[-2000:]
    try:
        conf = read_env_file(FOLDER / "env")
        client = SlurmClient.from_env(conf, "cli")
        for q in client.queue():  # this cluster is this module's alone
            client.cancel(q.job_id)
        yield conf, client
    finally:
        subprocess.run([str(SCRIPT), "stop"], env=env, check=False, capture_output=True)


def wait_for(cond: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.time() + timeout
    while not cond():
        assert time.time() < deadline, f"timed out after {timeout} s waiting for {what}"
        time.sleep(0.5)


def test_slurms_choice_for_flexible_requests_is_the_models(
    cluster: tuple[dict[str, str], SlurmClient],
) -> None:
    _, client = cluster
    topo = load_topology(str(FOLDER / "etc"))
    assert topo.plugin == "tree" and len(topo.leaf_names) == 2
    todo = [FlexCase(used, gpus) for used, gpus in HANDPICKED]
    results = run_cases(client, topo, todo, list(FORMS), tag="i33-flex")
    assert len(results) == len(todo) * len(FORMS)
    wrong = [(r.form, r.free, r.case.gpus, r.slurm, r.model) for r in results if not r.agrees]
    # Slurm 22.05 (out of support) spreads 5 one-GPU tasks over free GPUs 2,1,2,2 as 1+2+2
    # on the same three nodes where 24.11 and 26.05 (the model) give 2+2+1; no other case
    # differs. Pinned, so a change on any version shows.
    known = KNOWN_DIFFERENCES.get(os.environ.get("LINKWISE_SLURM_VERSION", "24.11"), set())
    assert {(form, free, gpus) for form, free, gpus, _, _ in wrong} == known, wrong


def sbatch(conf: dict[str, str], *args: str) -> int:
    cmd = slurm_argv(conf, "sbatch", "--parsable", "--chdir=/tmp", "-o", "/dev/null")
    out = subprocess.run([*cmd, *args], capture_output=True, text=True, timeout=60, cwd="/tmp")
    assert out.returncode == 0, out.stderr
    return int(out.stdout.strip().split(";")[0])


def squeue(client: SlurmClient) -> dict[int, dict[str, object]]:
    jobs = json.loads(client.runner.run(["squeue", "--json"])).get("jobs", [])
    return {int(j["job_id"]): j for j in jobs}


def state(job: dict[str, object]) -> str:
    s = job.get("job_state")
    return str(s[0] if isinstance(s, list) else s)


def tres(text: object) -> dict[str, str]:
    return dict(item.split("=", 1) for item in str(text).split(",") if "=" in item)


def test_the_loop_places_flexible_requests_on_the_policys_nodes(
    cluster: tuple[dict[str, str], SlurmClient], tmp_path: Path
) -> None:
    conf, client = cluster
    # 22.05's JSON does not say whether a job asked --switches, which topology/tree needs: the
    # loop hands such jobs back unchanged (``infeasible_request``) and Slurm places them
    legacy = conf.get("LINKWISE_SLURM_VERSION", "24.11") == "22.05"
    for q in client.queue():
        client.cancel(q.job_id)
    wait_for(lambda: not client.queue(), 60, "an empty queue")
    # free GPUs 1, 3, 2, 4 (gpu01-04), held by pinned blockers
    blockers = [
        sbatch(conf, "-J", "i33-block", "-w", name, "-N1", f"--gres=gpu:{used}", "--wrap=sleep 300")
        for name, used in (("gpu01", 3), ("gpu02", 1), ("gpu03", 2))
    ]
    wait_for(
        lambda: all(state(squeue(client).get(b, {})) == "RUNNING" for b in blockers),
        60,
        "the blockers to run",
    )
    # fifo's first fit: 5 GPUs as 3 + 2 on the nodes with 3 free (gpu02, gpu04), over both
    # leaves; then 3 tasks spread over gpu01 (1) and gpu03 (2): Slurm's split on both
    jobs = {
        # (without -N, --gpus=N and -n N --gpus-per-task=1 read as -N1 on 24.11 and 26.05:
        # max_nodes 1, a record the same as with -N1, which Slurm never spreads; a node range
        # says the split is Slurm's)
        "gpus5": sbatch(conf, "-J", "i33-gpus5", "--hold", "-N1-4", "--gpus=5", "--wrap=sleep 30"),
        "tasks3": sbatch(
            conf,
            "-J",
            "i33-tasks3",
            "--hold",
            "-N1-4",
            "-n3",
            "--gpus-per-task=1",
            "--wrap=sleep 30",
        ),
    }
    want = {"gpus5": {"gpu02": 3, "gpu04": 2}, "tasks3": {"gpu01": 1, "gpu03": 2}}
    before = {name: tres(squeue(client)[j]["tres_req_str"]) for name, j in jobs.items()}
    for job in jobs.values():  # handed to the loop the way job_submit.lua does
        client.runner.run(["scontrol", "update", f"JobId={job}", f"AdminComment={HOLD_TAG}"])
    cfg = ServeConfig(
        mode="active", partitions=("gpu",), slurm_env=str(FOLDER / "env"),
        policy=PolicySpec.parse("fifo"),
        db=str(tmp_path / "store.duckdb"), state_dir=str(tmp_path / "state"),
        lease_root=str(tmp_path / "leases"), interval_s=1.0, lease_s=60.0, max_cycles=6,
    )  # fmt: skip
    try:
        summary = serve(cfg)
        assert summary["cycles"] >= 1
        wait_for(
            lambda: all(state(squeue(client).get(j, {})) == "RUNNING" for j in jobs.values()),
            60,
            "the flexible jobs to run",
        )
        now = squeue(client)
        for name, job in jobs.items():
            rec = now[job]
            hosts = expand(str(rec["nodes"]))
            detail = rec["gres_detail"]
            assert isinstance(detail, list)
            got = {h: gres_gpus(str(d)) for h, d in zip(hosts, detail, strict=True)}
            after = tres(rec["tres_req_str"])
            assert after["gres/gpu"] == before[name]["gres/gpu"], (name, before, after)
            assert sum(got.values()) == int(after["gres/gpu"]), (name, got, after)
            if legacy:  # handed back: Slurm places it where it likes
                continue
            assert got == want[name], (name, got)  # the policy's nodes and split
            assert after["node"] == str(len(want[name])), (name, after)
            if name == "tasks3":  # one CPU per task: the CPUs it asked
                assert after["cpu"] == before[name]["cpu"], (name, before, after)
    finally:
        for job in [*jobs.values(), *blockers]:
            client.cancel(job)
    con = read_store(tmp_path / "store.duckdb")
    rows = con.execute(
        "SELECT job_id, command FROM audit WHERE actor = 'loop' AND outcome = 'ok'"
    ).fetchall()
    con.close()
    updates = {int(j): json.loads(c) for j, c in rows if "ReqNodeList" in c}
    if legacy:
        assert not set(updates) & set(jobs.values()), updates
        return
    for name, job in jobs.items():
        nodes = ",".join(sorted(want[name]))
        assert updates[job][3:] == [f"ReqNodeList={nodes}", f"NumNodes={len(want[name])}"]
