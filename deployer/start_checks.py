"""The checks a start must pass before the live loop applies it, and the placements it
moves a start to when the policy's break the job's constraints.

Slurm runs a held job on exactly the node list the loop sets, with its own GPUs per node
(``check_start``: node count, free GPUs, the nodes the job accepts, ``--contiguous``, Slurm's
topology rules); a flexible request's GPUs Slurm splits itself (``check_flexible_start``).
``place_within`` and ``place_flexible_within`` find the requested shape, or Slurm's own
choice, on nodes the job accepts that have room now."""

from __future__ import annotations

import itertools
from collections.abc import Sequence

from linkwise.cluster.domain import Placement, Shape, Topology
from linkwise.cluster.placement.slurm_select import slurm_select_flexible, split_job_gpus
from linkwise.cluster.slurm import topology_rules
from linkwise.cluster.slurm.records import QueuedJob
from linkwise.cluster.slurm.request import widens
from linkwise.deployer.job_requests import job_flexible, job_request
from linkwise.deployer.node_rooms import NodeRoom, busy_nodes, node_misfit, topo_held_nodes

__all__ = ["check_flexible_start", "check_start", "place_flexible_within", "place_within"]


def _topology_verdict(
    topo: Topology, q: QueuedJob, nodes: Sequence[int], rooms: Sequence[NodeRoom]
) -> topology_rules.Verdict:
    """Whether Slurm's topology rules accept ``nodes`` for the job, other jobs as ``rooms``
    show them (not idle; running --exclusive=topo)."""
    return topology_rules.check_nodes(
        topo, q.topology, nodes, busy=busy_nodes(rooms), topo_held=topo_held_nodes(rooms)
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
            topo,
            job.topology,
            shape.nodes,
            ranked,
            busy=busy_nodes(rooms),
            topo_held=topo_held_nodes(rooms),
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
