"""End to end on the real local Slurm: a burst of jobs, their accounting, the log transitions."""

from __future__ import annotations

import math
import os
import subprocess
import time
from pathlib import Path

import polars as pl
import pytest

from linkwise.cluster.contention import AnalyticModel
from linkwise.cluster.mdp import MdpConfig, make_spec
from linkwise.cluster.profiles import load_calibration
from linkwise.cluster.slurm.client import SlurmClient, read_env_file
from linkwise.cluster.topology.slurm_conf import parse_slurm_nodes
from linkwise.datasets.decisions import build_log_transitions
from linkwise.datasets.ingest import ingest_job_runs, ingest_nodes
from linkwise.datasets.log_jobs import load_log_jobs, topology_from_store
from linkwise.datasets.store import open_store
from linkwise.datasets.transitions import check_frame

pytestmark = pytest.mark.services

SLURM_DIR = Path(os.environ.get("LINKWISE_SLURM_DIR", "/tmp/linkwise-slurm"))
SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "local-slurm"

# (nodes, GPUs per node, seconds): 1-, 2- and 4-GPU jobs and 2-node jobs, more than the
# 16 GPUs of the local cluster at once, so some wait and start as others end
BURST = (
    (1, 4, 4),
    (1, 2, 3),
    (2, 2, 3),
    (1, 1, 2),
    (1, 4, 5),
    (2, 4, 3),
    (1, 2, 2),
    (1, 1, 4),
    (2, 1, 2),
    (1, 4, 2),
    (1, 2, 3),
    (1, 1, 2),
)


@pytest.fixture(scope="module")
def env() -> dict[str, str]:
    env_file = SLURM_DIR / "env"
    status = subprocess.run([str(SCRIPT), "status"], capture_output=True, check=False)
    if not env_file.exists() or status.returncode != 0:
        pytest.fail(f"local Slurm is not up in {SLURM_DIR}: run `scripts/local-slurm start`")
    return read_env_file(env_file)


def test_burst_on_real_slurm_becomes_transitions(env: dict[str, str]) -> None:
    client = SlurmClient.from_env(env, "cli")
    cluster = env["LINKWISE_SLURM_CLUSTER"]
    t0 = float(math.floor(time.time())) - 1
    ids = [
        client.submit(f"sleep {s}", name=f"burst-{k}", nodes=n, gpus_per_node=g, time_limit_min=2)
        for k, (n, g, s) in enumerate(BURST)
    ]
    deadline = time.time() + 240  # generous: Slurm is slower on a loaded machine
    while any(q.job_id in ids for q in client.queue()):
        assert time.time() < deadline, "the burst did not finish within 240 s"
        time.sleep(0.5)
    runs = client.jobs(t0)
    while not all(r.settled for r in runs if r.job_id in ids) and time.time() < deadline:
        time.sleep(0.5)
        runs = client.jobs(t0)

    con = open_store(":memory:")
    ingest_nodes(con, cluster, client.nodes())
    ingest_job_runs(con, runs, source="slurm")
    topo = topology_from_store(con, cluster)
    conf_nodes = parse_slurm_nodes(Path(env["SLURM_CONF"]).read_text())
    assert {n.name: n.gpus for n in topo.nodes} == conf_nodes

    model = AnalyticModel(load_calibration())
    spec = make_spec(MdpConfig())
    df, rep = build_log_transitions(
        con, topology=topo, spec=spec, model=model, cluster=cluster, since=t0
    )
    check_frame(df)
    print("live log report:", rep.to_json())

    jobs, skipped = load_log_jobs(con, topo, cluster, since=t0)
    mine = jobs.filter(pl.col("slurm_job_id").is_in(ids))
    assert mine.height == len(BURST), f"burst jobs skipped: {skipped}"
    by_id = {int(r["slurm_job_id"]): r for r in mine.iter_rows(named=True)}
    for jid, (n, g, _) in zip(ids, BURST, strict=True):  # accounting says where they ran
        assert len(by_id[jid]["alloc_idx"]) == n and by_id[jid]["alloc_gpus"] == [g] * n

    # every start is a step; its placement was recovered from the candidates
    assert df.height > 0 and rep.starts == jobs.height >= len(BURST)
    assert rep.exact + rep.nearest + rep.unslotted == rep.starts
    assert rep.unslotted == 0  # the default 8 slots hold this short queue
    # a start is "exact" exactly when Slurm's placement is among the candidates; jobs of
    # -N 2 that one node could hold are spread where the candidates consolidate (a Job has
    # no node count)
    kinds = {jid: kind for jid, kind, _ in rep.start_matches}
    assert set(ids) <= set(kinds)
    spread = [jid for jid, (n, g, _) in zip(ids, BURST, strict=True) if n > 1 and n * g <= 4]
    single = [jid for jid, (n, _, _) in zip(ids, BURST, strict=True) if n == 1]
    assert all(kinds[j] == "nearest" for j in spread)
    single_exact = sum(kinds[j] == "exact" for j in single) / len(single)
    print(f"exact: {rep.exact_match_share:.2f} of all starts, {single_exact:.2f} of 1-node jobs")
    assert single_exact >= 0.6  # cons_tres mostly takes the lowest node that fits
    starts = df.filter(pl.col("match").is_in(["exact", "nearest"]))
    assert starts.height == rep.starts and (starts["reward"] == 0).all()
    for action, mask in zip(df["action"].to_list(), df["mask"].to_list(), strict=True):
        assert mask[action]
    # the sbatch burst waited for the scheduler while GPUs were free: wait transitions
    assert rep.waits >= 1

    # rewards add up to minus the jobs-in-system integral: the total JCT of the replayed jobs
    jct = jobs.select((pl.col("end") - pl.max_horizontal("submit", pl.lit(t0))).sum()).item()
    assert math.isclose(df["reward"].sum(), -jct / spec.config.time_scale_s, rel_tol=1e-9)
