"""Rows for running jobs (``MdpConfig.running_slots``): which running jobs get a slot, and
their migrate candidates.

A running job may be preempted or migrated only if it is preemptable (``known.may_preempt``:
its ``Job.preemptible`` when known, live only jobs that opted in; else a deterministic share
of the jobs in the simulator) and has run at least ``min_run_s`` since
its last start; a draining job (checkpointing after a preemption or a migration) is no
longer running (``ClusterState.transit``) and gets no row. The eligible jobs fill the
running slots round-robin from ``RUN_ORDERS`` (most attained service, most predicted
remaining GPU time, most predicted slowdown where it runs; ties in ``state.running`` order).

A slot's migrate candidates are the generators' placements on the state without the job
(its own GPUs count as free: the simulator may reserve them for its restart), predicted
by the contention model next to the other running jobs; a candidate equal to the job's
current placement is masked (a migration that moves nothing).
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass, replace

from linkwise.cluster.contention import ContentionModel
from linkwise.cluster.domain import ClusterState, Placement, RunningJob
from linkwise.cluster.mdp.config import RUN_ORDERS, MdpConfig
from linkwise.cluster.mdp.known import may_preempt, predicted_remaining, restart_seconds
from linkwise.cluster.mdp.placements import builder_of
from linkwise.cluster.mdp.slots import round_robin
from linkwise.cluster.mdp.slowdown import Contention, Prediction, comm_intensity, link_flows
from linkwise.cluster.restart import parse_restart


@dataclass(frozen=True, eq=False)
class RunningRows:
    """The running slots of one state and everything their rows need."""

    slots: tuple[RunningJob, ...]
    ranks: tuple[tuple[float, ...], ...]  # per slot, its scaled rank in each of RUN_ORDERS
    slowdown: tuple[float, ...]  # the model's predicted slowdown where it runs (t/t_best - 1)
    restart_s: tuple[float, ...]  # what a preemption or migration costs it (restart model)
    intensity: tuple[float, ...]  # its communication share (``slowdown.comm_intensity``)
    # per slot with ``migrate`` (else empty): the state without the job (its GPUs free), and
    # its migrate candidates, their predictions, and which are unmasked
    bases: tuple[ClusterState, ...]
    placements: tuple[tuple[Placement | None, ...], ...]
    redundant: tuple[tuple[bool, ...], ...]
    predictions: tuple[tuple[Prediction | None, ...], ...]
    movable: tuple[tuple[bool, ...], ...]


def eligible(state: ClusterState, cfg: MdpConfig) -> list[RunningJob]:
    """The running jobs that may be preempted or migrated now (see the module docstring)."""
    draining = {t.job.job_id for t in state.transit}
    return [
        r
        for r in state.running
        if may_preempt(r.job, cfg.preempt_share)
        and state.time - r.start_time >= cfg.min_run_s
        and r.job.job_id not in draining
    ]


def without(state: ClusterState, run: RunningJob) -> ClusterState:
    """The state with ``run`` gone and its GPUs free (the base of its migrate candidates)."""
    free = list(state.free_gpus)
    for node, g in run.placement.alloc:
        free[node] += g
    flows = list(link_flows(state))
    if run.placement.num_nodes > 1:
        for link in state.topology.ring_links(run.placement.nodes):
            flows[link] -= 1
    return replace(
        state,
        free_gpus=tuple(free),
        running=tuple(r for r in state.running if r is not run),
        link_flows=tuple(flows),
    )


def _heads(
    state: ClusterState, jobs: Sequence[RunningJob], k: int, slowdown: dict[int, float]
) -> tuple[list[RunningJob], ...]:
    t = state.time

    def attained(r: RunningJob) -> float:
        return r.attained_at(t)

    def remaining(r: RunningJob) -> float:
        return predicted_remaining(r.job, r.attained_at(t)) * r.job.num_gpus

    def slowed(r: RunningJob) -> float:
        return slowdown[r.job.job_id]

    return tuple(heapq.nlargest(k, jobs, key=key) for key in (attained, remaining, slowed))


def running_rows(
    state: ClusterState,
    cfg: MdpConfig,
    model: ContentionModel,
    contention: Contention,
) -> RunningRows:
    """The running slots of ``state`` (``contention``: the state's predictions)."""
    k = cfg.running_slots
    jobs = eligible(state, cfg)
    slowdown = {r.job.job_id: contention.running_slowdown(r) for r in jobs}
    heads = _heads(state, jobs, k, slowdown)
    slots: tuple[RunningJob, ...] = round_robin(heads, k)
    where = [{r.job.job_id: i / k for i, r in enumerate(head)} for head in heads]
    restart = parse_restart(cfg.restart_cost)
    bases: list[ClusterState] = []
    rows: list[tuple[Placement | None, ...]] = []
    reds: list[tuple[bool, ...]] = []
    preds: list[tuple[Prediction | None, ...]] = []
    movable: list[tuple[bool, ...]] = []
    for r in slots if cfg.migrate else ():
        base = without(state, r)
        bases.append(base)
        b = builder_of(base, model, cfg.span_lambda)
        row = tuple(b.placement(g, r.job) for g in cfg.generators)
        red = tuple(p is not None and p in row[:c] for c, p in enumerate(row))
        rows.append(row)
        reds.append(red)
        preds.append(tuple(None if p is None else b.predict(r.job, p) for p in row))
        movable.append(
            tuple(
                p is not None and p != r.placement and not (cfg.mask_duplicates and red[c])
                for c, p in enumerate(row)
            )
        )
    assert len(RUN_ORDERS) == len(heads)
    return RunningRows(
        slots=slots,
        ranks=tuple(tuple(w.get(r.job.job_id, 1.0) for w in where) for r in slots),
        slowdown=tuple(slowdown[r.job.job_id] for r in slots),
        restart_s=tuple(restart_seconds(r.job, restart) for r in slots),
        intensity=tuple(comm_intensity(model, state.topology, r.job) for r in slots),
        bases=tuple(bases),
        placements=tuple(rows),
        redundant=tuple(reds),
        predictions=tuple(preds),
        movable=tuple(movable),
    )
