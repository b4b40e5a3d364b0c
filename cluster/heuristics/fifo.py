"""Strict FIFO with Slurm cons_tres-like first-fit placement, no backfill."""

from __future__ import annotations

from dataclasses import dataclass, field

from linkwise.cluster.compose import Composed, compose
from linkwise.cluster.domain import ClusterState, Decision


@dataclass(frozen=True, slots=True)
class Fifo:
    """Start jobs in canonical queue order (first fit) until one does not fit, then wait.

    Jobs larger than the whole cluster are skipped rather than blocking the queue forever.
    The composition ``order=submit, placement=first_fit, admission=strict``.
    """

    name: str = "fifo"
    _policy: Composed = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_policy", compose(self.composition, name=self.name))

    @property
    def composition(self) -> str:
        """The ``compose:`` spec this heuristic is."""
        return "compose:order=submit,placement=first_fit,admission=strict"

    def decide(self, state: ClusterState) -> Decision:
        """Start the longest prefix of the queue that fits now."""
        return self._policy.decide(state)
