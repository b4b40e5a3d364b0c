"""SJF-BCO: Smallest Job First with Balanced Contention and Overhead (Yu et al., MobiHoc'22)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from linkwise.cluster.domain import ClusterState, Decision, Placement, Start
from linkwise.cluster.heuristics._common import add_jobs, can_ever_run, min_nodes_for
from linkwise.cluster.placement import apply_placement, best_fit, fragment_first_fit, least_busy


@dataclass(frozen=True, slots=True)
class SjfBco:
    """Smallest job first; small jobs packed onto busy servers, large ones on least-busy servers.

    Pending jobs are taken by GPU count ascending (ties: submit time, job id) and every
    job that fits is started (no reservation). A job with ``gpus <= kappa`` (default: the
    GPUs of the largest node) is placed by ``fragment_first_fit`` (FA-FFP), a larger one by
    ``least_busy`` (LBSGF), which spreads large rings over the servers with the fewest
    jobs, balancing contention.

    ``lam`` (the paper's lambda, >= 1) bounds the other side of that balance, the overhead
    term ``gamma_j = xi2 * servers spanned``: a job may span at most ``ceil(lam * n_min)``
    servers, ``n_min`` being the fewest servers of the cluster that could hold it at all.
    When the rule's placement spans more, the consolidated ``best_fit`` placement is tried
    instead; when that spans more too, the job waits. With the default ``lam = 1`` a job
    that fits in one server is never split and a large one only starts on a fully
    consolidated placement; ``lam = inf`` removes the bound (the plain rules).
    """

    name: str = "sjf_bco"
    kappa: int | None = None
    lam: float = 1.0

    def __post_init__(self) -> None:
        if self.kappa is not None and self.kappa < 0:
            raise ValueError(f"kappa must be non-negative, got {self.kappa}")
        if not self.lam >= 1.0:
            raise ValueError(f"lam must be at least 1, got {self.lam}")

    def decide(self, state: ClusterState) -> Decision:
        """Start every job that fits, smallest first, with SJF-BCO's placement rules."""
        topo = state.topology
        kappa = topo.max_gpus_per_node if self.kappa is None else self.kappa
        free = list(state.free_gpus)
        total = sum(free)
        busy = list(state.jobs_per_node)
        capacities = sorted((n.gpus for n in topo.nodes), reverse=True)
        order = sorted(
            (p for p in state.pending if can_ever_run(state, p)),
            key=lambda p: (p.job.num_gpus, p.job.submit_time, p.job.job_id),
        )
        starts: list[Start] = []
        # free GPUs only shrink within a decision, so a size that cannot be placed within
        # the bound now cannot be later either (best fit spans the fewest nodes possible)
        unplaceable = 0
        for p in order:
            gpus = p.job.num_gpus
            if gpus > total:
                break  # sorted by size: nothing further fits either
            if gpus == unplaceable:
                continue
            placement: Placement | None
            if gpus <= kappa:
                placement = fragment_first_fit(topo, free, gpus, busy)
            else:
                placement = least_busy(topo, free, gpus, busy)
            if placement is not None and not math.isinf(self.lam):
                bound = math.ceil(self.lam * min_nodes_for(capacities, gpus) - 1e-9)
                if placement.num_nodes > bound:
                    placement = best_fit(topo, free, gpus)
                    if placement is not None and placement.num_nodes > bound:
                        placement = None
            if placement is None:
                unplaceable = gpus
                continue
            apply_placement(free, placement)
            add_jobs(busy, placement)
            total -= gpus
            starts.append(Start(p.job.job_id, placement))
        return Decision(starts=tuple(starts))
