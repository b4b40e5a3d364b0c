"""Greedy queue scan with consolidated best-fit placement (no reservation)."""

from __future__ import annotations

from dataclasses import dataclass, field

from linkwise.cluster.compose import Composed, compose
from linkwise.cluster.domain import ClusterState, Decision


@dataclass(frozen=True, slots=True)
class BestFit:
    """Scan the queue in canonical order; start every job that fits, on a best-fit placement.

    Unlike ``fifo`` a job that does not fit does not block the ones behind it (greedy,
    no reservation, so a large job can wait long behind a stream of small ones). The
    composition ``order=submit, placement=best_fit`` (greedy admission).
    """

    name: str = "best_fit"
    _policy: Composed = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_policy", compose(self.composition, name=self.name))

    @property
    def composition(self) -> str:
        """The ``compose:`` spec this heuristic is."""
        return "compose:order=submit,placement=best_fit"

    def decide(self, state: ClusterState) -> Decision:
        """Start, in queue order, every job with a best-fit placement on what is still free."""
        return self._policy.decide(state)
