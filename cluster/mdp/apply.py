"""Applying one step's move to a local copy of the state (pure)."""

from __future__ import annotations

from dataclasses import replace

from linkwise.cluster.contention import ContentionModel
from linkwise.cluster.domain import ClusterState, RunningJob, Start
from linkwise.cluster.mdp.slowdown import link_flows


def apply_start(state: ClusterState, start: Start, model: ContentionModel) -> ClusterState:
    """The state after one start at the same time (pure; ValueError if infeasible).

    The new running job gets its isolated rate; the others keep theirs (the encoder reads
    placements, not rates).
    """
    pj = next((p for p in state.pending if p.job.job_id == start.job_id), None)
    if pj is None:
        raise ValueError(f"job {start.job_id} is not pending")
    if start.placement.num_gpus != pj.job.num_gpus:
        raise ValueError(f"job {start.job_id}: placement has the wrong GPU count")
    free = list(state.free_gpus)
    for node, g in start.placement.alloc:
        if not 0 <= node < len(free) or free[node] < g:
            raise ValueError(f"job {start.job_id}: {g} GPUs not free on node {node}")
        free[node] -= g
    flows = list(link_flows(state))
    if start.placement.num_nodes > 1:
        for link in state.topology.ring_links(start.placement.nodes):
            flows[link] += 1
    rate = model.rates(state.topology, [(pj.job, start.placement)])[0]
    run = RunningJob(
        job=pj.job,
        placement=start.placement,
        start_time=state.time,
        remaining_s=pj.remaining_s,
        rate=rate,
        attained_gpu_s=pj.attained_gpu_s,
        preemptions=pj.preemptions,
        since=state.time,
    )
    return replace(
        state,
        free_gpus=tuple(free),
        running=(*state.running, run),
        pending=tuple(p for p in state.pending if p is not pj),
        link_flows=tuple(flows),
    )
