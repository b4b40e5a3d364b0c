"""What the live loop sees in Slurm: the queue and the nodes of the managed partitions as a
``ClusterState`` with the jobs held for the loop (``build_observation``), each job's shape
(``job_requests``), every node's room (``node_rooms``) and the flows the measured link load
counts as (``link_load``). The checks a start must pass are ``start_checks``.

A job is what squeue shows of it (``_job``): id, submit time, GPUs, nodes, user, name and
time limit, its communication profile (``deployer.profiles``: declared in its comment, else
from earlier runs of its name, else the default) and whether it may be preempted or migrated
(``Job.preemptible``: True only if it opted in, ``migration.opted_in``). Its true run time is
unknown here, so ``Job.duration`` is only a placeholder (the limit, else an hour) that no
policy reads (``docs/INFORMATION.md``); with a run-time ``predictor`` (the serving package's)
every job carries its predictions, and a running job its attained service (GPUs x the time
since it started), as in training.

Moves under way (``MigrationExecutor.in_transit``) are ``ClusterState.transit``: a job
signalled and within its grace holds its GPUs and is not running; a migrated job waiting for
Slurm to restart it is not pending; the GPUs of a migration's target are reserved (not in
``free_gpus``), so no policy starts another job there meanwhile."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from linkwise.cluster.domain import (
    ClusterState,
    Job,
    PendingJob,
    Placement,
    RunningJob,
    Shape,
    Topology,
    TransitJob,
)
from linkwise.cluster.hostlist import compress
from linkwise.cluster.slurm.records import NodeInfo, QueuedJob
from linkwise.cluster.topology.load import load_topology
from linkwise.datasets.prediction import ensure_predicted
from linkwise.datasets.predictor import RuntimePredictor
from linkwise.deployer.holds import bypassed, held_for_loop, in_partitions
from linkwise.deployer.holds import stranded as is_stranded
from linkwise.deployer.job_requests import (
    job_flexible,
    job_shape,
    left_to_slurm,
    never_fits,
    never_fits_flexible,
    topology_left_to_slurm,
)
from linkwise.deployer.link_load import measured_flows
from linkwise.deployer.migration import InTransit, opted_in
from linkwise.deployer.node_rooms import NodeRoom, room_of, take_room

__all__ = ["Observation", "build_observation", "slurm_topology"]

DEFAULT_DURATION_S = 3600.0
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
    rooms: tuple[NodeRoom, ...] = ()  # per topology node (CPUs, memory, features, idle)
    kinds: Mapping[int, str] = dataclasses.field(default_factory=dict)  # refused -> a label
    stranded: tuple[QueuedJob, ...] = ()  # released by the loop; Slurm cannot run it there
    partition_moved: tuple[QueuedJob, ...] = ()  # tagged held, partition changed by its user
    # free GPUs before the targets of moves under way are reserved (``state.free_gpus`` has
    # them taken): what a finishing move checks its own target against
    slurm_free: tuple[int, ...] = ()


def slurm_topology(slurm_conf: str | os.PathLike[str], name: str = "slurm") -> Topology:
    """The topology of a slurm.conf (and a topology.conf beside it, if any), named ``name``
    (``cluster.topology.load.load_topology``)."""
    return dataclasses.replace(load_topology(os.fspath(slurm_conf)), name=name)


def _job(q: QueuedJob, profile: str = "") -> Job:
    """The ``Job`` a policy sees: the requested shape, user, name and time limit as Slurm has
    them, its communication profile and whether it opted in to moves (the duration is a
    placeholder no policy reads: the limit, or an hour without one; the true run time is
    unknown here)."""
    limit = q.time_limit_s if q.time_limit_s and q.time_limit_s > 0 else 0.0
    shape = job_shape(q)
    # the node count Slurm enforces: a shape every placement keeps (``Job.flexible`` False)
    nodes = shape.nodes if shape is not None and shape.num_gpus == q.gpus else 0
    return Job(
        q.job_id,
        q.submit_time,
        q.gpus,
        limit or DEFAULT_DURATION_S,
        user=q.user,
        name=q.name,
        nodes=nodes,
        time_limit=limit,
        profile=profile,
        preemptible=opted_in(q.comment, q.requeue),
        flexible=False if nodes else (True if job_flexible(q) else None),
    )


def build_observation(
    queue: Sequence[QueuedJob],
    nodes: Sequence[NodeInfo],
    topo: Topology,
    partitions: Sequence[str],
    now: float,
    *,
    mode: Mode,
    link_load: Mapping[str, float] | None = None,
    inflight: Mapping[int, Placement] | None = None,
    predictor: RuntimePredictor | None = None,
    profiles: Mapping[int, str] | None = None,
    transit: Sequence[InTransit] = (),
) -> Observation:
    """Build the policy's view from Slurm's queue and nodes.

    ``link_load``: measured bytes/s on each node's NIC; a NIC loaded to utilisation ``u``
    counts as ``round(u)`` flows when that is more than the rings linkwise sees.
    ``inflight``: jobs released by the loop that Slurm has not started yet (their
    placements): their GPUs are taken out of the free count.
    ``predictor``: the run-time predictor that annotates every job (the serving package's);
    None leaves them without predictions (a learned policy then annotates them itself).
    ``profiles``: each job's communication profile (``profiles.resolve_profiles``; a job
    absent keeps "", which a contention model does not know).
    ``transit``: the moves under way (``MigrationExecutor.in_transit``; module docstring).
    """
    part_nodes, rooms, free = _partition_nodes(nodes, topo, set(partitions))
    seen = _Seen(
        topo=topo,
        partitions=frozenset(partitions),
        part_nodes=part_nodes,
        rooms=tuple(rooms),
        now=now,
        mode=mode,
        moving={t.job_id: t for t in transit},
        predictor=predictor,
        profiles=profiles or {},
    )
    out = _Sorted()
    for q in queue:
        if in_partitions(q, seen.partitions) and bypassed(q):
            out.gone.append(q)
        if q.state == "RUNNING" and q.nodes:
            _sort_running(seen, out, q)
        elif q.state == "PENDING":
            _sort_pending(seen, out, q)
    rooms = _with_topo_exclusive(queue, topo.node_index, rooms)
    _take_inflight(queue, inflight or {}, free, rooms)
    slurm_free = tuple(free)
    _reserve_targets(out.reserve, free)
    pending = sorted(out.pending, key=lambda p: (p.job.submit_time, p.job.job_id))
    state = ClusterState(
        time=now,
        topology=topo,
        free_gpus=tuple(free),
        running=tuple(out.running),
        pending=tuple(pending),
        link_flows=measured_flows(topo, out.running, link_load or {}),
        transit=tuple(sorted(out.transit, key=lambda t: t.job.job_id)),
    )
    return Observation(
        state=state,
        managed=out.managed,
        shapes=out.shapes,
        no_gpu=tuple(out.no_gpu) + tuple(out.refused_jobs.values()),
        refused=out.refused,
        running_ids=frozenset(out.started),
        started=out.started,
        held_total=out.held_total,
        bypassed=tuple(out.gone),
        foreign_held=out.foreign,
        rooms=tuple(rooms),
        kinds=out.kinds,
        stranded=tuple(out.stranded),
        partition_moved=tuple(out.moved),
        slurm_free=slurm_free,
    )


@dataclass(frozen=True)
class _Seen:
    """What ``build_observation`` reads each queued job against."""

    topo: Topology
    partitions: frozenset[str]
    part_nodes: Sequence[int]  # topology indices of the managed partitions' nodes
    rooms: Sequence[NodeRoom]  # per topology node, before running jobs' topology marks
    now: float
    mode: Mode
    moving: Mapping[int, InTransit]
    predictor: RuntimePredictor | None
    profiles: Mapping[int, str]

    def job(self, q: QueuedJob) -> Job:
        """The job as a policy sees it, with its profile and predictions."""
        job = _job(q, self.profiles.get(q.job_id, ""))
        return ensure_predicted((job,), self.predictor)[0]

    def target(self, q: QueuedJob, t: InTransit) -> Placement | None:
        """Where a move under way restarts the job; None when a node is not in the topology."""
        index = self.topo.node_index
        idx = [index[n] for n in t.target if n in index]
        if not idx or len(idx) != len(t.target):
            return None
        return Placement.of([(i, max(1, q.gpus // len(idx))) for i in idx])


@dataclass
class _Sorted:
    """The queue as ``build_observation`` sorts it, job by job (see ``Observation``)."""

    running: list[RunningJob] = dataclasses.field(default_factory=list)
    started: dict[int, tuple[float, str]] = dataclasses.field(default_factory=dict)
    pending: list[PendingJob] = dataclasses.field(default_factory=list)
    managed: dict[int, QueuedJob] = dataclasses.field(default_factory=dict)
    shapes: dict[int, Shape] = dataclasses.field(default_factory=dict)
    no_gpu: list[QueuedJob] = dataclasses.field(default_factory=list)
    refused: dict[int, str] = dataclasses.field(default_factory=dict)
    kinds: dict[int, str] = dataclasses.field(default_factory=dict)
    refused_jobs: dict[int, QueuedJob] = dataclasses.field(default_factory=dict)
    gone: list[QueuedJob] = dataclasses.field(default_factory=list)
    stranded: list[QueuedJob] = dataclasses.field(default_factory=list)
    moved: list[QueuedJob] = dataclasses.field(default_factory=list)
    held_total: int = 0
    foreign: int = 0
    transit: list[TransitJob] = dataclasses.field(default_factory=list)
    # (target, GPUs it holds itself) of each move under way
    reserve: list[tuple[Placement, Placement | None]] = dataclasses.field(default_factory=list)

    def refuse(self, q: QueuedJob, kind: str, why: str) -> None:
        self.refused[q.job_id] = why
        self.kinds[q.job_id] = kind
        self.refused_jobs[q.job_id] = q


def _partition_nodes(
    nodes: Sequence[NodeInfo], topo: Topology, partitions: set[str]
) -> tuple[list[int], list[NodeRoom], list[int]]:
    """The managed partitions' nodes (topology indices), every topology node's room, and
    the free GPUs per node (only usable partition nodes with a free CPU count)."""
    index = topo.node_index
    info = {n.name: n for n in nodes}
    part_nodes = sorted(
        index[n.name] for n in nodes if n.name in index and partitions & set(n.partitions)
    )
    in_part = set(part_nodes)
    rooms = [room_of(info.get(t.name), i in in_part) for i, t in enumerate(topo.nodes)]
    free = [0] * len(topo.nodes)
    for i in part_nodes:
        ni = info[topo.nodes[i].name]
        if rooms[i].usable and rooms[i].cpus_free > 0:
            free[i] = max(0, min(ni.gpus_total, topo.nodes[i].gpus) - ni.gpus_used)
    return part_nodes, rooms, free


def _sort_running(seen: _Seen, out: _Sorted, q: QueuedJob) -> None:
    """A running job: running on its nodes, or in transit (signalled, checkpointing, its
    GPUs held; the target of its move reserved)."""
    now = seen.now
    index = seen.topo.node_index
    out.started[q.job_id] = (q.start_time or now, compress(q.nodes))
    idx = [index[n] for n in q.nodes if n in index]
    if q.gpus <= 0 or not idx:
        return
    per = max(1, q.gpus // len(idx))
    job = seen.job(q)
    begun = q.start_time or now
    here = Placement.of([(i, per) for i in idx])
    t = seen.moving.get(q.job_id)
    if t is not None and t.draining:  # signalled: checkpointing, GPUs held
        target = seen.target(q, t)
        out.transit.append(
            TransitJob(
                job=job,
                held=here,
                target=target,
                until=t.until,
                attained_gpu_s=q.gpus * max(0.0, now - begun),
            )
        )
        if target is not None:
            out.reserve.append((target, here))
        return
    out.running.append(
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


def _sort_pending(seen: _Seen, out: _Sorted, q: QueuedJob) -> None:
    """A pending job: the policy's to start (``managed``), in transit (a migrated job
    restarting on its target), refused (handed back: several partitions, not modelled,
    never fits), without GPUs, stranded, or left alone (not the loop's)."""
    active = seen.mode == "active"
    if q.partition not in seen.partitions:
        if active and held_for_loop(q) and in_partitions(q, seen.partitions):
            # held for the loop but now of several partitions (job_submit.lua holds only
            # jobs of one): its partition was changed; Slurm chooses
            out.refuse(q, "several_partitions", f"several partitions ({q.partition})")
            out.moved.append(q)
            out.held_total += 1
        return
    if active and is_stranded(q):
        out.stranded.append(q)
    t = seen.moving.get(q.job_id)
    if t is not None and not t.draining and q.gpus > 0:  # migrated, restarts on target
        target = seen.target(q, t)
        if target is not None:
            out.transit.append(TransitJob(job=seen.job(q), held=None, target=target, until=t.until))
            out.reserve.append((target, None))
            return
    ours = held_for_loop(q)
    out.held_total += ours
    out.foreign += q.held and not ours
    if (active and not ours) or (seen.mode == "shadow" and q.held):
        return  # active: only jobs held for the loop; shadow: held ones wait anyway
    unmodelled = left_to_slurm(q) if ours else None
    if unmodelled is None and ours:
        unmodelled = topology_left_to_slurm(q, seen.topo)
    if unmodelled is not None:
        out.refuse(q, *unmodelled)
        return
    if q.gpus <= 0:
        if ours:
            out.no_gpu.append(q)
        return
    shape = job_shape(q)
    if shape is None and not job_flexible(q):  # Slurm chooses: not planned (shadow too)
        return
    if shape is None:  # a GPU count in any split (``job_flexible``)
        why = never_fits_flexible(q, seen.topo, seen.part_nodes, seen.rooms)
    else:
        why = never_fits(shape, seen.topo, seen.part_nodes, q, seen.rooms)
    if why is not None:
        out.refuse(q, "never_fits", why)
        return
    out.managed[q.job_id] = q
    if shape is not None:
        out.shapes[q.job_id] = shape
    job = seen.job(q)
    out.pending.append(PendingJob(job, remaining_s=job.duration))


def _with_topo_exclusive(
    queue: Sequence[QueuedJob], index: Mapping[str, int], rooms: Sequence[NodeRoom]
) -> list[NodeRoom]:
    """The rooms with the nodes of running --exclusive=topo jobs marked (topology/block
    rule X1)."""
    out = list(rooms)
    for q in queue:
        if q.state == "RUNNING" and q.topology.exclusive_topo:
            for i in (index[n] for n in q.nodes if n in index):
                out[i] = dataclasses.replace(out[i], topo_exclusive=True)
    return out


def _take_inflight(
    queue: Sequence[QueuedJob],
    inflight: Mapping[int, Placement],
    free: list[int],
    rooms: list[NodeRoom],
) -> None:
    """Take the GPUs (from ``free``) and the room (from ``rooms``) of the jobs released by
    the loop that Slurm has not started yet (their placements)."""
    by_id = {q.job_id: q for q in queue}
    for j, placed in inflight.items():
        for i, g in placed.alloc:
            free[i] = max(0, free[i] - g)
            if j in by_id:
                rooms[i] = take_room(rooms[i], by_id[j])


def _reserve_targets(
    reserve: Sequence[tuple[Placement, Placement | None]], free: list[int]
) -> None:
    """Take the GPUs of the moves' targets from ``free`` (a target's GPUs are the moving
    job's: those it holds itself are not taken twice)."""
    for target, own in reserve:
        mine = dict(own.alloc) if own is not None else {}
        for i, g in target.alloc:
            free[i] = max(0, free[i] - max(0, g - mine.get(i, 0)))
