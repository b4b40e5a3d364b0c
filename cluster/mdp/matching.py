"""Log matching: the actions that reproduce a recorded decision."""

from __future__ import annotations

from dataclasses import dataclass

from linkwise.cluster.contention import ContentionModel
from linkwise.cluster.domain import ClusterState, Decision, Placement, Start
from linkwise.cluster.mdp.apply import apply_start
from linkwise.cluster.mdp.candidates import Candidates, candidates
from linkwise.cluster.mdp.spec import ObsSpec


@dataclass(frozen=True, slots=True)
class StepMatch:
    """How an action reproduces a start: ``kind`` is "exact" (the candidate is the start's
    placement), "nearest" (most GPUs on the same nodes), "unslotted" (the job is in no slot or
    has no candidate: wait is emitted) or "wait" (the decision starts nothing more)."""

    action: int
    job_id: int | None
    kind: str
    overlap: float  # share of the job's GPUs the candidate puts on the start's nodes


def _overlap(a: Placement, b: Placement) -> float:
    mine = dict(a.alloc)
    return sum(min(g, mine.get(n, 0)) for n, g in b.alloc) / max(1, b.num_gpus)


def match_start(cands: Candidates, start: Start) -> StepMatch | None:
    """The unmasked action closest to ``start`` (None if its job has no unmasked candidate)."""
    n_c = cands.config.n_candidates
    for k, pj in enumerate(cands.slots):
        if pj.job.job_id != start.job_id:
            continue
        best: StepMatch | None = None
        for c, p in enumerate(cands.placements[k]):
            a = k * n_c + c
            if p is None or not cands.mask[a]:
                continue
            if p == start.placement:
                return StepMatch(a, start.job_id, "exact", 1.0)
            ov = _overlap(p, start.placement)
            if best is None or ov > best.overlap:
                best = StepMatch(a, start.job_id, "nearest", ov)
        return best
    return None


def decision_steps(
    state: ClusterState, decision: Decision, spec: ObsSpec, model: ContentionModel
) -> list[tuple[Candidates, StepMatch]]:
    """The steps that reproduce a decision (e.g. a real one from the logs): each start in
    order, matched to its closest action, then wait. The state follows the real placements."""
    cfg = spec.config
    out: list[tuple[Candidates, StepMatch]] = []
    s = state
    for start in decision.starts:
        c = candidates(s, cfg, model)
        m = match_start(c, start) or StepMatch(cfg.wait_action, start.job_id, "unslotted", 0.0)
        out.append((c, m))
        s = apply_start(s, start, model)
    out.append((candidates(s, cfg, model), StepMatch(cfg.wait_action, None, "wait", 1.0)))
    return out
