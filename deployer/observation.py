"""What the live loop sees in Slurm: the queue and the nodes of the managed partitions as a
``ClusterState`` with the jobs held for the loop (``build_observation``), each job's shape,
the checks a start must pass before it is applied (``check_start``) and the latest link load
from the store (``read_link_load``).

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
import itertools
import math
import os
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
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
    TransitJob,
)
from linkwise.cluster.hostlist import compress
from linkwise.cluster.placement import slurm_select_flexible, split_job_gpus
from linkwise.cluster.slurm import topology_rules
from linkwise.cluster.slurm.records import NodeInfo, QueuedJob
from linkwise.cluster.slurm.request import Request, count_request, flexible_gpus, widens
from linkwise.cluster.topology import load_topology
from linkwise.datasets.prediction import ensure_predicted
from linkwise.datasets.predictor import RuntimePredictor
from linkwise.deployer.holds import bypassed, held_for_loop, in_partitions
from linkwise.deployer.holds import stranded as is_stranded
from linkwise.deployer.migration import InTransit, opted_in
from linkwise.deployer.recorder import Recorder

__all__ = [
    "NodeRoom",
    "Observation",
    "build_observation",
    "check_flexible_start",
    "check_start",
    "job_flexible",
    "job_request",
    "job_shape",
    "left_to_slurm",
    "never_fits",
    "node_usable",
    "place_flexible_within",
    "place_within",
    "read_link_load",
    "slurm_topology",
]

DEFAULT_DURATION_S = 3600.0
_UNUSABLE_FLAGS = frozenset(
    {
        "DRAIN",
        "DRAINING",
        "DRAINED",
        "NOT_RESPONDING",
        "MAINTENANCE",
        "RESERVED",
        "FAIL",
        "POWERED_DOWN",
        "POWERING_DOWN",
        "POWER_DOWN",
        "REBOOT_REQUESTED",
        "REBOOT_ISSUED",
    }
)
_SIMPLE_FEATURES = re.compile(r"[A-Za-z0-9_.-]+(?:&[A-Za-z0-9_.-]+)*\Z")
_USABLE_STATES = frozenset({"IDLE", "MIXED", "ALLOCATED", "COMPLETING"})
Mode = Literal["shadow", "active"]
_MAX_FLOWS = 1024.0  # a measured NIC load counts as at most this many flows


@dataclass(frozen=True)
class NodeRoom:
    """What a node has left for a new job beyond GPUs: CPUs, memory, whether nothing runs on
    it (``--exclusive``), its features, and what it has in all."""

    usable: bool
    cpus: int
    cpus_free: int
    memory_mb: int  # 0: unknown (not checked)
    memory_free_mb: int
    idle: bool
    features: frozenset[str] = frozenset()
    topo_exclusive: bool = False  # holds a running --exclusive=topo job (topology/block)


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
    (``cluster.topology.load_topology``)."""
    return dataclasses.replace(load_topology(os.fspath(slurm_conf)), name=name)


def node_usable(info: NodeInfo) -> bool:
    """Whether a node can take new jobs (up, not draining, not failing)."""
    base, *flags = info.state.split("+")
    return base in _USABLE_STATES and not (_UNUSABLE_FLAGS & set(flags))


def job_request(q: QueuedJob) -> Request:
    """What the job asked Slurm for: its record's own request (``read_request``; not squeue's
    node-count estimate), else, for a record built by hand, its GPUs split over its nodes."""
    return q.request if q.request is not None else count_request(q.num_nodes, q.gpus)


def job_shape(job: QueuedJob) -> Shape | None:
    """Nodes and GPUs per node a node list must keep for the job (``job_request``); None when
    its shape is Slurm's to choose (``Request.flexible``)."""
    r = job_request(job)
    return None if r.flexible else Shape(r.nodes, r.gpus_per_node)


def job_flexible(job: QueuedJob) -> int:
    """The GPU count of a flexible request the loop places in any split (``flexible_gpus``:
    ``--gpus=N``, ``-n N --gpus-per-task=1``); 0 for every other request."""
    return flexible_gpus(job.request) if job.request is not None else 0


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


def never_fits(
    shape: Shape,
    topo: Topology,
    partition_nodes: Iterable[int],
    job: QueuedJob | None = None,
    rooms: Sequence[NodeRoom] = (),
) -> str | None:
    """Why a request can never fit the partition's nodes (None when it can); with ``job``
    and ``rooms``, only the nodes its constraints accept count (excluded nodes, features,
    CPUs and memory in all)."""
    big = [i for i in partition_nodes if topo.nodes[i].gpus >= shape.gpus_per_node]
    if len(big) < shape.nodes:
        return (
            f"needs {shape.nodes} node(s) x {shape.gpus_per_node} GPU(s); the partition has "
            f"{len(big)} node(s) with that many GPUs"
        )
    if job is not None and rooms:
        ok = [i for i in big if _static_misfit(job, topo.nodes[i].name, rooms[i]) is None]
        if len(ok) < shape.nodes:
            return (
                f"needs {shape.nodes} node(s) x {shape.gpus_per_node} GPU(s) its constraints "
                f"accept; the partition has {len(ok)}"
            )
    if job is not None:  # Slurm's topology rules (cluster.slurm.topology_rules), nodes free
        fit = [
            i for i in big if not rooms or _static_misfit(job, topo.nodes[i].name, rooms[i]) is None
        ]
        if topology_rules.place(topo, job.topology, shape.nodes, fit) is None:
            return (
                f"topology: no {shape.nodes} node(s) of the partition keep the rules of "
                f"topology/{topo.plugin} for it"
            )
    return None


def never_fits_flexible(
    job: QueuedJob,
    topo: Topology,
    partition_nodes: Iterable[int],
    rooms: Sequence[NodeRoom] = (),
) -> str | None:
    """Why a flexible request (``job_flexible``) can never fit the partition's nodes its
    constraints accept (too few GPUs, or fewer nodes than its minimum), None when it can."""
    gpus, least = job_flexible(job), job_request(job).min_nodes
    ok = [
        i
        for i in partition_nodes
        if topo.nodes[i].gpus > 0
        and (not rooms or _static_misfit(job, topo.nodes[i].name, rooms[i]) is None)
    ]
    have = sum(topo.nodes[i].gpus for i in ok)
    if have < gpus or len(ok) < least:
        return (
            f"needs {gpus} GPU(s) on at least {least} node(s); the nodes its constraints "
            f"accept have {have} GPU(s) on {len(ok)} node(s)"
        )
    return None


def topology_left_to_slurm(q: QueuedJob, topo: Topology) -> tuple[str, str] | None:
    """("topology", reason) when Slurm's topology rules for the job are not modelled
    (``topology_rules.left_to_slurm``): handed back unchanged; None otherwise."""
    r = job_request(q)
    nodes = r.nodes or r.max_nodes or job_flexible(q)
    why = topology_rules.left_to_slurm(topo, q.topology, max(1, nodes))
    return None if why is None else ("topology", why)


def _topology_verdict(
    topo: Topology, q: QueuedJob, nodes: Sequence[int], rooms: Sequence[NodeRoom]
) -> topology_rules.Verdict:
    """Whether Slurm's topology rules accept ``nodes`` for the job, other jobs as ``rooms``
    show them (not idle; running --exclusive=topo)."""
    return topology_rules.check_nodes(
        topo, q.topology, nodes, busy=_busy(rooms), topo_held=_topo_held(rooms)
    )


def _busy(rooms: Sequence[NodeRoom]) -> list[int]:
    return [i for i, r in enumerate(rooms) if not r.idle]


def _topo_held(rooms: Sequence[NodeRoom]) -> list[int]:
    return [i for i, r in enumerate(rooms) if r.topo_exclusive]


def left_to_slurm(q: QueuedJob) -> tuple[str, str] | None:
    """(label, reason) when the loop does not model what the job asks, so Slurm must place
    it (handed back unchanged, at once); None when the loop can place it itself."""
    if q.het_job_id:
        return "heterogeneous", f"heterogeneous job {q.het_job_id}+{q.het_job_offset}"
    if q.array_job_id:
        what = f"tasks {q.array_tasks}" if q.array_tasks else f"task {q.array_task_id}"
        return "array", f"job array {q.array_job_id} ({what}): one node list cannot serve them"
    if q.features and not _SIMPLE_FEATURES.match(q.features):
        return "constraint", f"constraint expression {q.features[:80]!r}"
    if q.unmodelled:
        return "unmodelled", "asks what the loop does not model: " + ", ".join(q.unmodelled)
    flexible = job_request(q).flexible
    if flexible and q.request is None:  # built by hand: an uneven split
        return "shape", flexible
    if flexible and not job_flexible(q):
        return "unmodelled", f"Slurm chooses its shape: {flexible}"
    return None


def _features_of(q: QueuedJob) -> set[str]:
    return {f for f in q.features.split("&") if f}


def _static_misfit(q: QueuedJob, name: str, room: NodeRoom) -> str | None:
    """Why the node can never take the job (its constraints), None when it can."""
    if name in q.excluded_nodes:
        return "excluded"
    missing = _features_of(q) - room.features
    if missing:
        return "lacks feature " + "&".join(sorted(missing))
    if q.cpus_per_node > room.cpus > 0:
        return f"has {room.cpus} CPU(s)"
    if room.memory_mb and q.mem_per_node_mb > room.memory_mb:
        return f"has {room.memory_mb} MB"
    return None


def node_misfit(q: QueuedJob, name: str, room: NodeRoom) -> str | None:
    """Why the node cannot take the job now (constraints, state, CPUs, memory, exclusive),
    None when it can (GPUs are checked apart)."""
    why = _static_misfit(q, name, room)
    if why is not None:
        return why
    if not room.usable:
        return "not usable"
    if q.cpus_per_node > room.cpus_free or room.cpus_free <= 0:
        return f"{room.cpus_free} free CPU(s)"
    if room.memory_mb and q.mem_per_node_mb > room.memory_free_mb:
        return f"{room.memory_free_mb} MB free"
    if q.exclusive and not room.idle:
        return "not idle (--exclusive)"
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
        link_flows=_flows(topo, out.running, link_load or {}),
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
    rooms = [_room(info.get(t.name), i in in_part) for i, t in enumerate(topo.nodes)]
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


def _flows(
    topo: Topology, running: Sequence[RunningJob], link_load: Mapping[str, float]
) -> tuple[int, ...]:
    """Rings on each link, raised on a node's NIC to the flows its measured load counts as."""
    flows = link_flows(topo, (r.placement for r in running))
    for name, load in link_load.items():
        k = topo.node_index.get(name)
        rate = _rate(load)
        if k is not None and rate is not None and topo.nodes[k].nic_gbps > 0:
            measured = round(min(rate / (topo.nodes[k].nic_gbps * 1e9), _MAX_FLOWS))
            flows[k] = max(flows[k], measured)
    return tuple(flows)


def _room(info: NodeInfo | None, in_partition: bool) -> NodeRoom:
    if info is None:
        return NodeRoom(False, 0, 0, 0, 0, False)
    cpus_free = max(0, info.cpus - info.cpus_alloc) if info.cpus else 1
    return NodeRoom(
        usable=in_partition and node_usable(info),
        cpus=info.cpus,
        cpus_free=cpus_free,
        memory_mb=info.memory_mb,
        memory_free_mb=max(0, info.memory_mb - info.memory_alloc_mb),
        idle=info.cpus_alloc == 0 and info.gpus_used == 0,
        features=frozenset(info.features),
    )


def take_room(room: NodeRoom, q: QueuedJob) -> NodeRoom:
    """What is left of a node once the job starts on it (an exclusive job takes it all;
    an --exclusive=topo job marks it ``topo_exclusive``)."""
    if q.topology.exclusive_topo:
        room = dataclasses.replace(room, topo_exclusive=True)
    if q.exclusive:
        return dataclasses.replace(room, cpus_free=0, memory_free_mb=0, idle=False)
    return dataclasses.replace(
        room,
        cpus_free=max(0, room.cpus_free - max(1, q.cpus_per_node)),
        memory_free_mb=max(0, room.memory_free_mb - q.mem_per_node_mb),
        idle=False,
    )


def check_start(
    placement: Placement,
    shape: Shape,
    free: Sequence[int],
    topo: Topology,
    job: QueuedJob | None = None,
    rooms: Sequence[NodeRoom] = (),
) -> str | None:
    """Why a start cannot be applied as is (None when it can): Slurm runs the job on exactly
    the placement's nodes with its own GPUs per node, so the node count must match the job
    and every node needs that many free GPUs (held jobs skip Slurm's feasibility check);
    with ``job`` and ``rooms`` every node must also be one Slurm accepts for the job
    (``constraint: ...``: excluded, features, state, CPUs, memory, exclusive, contiguous)."""
    if any(not 0 <= n < len(topo.nodes) for n in placement.nodes):
        return "unknown node"
    if placement.num_nodes != shape.nodes:
        return f"shape: {placement.num_nodes} node(s) chosen, the job asks {shape.nodes}"
    if job is not None and rooms:
        bad = [
            f"{topo.nodes[n].name} {why}"
            for n in placement.nodes
            if (why := node_misfit(job, topo.nodes[n].name, rooms[n])) is not None
        ]
        if bad:
            return "constraint: " + "; ".join(bad)
        if job.contiguous and not _contiguous(placement.nodes):
            return "constraint: --contiguous needs consecutive nodes"
        verdict = _topology_verdict(topo, job, placement.nodes, rooms)
        if not verdict.ok:  # Slurm would give it no allocation there (or wait first)
            return f"constraint: topology {verdict.reason}"
    short = [topo.nodes[n].name for n in placement.nodes if free[n] < shape.gpus_per_node]
    if short:
        return f"busy: {','.join(short)} lack {shape.gpus_per_node} free GPU(s)"
    return None


def _contiguous(nodes: Sequence[int]) -> bool:
    ordered = sorted(nodes)
    return all(b == a + 1 for a, b in itertools.pairwise(ordered))


def place_within(
    job: QueuedJob,
    shape: Shape,
    free: Sequence[int],
    topo: Topology,
    rooms: Sequence[NodeRoom],
    prefer: Sequence[int] = (),
) -> Placement | None:
    """The job's requested shape on nodes Slurm accepts for it that have room now (the
    ``prefer``red nodes first, then in Slurm's node order; consecutive ones for
    ``--contiguous``); None when there is none."""
    fits = [
        i
        for i in range(len(topo.nodes))
        if free[i] >= shape.gpus_per_node and node_misfit(job, topo.nodes[i].name, rooms[i]) is None
    ]
    if topo.plugin in ("tree", "block") and not job.contiguous:  # Slurm's topology rules
        ranked = list(dict.fromkeys([i for i in prefer if i in fits] + fits))
        found = topology_rules.place(
            topo, job.topology, shape.nodes, ranked, busy=_busy(rooms), topo_held=_topo_held(rooms)
        )
        return None if found is None else Placement.of([(i, shape.gpus_per_node) for i in found])
    if job.contiguous and shape.nodes > 1:
        ok = set(fits)
        windows = [
            list(range(s, s + shape.nodes))
            for s in range(len(topo.nodes) - shape.nodes + 1)
            if all(i in ok for i in range(s, s + shape.nodes))
        ]
        if not windows:
            return None
        best = max(windows, key=lambda w: len(set(w) & set(prefer)))
        return Placement.of([(i, shape.gpus_per_node) for i in best])
    order = [i for i in prefer if i in fits] + [i for i in fits if i not in prefer]
    chosen = list(dict.fromkeys(order))[: shape.nodes]
    if len(chosen) < shape.nodes:
        return None
    return Placement.of([(i, shape.gpus_per_node) for i in chosen])


def check_flexible_start(
    placement: Placement,
    job: QueuedJob,
    free: Sequence[int],
    topo: Topology,
    rooms: Sequence[NodeRoom] = (),
) -> str | None:
    """Why a start of a flexible request (``job_flexible``) cannot be applied as is (None when
    it can). ``NumNodes`` and the node list make Slurm allocate exactly the placement's nodes,
    but Slurm splits the GPUs over them itself (``split_job_gpus``, on the free GPUs it sees)
    and no update can force another split without changing the request: a placement whose
    split is not Slurm's is ``split: ...``. Otherwise as ``check_start``: ``shape: ...`` (not
    its GPU count or node range), ``constraint: ...``, ``busy: ...``."""
    if any(not 0 <= n < len(topo.nodes) for n, _ in placement.alloc):
        return "unknown node"
    request = job_request(job)
    gpus = [g for _, g in placement.alloc]
    why = widens(request, gpus)
    if why is not None:
        return f"shape: {why}"
    if rooms:
        bad = [
            f"{topo.nodes[n].name} {why}"
            for n in placement.nodes
            if (why := node_misfit(job, topo.nodes[n].name, rooms[n])) is not None
        ]
        if bad:
            return "constraint: " + "; ".join(bad)
        if job.contiguous and not _contiguous(placement.nodes):
            return "constraint: --contiguous needs consecutive nodes"
        verdict = _topology_verdict(topo, job, placement.nodes, rooms)
        if not verdict.ok:
            return f"constraint: topology {verdict.reason}"
    short = [topo.nodes[n].name for n, g in placement.alloc if free[n] < g]
    if short:
        return f"busy: {','.join(short)} lack the GPUs it takes there"
    slurm = split_job_gpus(placement.nodes, free, sum(gpus))
    if slurm != placement:
        shown = "none" if slurm is None else "+".join(str(g) for _, g in slurm.alloc)
        return (
            f"split: Slurm splits {sum(gpus)} GPU(s) over these nodes as {shown}, "
            f"not {'+'.join(map(str, gpus))}"
        )
    return None


def place_flexible_within(
    job: QueuedJob, free: Sequence[int], topo: Topology, rooms: Sequence[NodeRoom]
) -> Placement | None:
    """Slurm's own choice for a flexible request (``slurm_select_flexible``) among the nodes
    Slurm accepts for it now, if that start passes ``check_flexible_start``; else None."""
    ok = [
        f if node_misfit(job, topo.nodes[i].name, rooms[i]) is None else 0
        for i, f in enumerate(free)
    ]
    found = slurm_select_flexible(topo, ok, job_flexible(job))
    if found is None or check_flexible_start(found, job, free, topo, rooms) is not None:
        return None
    return found


def read_link_load(
    recorder: Recorder,
    cluster: str,
    since: float,
    on_bad: Callable[[int], None] | None = None,
) -> dict[str, float]:
    """The latest valid NIC load (bytes/s, the busiest device and direction) of each node.

    A rate that is NaN, infinite, negative or not a number is ignored: the latest valid one
    of its link counts instead, and ``on_bad`` is told how many rows of the window were
    ignored (the loop counts them; it never dies on a bad row)."""
    rows = recorder.query(
        "SELECT node, arg_max(bytes_per_s, ts) FILTER (WHERE isfinite(bytes_per_s) "
        "AND bytes_per_s >= 0), count(*) FILTER (WHERE bytes_per_s IS NULL "
        "OR NOT isfinite(bytes_per_s) OR bytes_per_s < 0) FROM link_load "
        "WHERE ts >= ? AND link_class IN ('ib', 'eth') AND (cluster = ? OR cluster = '') "
        "GROUP BY node, device, direction",
        [since, cluster],
    )
    out: dict[str, float] = {}
    bad = 0
    for node, load, n_bad in rows or []:
        bad += int(n_bad or 0)
        value = _rate(load)
        if value is None:
            bad += load is not None
            continue
        out[str(node)] = max(out.get(str(node), 0.0), value)
    if bad and on_bad is not None:
        on_bad(bad)
    return out


def _rate(value: object) -> float | None:
    """A finite, non-negative rate, else None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    rate = float(value)
    return rate if math.isfinite(rate) and rate >= 0 else None
