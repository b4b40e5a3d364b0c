"""What a node has left for a new job beyond GPUs (``NodeRoom``), as Slurm's nodes show it,
and whether a job's constraints let it run there: excluded nodes, features, CPUs, memory,
``--exclusive``, node state (``node_misfit``; ``static_misfit``: the constraints alone,
which never change)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

from linkwise.cluster.slurm.records import NodeInfo, QueuedJob

__all__ = [
    "NodeRoom",
    "busy_nodes",
    "node_misfit",
    "node_usable",
    "room_of",
    "static_misfit",
    "take_room",
    "topo_held_nodes",
]

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
_USABLE_STATES = frozenset({"IDLE", "MIXED", "ALLOCATED", "COMPLETING"})


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


def node_usable(info: NodeInfo) -> bool:
    """Whether a node can take new jobs (up, not draining, not failing)."""
    base, *flags = info.state.split("+")
    return base in _USABLE_STATES and not (_UNUSABLE_FLAGS & set(flags))


def room_of(info: NodeInfo | None, in_partition: bool) -> NodeRoom:
    """A node's room (nothing usable when Slurm did not list it or it is outside the
    managed partitions)."""
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


def _features_of(q: QueuedJob) -> set[str]:
    return {f for f in q.features.split("&") if f}


def static_misfit(q: QueuedJob, name: str, room: NodeRoom) -> str | None:
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
    why = static_misfit(q, name, room)
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


def busy_nodes(rooms: Sequence[NodeRoom]) -> list[int]:
    """The nodes something runs on (not idle)."""
    return [i for i, r in enumerate(rooms) if not r.idle]


def topo_held_nodes(rooms: Sequence[NodeRoom]) -> list[int]:
    """The nodes of running --exclusive=topo jobs."""
    return [i for i, r in enumerate(rooms) if r.topo_exclusive]
