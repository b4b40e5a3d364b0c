"""Adapters between step actions and the ``Policy`` protocol: a heuristic as a per-step
chooser, a function ``(obs, mask) -> action`` as a policy, and the one stepping loop."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from linkwise.cluster.contention import ContentionModel
from linkwise.cluster.domain import ClusterState, Decision, Start
from linkwise.cluster.mdp.apply import apply_decision, local_grace
from linkwise.cluster.mdp.candidates import Candidates, action_mask, candidates, decode
from linkwise.cluster.mdp.config import BoolArray, FloatArray, MdpConfig
from linkwise.cluster.mdp.features import RunningMemo, encode
from linkwise.cluster.mdp.matching import (
    START_KINDS,
    StepMatch,
    match_migrate,
    match_preempt,
    match_start,
)
from linkwise.cluster.mdp.spec import ObsSpec


class StepPolicyAdapter:
    """A heuristic Policy as a per-step action chooser, recording how well it matches.

    At every step the heuristic decides on the current state. With running rows
    (``MdpConfig.running_slots``) its first preemption with an unmasked preempt row becomes
    the action, else its first migration with an unmasked migrate candidate (exact target,
    else the nearest by node overlap); then its first start that maps to a slot (exact
    candidate, else the nearest); no start (or none in a slot) gives wait. Preemptions and
    migrations the action space cannot express at that step (no running rows, or the job's
    row masked: not preemptable, within the minimum run time) are counted as ignored.
    """

    def __init__(self, policy: Any) -> None:
        self.policy = policy
        self.matches: list[StepMatch] = []
        self.ignored_preemptions = 0
        self.ignored_migrations = 0

    @property
    def name(self) -> str:
        return str(self.policy.name)

    def act(self, cands: Candidates) -> int:
        """The action reproducing the heuristic's next move at this state."""
        decision: Decision = self.policy.decide(cands.state)
        moves = [match_preempt(cands, j) for j in decision.preempt]
        migrations = [match_migrate(cands, m) for m in decision.migrate]
        self.ignored_preemptions += sum(1 for m in moves if m is None)
        self.ignored_migrations += sum(1 for m in migrations if m is None)
        for m in (*moves, *migrations):
            if m is not None:
                self.matches.append(m)
                return m.action
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
        starts = [m for m in self.matches if m.kind in START_KINDS]
        if not starts:
            return 1.0
        return sum(1 for m in starts if m.kind == "exact") / len(starts)


@dataclass(frozen=True)
class MdpPolicy:
    """A function ``(obs, mask) -> action`` as a Policy: step until it waits (or nothing but
    wait is allowed), each move applied to a local copy of the state before the next
    observation."""

    act: Callable[[FloatArray, BoolArray], int]
    spec: ObsSpec
    model: ContentionModel
    name: str = "mdp"

    def decide(self, state: ClusterState) -> Decision:
        """All moves the function chooses at this decision point."""
        return decide_by_steps(state, self.act, self.spec, self.model)


def nothing_fits(state: ClusterState, cfg: MdpConfig) -> bool:
    """Whether every action but wait is masked at ``state`` without building its candidates:
    no running rows and no pending job asks at most the free GPUs (a start row is unmasked
    only for a slot whose job fits them, ``candidates``)."""
    if cfg.running_slots:
        return False
    free = state.total_free_gpus
    return not any(p.job.num_gpus <= free for p in state.pending)


def decide_by_steps(
    state: ClusterState,
    act: Callable[[FloatArray, BoolArray], int],
    spec: ObsSpec,
    model: ContentionModel,
) -> Decision:
    """The moves ``act`` chooses at one decision point: observe, act, apply the move to a
    local copy of the state, until it waits or only wait is allowed (the one stepping loop of
    every step policy). Starts, preemptions and migrations are gathered into one Decision
    (the simulator applies preemptions, then migrations, then starts)."""
    cfg = spec.config
    starts: list[Start] = []
    preempt: list[int] = []
    migrate: list[Start] = []
    s = state
    wait = cfg.wait_action
    grace = local_grace(cfg)
    memo: RunningMemo = {}  # the running jobs' feature terms, for this decision point
    while True:
        if nothing_fits(s, cfg):
            break  # every start row would be masked: skip building the candidates
        c = candidates(s, cfg, model)
        if not c.mask[:wait].any():
            break
        a = int(act(encode(c, spec, memo), action_mask(c)))
        if a == wait:
            break
        d = decode(c, a)  # InvalidAction if masked
        starts += d.starts
        preempt += d.preempt
        migrate += d.migrate
        s = apply_decision(s, d, model, grace)
    return Decision(starts=tuple(starts), preempt=tuple(preempt), migrate=tuple(migrate))
