"""What the tests that compare a fast rule with the rule it replaces record at every decision
point of a simulation: the states, or a residual's fast and plain decisions side by side
(as ``linkwise.tests._states``)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from linkwise.cluster.domain import ClusterState, Decision, Job, Topology
from linkwise.cluster.mdp import nothing_fits
from linkwise.cluster.simulator.config import SimConfig
from linkwise.cluster.simulator.run import simulate
from linkwise.models.residual import ResidualPolicy


@dataclass
class _Recording:
    """``policy`` deciding, every state it sees kept in order."""

    policy: Any
    name: str = "record"
    states: list[ClusterState] = field(default_factory=list)

    def decide(self, state: ClusterState) -> Decision:
        self.states.append(state)
        decision: Decision = self.policy.decide(state)
        return decision


def decision_states(
    topology: Topology, jobs: Sequence[Job], model: Any, policy: Any
) -> list[ClusterState]:
    """The state at every decision point of ``policy`` simulated on ``jobs``."""
    recording = _Recording(policy)
    simulate(topology, list(jobs), model, recording, SimConfig())
    return recording.states


@dataclass
class Both:
    """Decides every decision point by the fast and the plain path and records both (and the
    points where nothing but waiting fits)."""

    fast: ResidualPolicy
    plain: ResidualPolicy
    name: str = "both"
    pairs: list[tuple[Decision, Decision]] = field(default_factory=list)
    skipped: int = 0

    def decide(self, state: ClusterState) -> Decision:
        reference = self.plain.decide_plain(state)
        d = self.fast.decide(state)
        self.skipped += nothing_fits(state, self.fast.obs_spec.config)
        self.pairs.append((d, reference))
        return d
