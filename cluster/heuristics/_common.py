"""Small helpers shared by the heuristic schedulers."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

from linkwise.cluster.domain import (
    ClusterState,
    Decision,
    PendingJob,
    Placement,
    Start,
    Topology,
)
from linkwise.cluster.placement import apply_placement, best_fit, fragment_first_fit, least_busy


def can_ever_run(state: ClusterState, job: PendingJob) -> bool:
    """Whether the job fits the cluster at all (a larger one is ignored, never blocks)."""
    return job.job.num_gpus <= state.topology.total_gpus


def add_jobs(jobs_per_node: list[int], placement: Placement) -> None:
    """Count one more running job on every node of ``placement`` (in place)."""
    for node, _ in placement.alloc:
        jobs_per_node[node] += 1


def min_nodes_for(capacities_desc: Sequence[int], gpus: int) -> int:
    """Fewest nodes of these capacities (sorted descending) that hold ``gpus`` GPUs (>= 1)."""
    need = gpus
    k = 0
    for cap in capacities_desc:
        if need <= 0:
            break
        need -= cap
        k += 1
    return max(k, 1)


def bounded_placement(
    topo: Topology,
    free: Sequence[int],
    busy: Sequence[int],
    gpus: int,
    kappa: int | None = None,
    lam: float = 1.0,
    capacities_desc: Sequence[int] | None = None,
) -> Placement | None:
    """SJF-BCO's placement of one job (Yu et al., MobiHoc'22), None if it must wait.

    A job with ``gpus <= kappa`` (None: the GPUs of the largest node) is placed by
    ``fragment_first_fit`` (FA-FFP), a larger one by ``least_busy`` (LBSGF). ``lam`` bounds
    the servers a job spans to ``ceil(lam * n_min)``, ``n_min`` being the fewest servers of
    the cluster that could hold it: when the rule's placement spans more, the consolidated
    ``best_fit`` placement is tried instead, and when that spans more too there is none (the
    job waits for consolidation); ``lam = inf`` removes the bound. ``capacities_desc``: the
    nodes' GPU counts sorted descending (computed when None)."""
    if kappa is None:
        kappa = topo.max_gpus_per_node
    placement: Placement | None
    if gpus <= kappa:
        placement = fragment_first_fit(topo, free, gpus, busy)
    else:
        placement = least_busy(topo, free, gpus, busy)
    if placement is None or math.isinf(lam):
        return placement
    if capacities_desc is None:
        capacities_desc = sorted((n.gpus for n in topo.nodes), reverse=True)
    bound = math.ceil(lam * min_nodes_for(capacities_desc, gpus) - 1e-9)
    if placement.num_nodes <= bound:
        return placement
    placement = best_fit(topo, free, gpus)
    return placement if placement is not None and placement.num_nodes <= bound else None


def start_bounded(
    state: ClusterState,
    order: Iterable[PendingJob],
    kappa: int | None = None,
    lam: float = 1.0,
    *,
    by_size: bool = False,
) -> Decision:
    """SJF-BCO's placement step over pending jobs in a given order.

    Every job of ``order`` that fits is started (no reservation), in that order, where
    ``bounded_placement`` puts it (a job it finds no placement for waits). ``by_size``:
    ``order`` is by GPU count ascending, so the scan stops at the first job larger than the
    free GPUs. Jobs larger than the cluster are skipped. SJF-BCO, QSSF and the SJF-BCO
    oracle differ only in ``order``.
    """
    topo = state.topology
    free = list(state.free_gpus)
    total = sum(free)
    busy = list(state.jobs_per_node)
    capacities = sorted((n.gpus for n in topo.nodes), reverse=True)
    starts: list[Start] = []
    # free GPUs only shrink within a decision, so a size that cannot be placed within the
    # bound now cannot be later either (best fit spans the fewest nodes possible)
    unplaceable: set[int] = set()
    for p in order:
        gpus = p.job.num_gpus
        if gpus > total:
            if by_size:
                break  # sorted by size: nothing further fits either
            continue
        if gpus in unplaceable or not can_ever_run(state, p):
            continue
        placement = bounded_placement(topo, free, busy, gpus, kappa, lam, capacities)
        if placement is None:
            unplaceable.add(gpus)
            continue
        apply_placement(free, placement)
        add_jobs(busy, placement)
        total -= gpus
        starts.append(Start(p.job.job_id, placement))
    return Decision(starts=tuple(starts))


def check_bco_params(kappa: int | None, lam: float) -> None:
    """SJF-BCO's parameter checks (ValueError): ``kappa >= 0`` or None, ``lam >= 1``."""
    if kappa is not None and kappa < 0:
        raise ValueError(f"kappa must be non-negative, got {kappa}")
    if not lam >= 1.0:
        raise ValueError(f"lam must be at least 1, got {lam}")


class MissingPredictions(ValueError):
    """A policy that orders jobs by predicted run time met a job without a prediction."""
