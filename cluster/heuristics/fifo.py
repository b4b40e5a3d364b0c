"""Strict FIFO with Slurm cons_tres-like first-fit placement, no backfill."""

from __future__ import annotations

from dataclasses import dataclass

from linkwise.cluster.domain import ClusterState, Decision, Start
from linkwise.cluster.heuristics._common import can_ever_run
from linkwise.cluster.placement import apply_placement, first_fit


@dataclass(frozen=True, slots=True)
class Fifo:
    """Start jobs in canonical queue order (first fit) until one does not fit, then wait.

    Jobs larger than the whole cluster are skipped rather than blocking the queue forever.
    """

    name: str = "fifo"

    def decide(self, state: ClusterState) -> Decision:
        """Start the longest prefix of the queue that fits now."""
        free = list(state.free_gpus)
        total = sum(free)
        starts: list[Start] = []
        for p in state.pending:
            if not can_ever_run(state, p):
                continue
            gpus = p.job.num_gpus
            if gpus > total:
                break
            placement = first_fit(state.topology, free, gpus)
            if placement is None:  # pragma: no cover - first fit fails only on the total
                break
            apply_placement(free, placement)
            total -= gpus
            starts.append(Start(p.job.job_id, placement))
        return Decision(starts=tuple(starts))
