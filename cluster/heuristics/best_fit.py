"""Greedy queue scan with consolidated best-fit placement (no reservation)."""

from __future__ import annotations

from dataclasses import dataclass

from linkwise.cluster.domain import ClusterState, Decision, Start
from linkwise.cluster.heuristics._common import can_ever_run
from linkwise.cluster.placement import apply_placement, best_fit


@dataclass(frozen=True, slots=True)
class BestFit:
    """Scan the queue in canonical order; start every job that fits, on a best-fit placement.

    Unlike ``fifo`` a job that does not fit does not block the ones behind it (greedy,
    no reservation, so a large job can wait long behind a stream of small ones).
    """

    name: str = "best_fit"

    def decide(self, state: ClusterState) -> Decision:
        """Start, in queue order, every job with a best-fit placement on what is still free."""
        free = list(state.free_gpus)
        total = sum(free)
        starts: list[Start] = []
        for p in state.pending:
            if total == 0:
                break
            gpus = p.job.num_gpus
            if gpus > total or not can_ever_run(state, p):
                continue
            placement = best_fit(state.topology, free, gpus)
            if placement is None:  # pragma: no cover - best fit fails only on the total
                continue
            apply_placement(free, placement)
            total -= gpus
            starts.append(Start(p.job.job_id, placement))
        return Decision(starts=tuple(starts))
