"""What the live loop sees in Slurm: the queue and the nodes of the managed partitions as a
``ClusterState`` with the jobs held for the loop (``build_observation``), each job's shape,
the checks a start must pass before it is applied (``check_start``) and the latest link load
from the store (``read_link_load``).

A job is what squeue shows of it (``_job``): id, submit time, GPUs, nodes, user, name and
time limit. Its true run time is unknown here, so ``Job.duration`` is only a placeholder (the
limit, else an hour) that no policy reads (``docs/INFORMATION.md``); with a run-time
``predictor`` (the serving package's) every job carries its predictions, and a running job
its attained service (GPUs x the time since it started), as in training."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from linkwise.cluster.contention import link_flows
from linkwise.cluster.domain import (
    ClusterState,
    Job,
    PendingJob,
    Placement,
    RunningJob,
    Shape,
    Topology,
)
from linkwise.cluster.hostlist import compress
from linkwise.cluster.slurm.records import NodeInfo, QueuedJob
from linkwise.cluster.topology import load_topology
from linkwise.datasets.prediction import ensure_predicted
from linkwise.datasets.predictor import RuntimePredictor
from linkwise.deployer.safety import Recorder, bypassed, held_for_loop, in_partitions

__all__ = [
    "Observation",
    "build_observation",
    "check_start",
    "job_shape",
    "never_fits",
    "node_usable",
    "read_link_load",
    "slurm_topology",
]

DEFAULT_DURATION_S = 3600.0
_UNUSABLE_FLAGS = frozenset(
    {"DRAIN", "DRAINING", "DRAINED", "NOT_RESPONDING", "MAINTENANCE", "FAIL", "POWERED_DOWN"}
)
_USABLE_STATES = frozenset({"IDLE", "MIXED", "ALLOCATED", "COMPLETING"})
Mode = Literal["shadow", "active"]


@dataclass(frozen=True)
class Observation:
    """A ClusterState and what the loop needs beside it to act on Slurm."""

    state: ClusterState
    managed: Mapping[int, QueuedJob]  # jobs the policy may start (active: held for the loop)
    shapes: Mapping[int, Shape]
    no_gpu: tuple[QueuedJob, ...]  # held for the loop, no GPUs or never fits: handed back
    refused: Mapping[int, str]  # held for the loop, can never fit -> why (released unchanged)
    running_ids: frozenset[int]
    started: Mapping[int, tuple[float, str]]  # running job -> (start time, nodes)
    held_total: int  # held for the loop
    bypassed: tuple[QueuedJob, ...] = ()  # tagged as held for the loop, no longer held
    foreign_held: int = 0  # held, but not for the loop (an admin's, a user's own): left alone


def slurm_topology(slurm_conf: str | os.PathLike[str], name: str = "slurm") -> Topology:
    """The topology of a slurm.conf (and a topology.conf beside it, if any), named ``name``
    (``cluster.topology.load_topology``)."""
    return dataclasses.replace(load_topology(os.fspath(slurm_conf)), name=name)


def node_usable(info: NodeInfo) -> bool:
    """Whether a node can take new jobs (up, not draining, not failing)."""
    base, *flags = info.state.split("+")
    return base in _USABLE_STATES and not (_UNUSABLE_FLAGS & set(flags))


def job_shape(job: QueuedJob) -> Shape:
    """Nodes and GPUs per node of a job (GPUs split evenly, as ``--gres=gpu:g`` asks)."""
    n = max(1, job.num_nodes)
    return Shape(n, -(-job.gpus // n) if job.gpus else 0)


def _job(q: QueuedJob) -> Job:
    """The ``Job`` a policy sees: the requested shape, user, name and time limit as Slurm has
    them (the duration is a placeholder no policy reads: the limit, or an hour without one;
    the true run time is unknown here)."""
    limit = q.time_limit_s if q.time_limit_s and q.time_limit_s > 0 else 0.0
    nodes = q.num_nodes if q.num_nodes > 0 and q.gpus % q.num_nodes == 0 else 0
    return Job(
        q.job_id,
        q.submit_time,
        q.gpus,
        limit or DEFAULT_DURATION_S,
        user=q.user,
        name=q.name,
        nodes=nodes,
        time_limit=limit,
    )


def never_fits(shape: Shape, topo: Topology, partition_nodes: Iterable[int]) -> str | None:
    """Why a request can never fit the partition's nodes (None when it can)."""
    big = [i for i in partition_nodes if topo.nodes[i].gpus >= shape.gpus_per_node]
    if len(big) < shape.nodes:
        return (
            f"needs {shape.nodes} node(s) x {shape.gpus_per_node} GPU(s); the partition has "
            f"{len(big)} node(s) with that many GPUs"
        )
    return None


def build_observation(
    queue: Sequence[QueuedJob],
    nodes: Sequence[NodeInfo],
    topo: Topology,
    partitions: Sequence[str],
    now: float,
    *,
    mode: Mode,
    link_load: Mapping[str, float] | None = None,
    inflight: Mapping[int, tuple[tuple[int, ...], int]] | None = None,
    predictor: RuntimePredictor | None = None,
) -> Observation:
    """Build the policy's view from Slurm's queue and nodes.

    ``link_load``: measured bytes/s on each node's NIC; a NIC loaded to utilisation ``u``
    counts as ``round(u)`` flows when that is more than the rings linkwise sees.
    ``inflight``: jobs released by the loop that Slurm has not started yet (node indices,
    GPUs per node): their GPUs are taken out of the free count.
    ``predictor``: the run-time predictor that annotates every job (the serving package's);
    None leaves them without predictions (a learned policy then annotates them itself).
    """
    managed_parts = set(partitions)
    index = topo.node_index
    info = {n.name: n for n in nodes}
    part_nodes = sorted(
        index[n.name] for n in nodes if n.name in index and managed_parts & set(n.partitions)
    )
    free = [0] * len(topo.nodes)
    for i in part_nodes:
        ni = info[topo.nodes[i].name]
        if node_usable(ni):
            free[i] = max(0, min(ni.gpus_total, topo.nodes[i].gpus) - ni.gpus_used)
    running: list[RunningJob] = []
    started: dict[int, tuple[float, str]] = {}
    pending: list[PendingJob] = []
    managed: dict[int, QueuedJob] = {}
    shapes: dict[int, Shape] = {}
    no_gpu: list[QueuedJob] = []
    refused: dict[int, str] = {}
    refused_jobs: dict[int, QueuedJob] = {}
    gone: list[QueuedJob] = []
    held_total = foreign = 0
    for q in queue:
        if in_partitions(q, managed_parts) and bypassed(q):
            gone.append(q)
        if q.state == "RUNNING" and q.nodes:
            started[q.job_id] = (q.start_time or now, compress(q.nodes))
            idx = [index[n] for n in q.nodes if n in index]
            if q.gpus > 0 and idx:
                per = max(1, q.gpus // len(idx))
                job = ensure_predicted((_job(q),), predictor)[0]
                begun = q.start_time or now
                running.append(
                    RunningJob(
                        job=job,
                        placement=Placement.of([(i, per) for i in idx]),
                        start_time=begun,
                        # a placeholder: no policy reads a running job's remaining work
                        remaining_s=max(1.0, begun + job.duration - now),
                        rate=1.0,
                        attained_gpu_s=q.gpus * max(0.0, now - begun),
                        since=now,
                    )
                )
            continue
        if q.state != "PENDING":
            continue
        if q.partition not in managed_parts:
            if mode == "active" and held_for_loop(q) and in_partitions(q, managed_parts):
                # held for the loop but submitted to several partitions: Slurm chooses
                refused[q.job_id] = f"several partitions ({q.partition}): left to Slurm"
                refused_jobs[q.job_id] = q
                held_total += 1
            continue
        ours = held_for_loop(q)
        held_total += ours
        foreign += q.held and not ours
        if (mode == "active" and not ours) or (mode == "shadow" and q.held):
            continue  # active: only jobs held for the loop; shadow: held ones wait anyway
        if q.gpus <= 0:
            if ours:
                no_gpu.append(q)
            continue
        shape = job_shape(q)
        why = never_fits(shape, topo, part_nodes)
        if why is not None:
            refused[q.job_id] = why
            refused_jobs[q.job_id] = q
            continue
        managed[q.job_id] = q
        shapes[q.job_id] = shape
        job = ensure_predicted((_job(q),), predictor)[0]
        pending.append(PendingJob(job, remaining_s=job.duration))
    for nodes_idx, per in (inflight or {}).values():
        for i in nodes_idx:
            free[i] = max(0, free[i] - per)
    pending.sort(key=lambda p: (p.job.submit_time, p.job.job_id))
    flows = link_flows(topo, (r.placement for r in running))
    for name, load in (link_load or {}).items():
        k = index.get(name)
        if k is not None and topo.nodes[k].nic_gbps > 0:
            measured = round(load / (topo.nodes[k].nic_gbps * 1e9))
            flows[k] = max(flows[k], measured)
    state = ClusterState(
        time=now,
        topology=topo,
        free_gpus=tuple(free),
        running=tuple(running),
        pending=tuple(pending),
        link_flows=tuple(flows),
    )
    return Observation(
        state=state,
        managed=managed,
        shapes=shapes,
        no_gpu=tuple(no_gpu) + tuple(refused_jobs.values()),
        refused=refused,
        running_ids=frozenset(started),
        started=started,
        held_total=held_total,
        bypassed=tuple(gone),
        foreign_held=foreign,
    )


def check_start(
    placement: Placement, shape: Shape, free: Sequence[int], topo: Topology
) -> str | None:
    """Why a start cannot be applied as is (None when it can): Slurm runs the job on exactly
    the placement's nodes with its own GPUs per node, so the node count must match the job
    and every node needs that many free GPUs (held jobs skip Slurm's feasibility check)."""
    if any(not 0 <= n < len(topo.nodes) for n in placement.nodes):
        return "unknown node"
    if placement.num_nodes != shape.nodes:
        return f"shape: {placement.num_nodes} node(s) chosen, the job asks {shape.nodes}"
    short = [topo.nodes[n].name for n in placement.nodes if free[n] < shape.gpus_per_node]
    if short:
        return f"busy: {','.join(short)} lack {shape.gpus_per_node} free GPU(s)"
    return None


def read_link_load(recorder: Recorder, cluster: str, since: float) -> dict[str, float]:
    """The latest NIC load (bytes/s, the busiest device and direction) of each node."""
    rows = recorder.query(
        "SELECT node, arg_max(bytes_per_s, ts) FROM link_load "
        "WHERE ts >= ? AND link_class IN ('ib', 'eth') AND (cluster = ? OR cluster = '') "
        "GROUP BY node, device, direction",
        [since, cluster],
    )
    out: dict[str, float] = {}
    for node, load in rows or []:
        out[str(node)] = max(out.get(str(node), 0.0), float(load))
    return out
