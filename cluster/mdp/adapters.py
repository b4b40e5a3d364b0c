"""Adapters between step actions and the ``Policy`` protocol: a heuristic as a per-step
chooser, a function ``(obs, mask) -> action`` as a policy, and the one stepping loop."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from linkwise.cluster.contention import ContentionModel
from linkwise.cluster.domain import ClusterState, Decision, Start
from linkwise.cluster.mdp.apply import apply_start
from linkwise.cluster.mdp.candidates import Candidates, action_mask, candidates, decode
from linkwise.cluster.mdp.config import BoolArray, FloatArray
from linkwise.cluster.mdp.features import encode
from linkwise.cluster.mdp.matching import StepMatch, match_start
from linkwise.cluster.mdp.spec import ObsSpec


class StepPolicyAdapter:
    """A heuristic Policy as a per-step action chooser, recording how well it matches.

    At every step the heuristic decides on the current state; its first start that maps to a
    slot becomes the action (exact candidate, else the nearest by node overlap); no start (or
    none in a slot) gives wait. Preemptions cannot be expressed and are counted as ignored.
    """

    def __init__(self, policy: Any) -> None:
        self.policy = policy
        self.matches: list[StepMatch] = []
        self.ignored_preemptions = 0

    @property
    def name(self) -> str:
        return str(self.policy.name)

    def act(self, cands: Candidates) -> int:
        """The action reproducing the heuristic's next start at this state."""
        decision: Decision = self.policy.decide(cands.state)
        self.ignored_preemptions += len(decision.preempt)
        for start in decision.starts:
            m = match_start(cands, start)
            if m is not None:
                self.matches.append(m)
                return m.action
        wait = cands.config.wait_action
        if decision.starts:
            self.matches.append(StepMatch(wait, decision.starts[0].job_id, "unslotted", 0.0))
        else:
            self.matches.append(StepMatch(wait, None, "wait", 1.0))
        return wait

    @property
    def match_rate(self) -> float:
        """Share of the heuristic's starts reproduced exactly (1.0 when it started nothing)."""
        starts = [m for m in self.matches if m.kind != "wait"]
        if not starts:
            return 1.0
        return sum(1 for m in starts if m.kind == "exact") / len(starts)


@dataclass(frozen=True)
class MdpPolicy:
    """A function ``(obs, mask) -> action`` as a Policy: step until it waits (or nothing can
    start), each start applied to a local copy of the state before the next observation."""

    act: Callable[[FloatArray, BoolArray], int]
    spec: ObsSpec
    model: ContentionModel
    name: str = "mdp"

    def decide(self, state: ClusterState) -> Decision:
        """All starts the function chooses at this decision point."""
        return decide_by_steps(state, self.act, self.spec, self.model)


def decide_by_steps(
    state: ClusterState,
    act: Callable[[FloatArray, BoolArray], int],
    spec: ObsSpec,
    model: ContentionModel,
) -> Decision:
    """The starts ``act`` chooses at one decision point: observe, act, apply the start to a
    local copy of the state, until it waits or nothing can start (the one stepping loop of
    every step policy)."""
    starts: list[Start] = []
    s = state
    wait = spec.config.wait_action
    while True:
        c = candidates(s, spec.config, model)
        if not c.mask[:wait].any():
            break
        a = int(act(encode(c, spec), action_mask(c)))
        if a == wait:
            break
        start = decode(c, a).starts[0]  # InvalidAction if masked
        starts.append(start)
        s = apply_start(s, start, model)
    return Decision(starts=tuple(starts))
