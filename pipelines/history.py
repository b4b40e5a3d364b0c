"""A cluster's history, replayed: a workload scheduled by a Slurm-like heuristic in the
simulator, stored as that cluster's accounting exactly where real accounting goes
(``datasets.ingest``, as ``pipelines.collect_accounting`` does): every job as a settled
``JobRun`` with the node names and GPUs per node it ran on, the nodes as ``NodeInfo``."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import closing
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from linkwise.cluster.contention import AnalyticModel
from linkwise.cluster.domain import ClusterState, Decision, Job, Placement, Topology
from linkwise.cluster.loop import drive
from linkwise.cluster.profiles import assign_profiles, load_calibration
from linkwise.cluster.simulator.engine import Simulator
from linkwise.cluster.simulator.records import JobRecord
from linkwise.cluster.slurm.records import JobRun, NodeInfo
from linkwise.datasets.ingest import ingest_job_runs, ingest_nodes
from linkwise.datasets.rollouts import jobs_from_store
from linkwise.datasets.store import open_store
from linkwise.datasets.synthetic import generate
from linkwise.datasets.traces import frame_jobs, load_trace
from linkwise.pipelines.collect_accounting import accounting_source_name
from linkwise.policies.heuristics import make_policy

__all__ = [
    "DEMO_EPOCH",
    "PARTITION",
    "HistoryReport",
    "accounting_jobs",
    "history_runs",
    "node_infos",
    "replay_history",
    "workload_jobs",
]

PARTITION = "gpu"  # the replayed cluster's one partition
DEMO_EPOCH = 1_704_067_200.0  # Monday 2024-01-01 00:00 UTC: the synthetic history's clock


@dataclass(frozen=True)
class HistoryReport:
    """What the replayed history put into the store."""

    cluster: str  # the accounting cluster name
    topology: str
    scheduler: str
    jobs: int
    first_submit: float
    last_end: float
    avg_queue_s: float
    p99_queue_s: float
    queued_share: float  # jobs that waited more than a minute
    inserted: int
    rejected: int
    seconds: float

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def node_infos(topology: Topology, cpus: int = 64) -> list[NodeInfo]:
    """The topology's nodes as sinfo would describe them (idle, partition ``gpu``)."""
    return [NodeInfo(n.name, "IDLE", (PARTITION,), cpus, n.gpus, 0) for n in topology.nodes]


def history_runs(
    records: Sequence[JobRecord],
    placements: Mapping[int, Placement],
    topology: Topology,
    cluster: str,
) -> list[JobRun]:
    """One settled, completed ``JobRun`` per simulated job record (its last placement as the
    node names and GPUs per node Slurm would report)."""
    runs: list[JobRun] = []
    for r in records:
        job: Job = r.job
        pl_ = placements[job.job_id]
        names = tuple(topology.nodes[i].name for i in pl_.nodes)
        per = tuple(g for _, g in pl_.alloc)
        runs.append(
            JobRun(
                cluster=cluster,
                job_id=job.job_id,
                run_index=0,
                name=job.name or f"train-{job.job_id}",
                user=job.user or "demo",
                account="linkwise",
                partition=PARTITION,
                state="COMPLETED",
                exit_code=0,
                signal=None,
                submit_time=job.submit_time,
                start_time=r.first_start,
                end_time=r.end,
                time_limit_s=None,
                nodes=names,
                gpus=pl_.num_gpus,
                gpus_per_node=per,
                allocation_nodes=len(names),
                settled=True,
            )
        )
    return runs


def replay_history(
    jobs: Sequence[Job],
    topology: Topology,
    db: str | Path,
    *,
    cluster: str,
    scheduler: str = "backfill",
    calibration: str | None = None,
    seed: int = 0,
    on_progress: Callable[[int, int], None] | None = None,
) -> HistoryReport:
    """Replay ``jobs`` under the heuristic ``scheduler`` in the simulator and store the result
    as the cluster's accounting (``ingest_job_runs``, ``ingest_nodes``, the watermark)."""
    t0 = time.perf_counter()
    cal = load_calibration(calibration)
    profiled = assign_profiles(jobs, cal, seed=seed)
    sim = Simulator(topology, profiled, AnalyticModel(cal))
    placements: dict[int, Placement] = {}
    total = len(profiled)

    def on_decision(_state: ClusterState, decision: Decision) -> None:
        for s in decision.starts:
            placements[s.job_id] = s.placement
        if on_progress is not None and sim.events % 500 == 0:
            on_progress(len(sim.records), total)

    drive(sim, make_policy(scheduler), on_decision=on_decision)
    if on_progress is not None:
        on_progress(len(sim.records), total)
    records = sim.records
    runs = history_runs(records, placements, topology, cluster)
    queue = np.array([r.queue_s for r in records]) if records else np.zeros(1)
    with closing(open_store(db)) as con:
        ingest_nodes(con, cluster, node_infos(topology))
        rep = ingest_job_runs(
            con,
            runs,
            source=accounting_source_name(cluster),
            watermark=max((r.end for r in records), default=None),
        )
    return HistoryReport(
        cluster=cluster,
        topology=topology.name,
        scheduler=scheduler,
        jobs=len(runs),
        first_submit=min((r.submit_time for r in runs), default=math.nan),
        last_end=max((r.end for r in records), default=math.nan),
        avg_queue_s=float(queue.mean()),
        p99_queue_s=float(np.percentile(queue, 99)),
        queued_share=float(np.mean(queue > 60.0)),
        inserted=rep.inserted,
        rejected=rep.rejected,
        seconds=time.perf_counter() - t0,
    )


def workload_jobs(
    trace: str | Path | None,
    trace_format: str,
    *,
    jobs: int,
    load_scale: float,
    max_gpus: int,
    seed: int,
    min_gpus: int = 1,
) -> tuple[list[Job], str]:
    """The history's jobs on an epoch clock, with positive ids (Slurm's), and a description:
    the trace's valid jobs (at its origin epoch) or the synthetic default workload, those
    asking ``min_gpus`` to ``max_gpus`` GPUs."""
    if trace is not None:
        tr = load_trace(trace, trace_format)
        origin = tr.origin_epoch or DEMO_EPOCH
        raw = [j for j in tr.jobs if min_gpus <= j.num_gpus <= max_gpus]
        what = f"trace {trace} ({tr.format}, {len(raw)} of {len(tr.jobs)} jobs kept)"
    else:
        raw = [
            j
            for j in generate(jobs, seed=seed, load_scale=load_scale, max_gpus=max_gpus)
            if j.num_gpus >= min_gpus
        ]
        origin = DEMO_EPOCH
        what = f"synthetic default workload ({jobs} jobs, seed {seed}, load x{load_scale})"
    if min_gpus > 1:
        what += f", jobs of at least {min_gpus} GPUs"
    shift = 1 - min((j.job_id for j in raw), default=1)
    out = [
        replace(j, job_id=j.job_id + max(0, shift), submit_time=j.submit_time + origin) for j in raw
    ]
    return out, what


def accounting_jobs(
    db: str | Path,
    *,
    cluster: str,
    since: float | None = None,
    until: float | None = None,
    max_gpus: int,
) -> list[Job]:
    """The accounting's finished jobs submitted in [since, until) as the simulator's ``Job``s
    (id, submit time, GPUs, run time, user, name, time limit; no profile: ``assign_profiles``
    gives one; no predictions: a run-time predictor annotates them), those asking at most
    ``max_gpus``."""
    with closing(open_store(db)) as con:
        frame = jobs_from_store(con, cluster=cluster, since=since, until=until)
    return [j for j in frame_jobs(frame) if j.num_gpus <= max_gpus]
