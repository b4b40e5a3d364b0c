"""What a queued job asks Slurm for, and whether the live loop can place it: its request
(``job_request``), the shape a node list must keep (``job_shape``) or the GPU count of a
flexible request (``job_flexible``), what the loop leaves to Slurm (``left_to_slurm``,
``topology_left_to_slurm``), and why a request can never fit the partition (``never_fits``,
``never_fits_flexible``)."""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

from linkwise.cluster.domain import Shape, Topology
from linkwise.cluster.slurm import topology_rules
from linkwise.cluster.slurm.records import QueuedJob
from linkwise.cluster.slurm.request import Request, count_request, flexible_gpus
from linkwise.deployer.node_rooms import NodeRoom, static_misfit

__all__ = [
    "job_flexible",
    "job_request",
    "job_shape",
    "left_to_slurm",
    "never_fits",
    "never_fits_flexible",
    "topology_left_to_slurm",
]

_SIMPLE_FEATURES = re.compile(r"[A-Za-z0-9_.-]+(?:&[A-Za-z0-9_.-]+)*\Z")


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


def topology_left_to_slurm(q: QueuedJob, topo: Topology) -> tuple[str, str] | None:
    """("topology", reason) when Slurm's topology rules for the job are not modelled
    (``topology_rules.left_to_slurm``): handed back unchanged; None otherwise."""
    r = job_request(q)
    nodes = r.nodes or r.max_nodes or job_flexible(q)
    why = topology_rules.left_to_slurm(topo, q.topology, max(1, nodes))
    return None if why is None else ("topology", why)


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
        ok = [i for i in big if static_misfit(job, topo.nodes[i].name, rooms[i]) is None]
        if len(ok) < shape.nodes:
            return (
                f"needs {shape.nodes} node(s) x {shape.gpus_per_node} GPU(s) its constraints "
                f"accept; the partition has {len(ok)}"
            )
    if job is not None:  # Slurm's topology rules (cluster.slurm.topology_rules), nodes free
        fit = [
            i for i in big if not rooms or static_misfit(job, topo.nodes[i].name, rooms[i]) is None
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
        and (not rooms or static_misfit(job, topo.nodes[i].name, rooms[i]) is None)
    ]
    have = sum(topo.nodes[i].gpus for i in ok)
    if have < gpus or len(ok) < least:
        return (
            f"needs {gpus} GPU(s) on at least {least} node(s); the nodes its constraints "
            f"accept have {have} GPU(s) on {len(ok)} node(s)"
        )
    return None
