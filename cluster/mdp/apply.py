"""Applying one step's move (a start, a preemption, a migration) to a local copy of the state
(pure): what the stepping loops and log matching see between steps of one decision point."""

from __future__ import annotations

from dataclasses import replace

from linkwise.cluster.contention import ContentionModel
from linkwise.cluster.domain import (
    ClusterState,
    Decision,
    PendingJob,
    RunningJob,
    Start,
    TransitJob,
)
from linkwise.cluster.mdp.config import MdpConfig
from linkwise.cluster.mdp.slowdown import link_flows
from linkwise.cluster.restart import parse_restart


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
        remaining_s=pj.remaining_s + pj.restore_s,
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


def local_grace(cfg: MdpConfig) -> float:
    """The grace the stepping loops assume for a preemption or a migration: the restart
    model's (``MdpConfig.restart_cost``) with running rows, else 0 (no such moves)."""
    return parse_restart(cfg.restart_cost).grace_s if cfg.running_slots else 0.0


def _release(state: ClusterState, run: RunningJob) -> tuple[list[int], list[int]]:
    """Free GPUs and link flows without ``run`` (its GPUs counted free, its ring gone)."""
    free = list(state.free_gpus)
    for node, g in run.placement.alloc:
        free[node] += g
    flows = list(link_flows(state))
    if run.placement.num_nodes > 1:
        for link in state.topology.ring_links(run.placement.nodes):
            flows[link] -= 1
    return free, flows


def _running(state: ClusterState, job_id: int) -> RunningJob:
    run = next((r for r in state.running if r.job.job_id == job_id), None)
    if run is None:
        raise ValueError(f"job {job_id} is not running")
    return run


def apply_preempt(state: ClusterState, job_id: int, grace_s: float) -> ClusterState:
    """The state after preempting a running job at the same time (pure; ValueError if it is
    not running), as the simulator does it: with a grace it drains (``ClusterState.transit``,
    its GPUs held, not free), without one it is back in the queue at once (its GPUs free)."""
    run = _running(state, job_id)
    t = state.time
    free, flows = _release(state, run)
    running = tuple(r for r in state.running if r is not run)
    attained = run.attained_at(t)
    if grace_s > 0:
        for node, g in run.placement.alloc:  # still held while it checkpoints
            free[node] -= g
        drain = TransitJob(run.job, run.placement, None, t + grace_s, attained, run.preemptions + 1)
        return replace(
            state,
            free_gpus=tuple(free),
            running=running,
            link_flows=tuple(flows),
            transit=(*state.transit, drain),
        )
    back = PendingJob(run.job, run.remaining_at(t), attained, run.preemptions + 1)
    pending = sorted((*state.pending, back), key=lambda p: (p.job.submit_time, p.job.job_id))
    return replace(
        state,
        free_gpus=tuple(free),
        running=running,
        pending=tuple(pending),
        link_flows=tuple(flows),
    )


def apply_migrate(
    state: ClusterState, move: Start, model: ContentionModel, grace_s: float
) -> ClusterState:
    """The state after migrating a running job to ``move.placement`` at the same time (pure;
    ValueError if it is not running or the target is neither free nor its own), as the
    simulator does it: the target is reserved at once (its own GPUs first); with a grace the
    job drains (``transit``: its GPUs outside the target held), without one it runs there."""
    run = _running(state, move.job_id)
    if move.placement.num_gpus != run.job.num_gpus:
        raise ValueError(f"job {move.job_id}: placement has the wrong GPU count")
    own = dict(run.placement.alloc)
    free, flows = _release(state, run)
    for node, g in move.placement.alloc:
        if not 0 <= node < len(free) or free[node] < g:
            raise ValueError(f"job {move.job_id}: {g} GPUs neither free nor its own on {node}")
        free[node] -= g
    running = tuple(r for r in state.running if r is not run)
    t = state.time
    if grace_s > 0:
        target = dict(move.placement.alloc)
        for node, g in own.items():  # held while it checkpoints, unless the target took them
            free[node] -= g - min(g, target.get(node, 0))
        drain = TransitJob(
            run.job, run.placement, move.placement, t + grace_s, run.attained_at(t), run.preemptions
        )
        return replace(
            state,
            free_gpus=tuple(free),
            running=running,
            link_flows=tuple(flows),
            transit=(*state.transit, drain),
        )
    if move.placement.num_nodes > 1:
        for link in state.topology.ring_links(move.placement.nodes):
            flows[link] += 1
    rate = model.rates(state.topology, [(run.job, move.placement)])[0]
    moved = replace(
        run,
        placement=move.placement,
        start_time=t,
        remaining_s=run.remaining_at(t),
        rate=rate,
        attained_gpu_s=run.attained_at(t),
        since=t,
    )
    return replace(
        state,
        free_gpus=tuple(free),
        running=(*running, moved),
        link_flows=tuple(flows),
    )


def apply_decision(
    state: ClusterState, decision: Decision, model: ContentionModel, grace_s: float
) -> ClusterState:
    """The state after a decision at the same time: preemptions, migrations, then starts
    (the order the simulator applies them in)."""
    s = state
    for job_id in decision.preempt:
        s = apply_preempt(s, job_id, grace_s)
    for move in decision.migrate:
        s = apply_migrate(s, move, model, grace_s)
    for start in decision.starts:
        s = apply_start(s, start, model)
    return s
