"""Every decision point's state of a simulation, for the tests that compare a fast rule with
the rule it replaces at each of them (as ``linkwise.tests._states``)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from linkwise.cluster.domain import ClusterState, Decision, Job, Topology
from linkwise.cluster.simulator import SimConfig, simulate


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
