"""The demo with the history from a real local Slurm (``make demo-slurm``; root only):
``run_demo_slurm`` submits a burst of GPU sleep jobs to the cluster ``scripts/local-slurm
start`` runs, waits for them, collects the accounting with ``pipelines.collect_accounting``,
then runs the demo's steps 2-7 (``pipelines.demo.run_pipeline``) on it. No PPO: there is no
trace to replay."""

from __future__ import annotations

import json
import math
import time
from contextlib import closing
from dataclasses import replace
from pathlib import Path

import numpy as np

from linkwise.cluster.slurm.client import SlurmClient, read_env_file
from linkwise.datasets.rollouts import jobs_from_store
from linkwise.datasets.store import open_store
from linkwise.deployer.observation import slurm_topology
from linkwise.pipelines.collect_accounting import collect_accounting
from linkwise.pipelines.console import Stages
from linkwise.pipelines.demo import DemoResult, run_pipeline
from linkwise.pipelines.experiment import Experiment, Windows, get_experiment
from linkwise.pipelines.history import PARTITION, HistoryReport
from linkwise.pipelines.workspace import workspace

__all__ = ["run_demo_slurm", "submit_burst"]


def submit_burst(env_file: str, n: int, seed: int, max_s: float) -> list[int]:
    """Submit ``n`` GPU jobs (``sleep``) to the local Slurm; their ids."""
    client = SlurmClient.from_env_file(env_file)
    per_node = max(n.gpus_total for n in client.nodes())  # the cluster's node size
    rng = np.random.default_rng(seed)
    ids: list[int] = []
    for i in range(n):
        gpus = int(rng.choice([1, 1, 1, 2, 4, 8]))
        nodes = max(1, -(-gpus // per_node))  # larger jobs span nodes, like -N k
        secs = int(rng.integers(5, max(6, int(max_s))))
        ids.append(
            client.submit(
                f"sleep {secs}",
                name=f"demo-{i}",
                nodes=nodes,
                gpus_per_node=gpus // nodes,
                partition=PARTITION,
            )
        )
        time.sleep(float(rng.exponential(0.5)))
    return ids


def run_demo_slurm(
    out_dir: str | Path = "linkwise-out/demo-slurm",
    *,
    slurm_env: str = "/tmp/linkwise-slurm/env",
    jobs: int = 60,
    max_job_s: float = 40.0,
    experiment: str | Experiment = "ci",
    seed: int = 0,
    tracking_uri: str | None = None,
    wait_s: float = 900.0,
    progress: bool = True,
) -> DemoResult:
    """The demo's pipeline with the history from the real local Slurm (``scripts/local-slurm
    start`` first; root only): submit a burst of ``jobs`` sleep jobs, wait for them, collect
    the accounting with ``pipelines.collect_accounting.collect_accounting``, then steps 2-7
    on it (the cluster's topology from its slurm.conf, the experiment's budgets)."""
    exp = get_experiment(experiment)
    ws = workspace(out_dir, tracking_uri, progress)
    env = read_env_file(slurm_env)
    conf = env.get("SLURM_CONF")
    if not conf:
        raise ValueError(f"{slurm_env}: no SLURM_CONF (run scripts/local-slurm start as root)")
    name = env.get("LINKWISE_SLURM_CLUSTER", "slurm")
    topo = slurm_topology(conf, name=name)
    stages = Stages(ws.console, 7)
    stages.begin("history", f"Submit {jobs} jobs to the local Slurm and collect accounting")
    t0 = time.time() - 60
    ids = set(submit_burst(slurm_env, jobs, seed, max_job_s))
    client = SlurmClient.from_env_file(slurm_env)
    deadline = time.time() + wait_s
    while time.time() < deadline and any(q.job_id in ids for q in client.queue()):
        time.sleep(2.0)
    report = collect_accounting(client, ws.db, cluster=name, since=t0)
    ws.console.print(json.dumps(report.to_dict(), default=str)[:400])
    with closing(open_store(ws.db)) as con:
        frame = jobs_from_store(con, cluster=name, since=t0)
    span = frame["submit_time"]
    history = HistoryReport(
        cluster=name,
        topology=topo.name,
        scheduler="slurm",
        jobs=frame.height,
        first_submit=float(span.min()) if frame.height else math.nan,  # type: ignore[arg-type]
        last_end=time.time(),
        avg_queue_s=math.nan,
        p99_queue_s=math.nan,
        queued_share=math.nan,
        inserted=report.total("inserted"),
        rejected=report.total("rejected"),
        seconds=time.time() - t0,
    )
    # windows on the submit span of the burst (the grid the evaluation's split uses), so a
    # few of them stay held out whatever the jobs' run times
    submit_span = float(span.max() - span.min()) if frame.height else 0.0  # type: ignore[operator,arg-type]
    window = max(5.0, submit_span / (exp.evaluation.heldout_windows + 3))
    # a burst of seconds is too short to bootstrap in blocks: replay its windows as they were
    exp = replace(
        exp,
        topology=str(Path(conf).parent),  # the slurm.conf folder
        windows=Windows(window, block_s=0.0, min_jobs=2, warm_start=exp.windows.warm_start),
        dataset=replace(exp.dataset, log_window_s=window),
    )
    return run_pipeline(
        ws, exp, slurm_cluster=name, history=history,
        workload=f"local Slurm {name}: {len(ids)} submitted", stages=stages, seed=seed,
    )  # fmt: skip
